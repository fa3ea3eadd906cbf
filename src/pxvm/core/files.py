"""Input files: only regular files are read, since a FIFO or a device given as an input
would block the open (or the read) forever, or never end."""

from __future__ import annotations

import os
import stat

from .errors import PxvmError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def check_regular_file(path, what: str, error: type[PxvmError] = PxvmError) -> None:
    """Raise `error` naming what `path` is unless it is a regular file (or a link to one);
    a missing or unreadable path is left to the open that follows, which names it."""
    try:
        mode = os.stat(path).st_mode  # stat never opens, so never blocks on a FIFO
    except OSError:
        return
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    raise error(f"{os.fspath(path)} is {kind}, not a regular file; pass a {what} file "
                "(pxvm reads inputs only from regular files)")
