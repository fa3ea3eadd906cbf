"""Output paths checked before the work that fills them: a benchmark or tuning run that
takes minutes must not find only at the end that it cannot write its result."""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import PxvmError


def check_output_file(path: Path | None, option: str) -> None:
    """PxvmError (one line, exit 1) unless `path` (from `option`) can be written: not a
    folder, in a folder that exists and takes new files, itself writable if it exists."""
    if path is None:
        return
    if path.is_dir():
        raise PxvmError(f"{option} {path} is a folder; name a file (e.g. {path / 'out.json'})")
    folder = path.parent
    if not folder.is_dir():
        raise PxvmError(f"{option} {path}: the folder {folder} does not exist; create it "
                        "or name a file in a folder that does")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists()
                                                    and not os.access(path, os.W_OK)):
        raise PxvmError(f"{option} {path}: no permission to write it; name a file in a "
                        "folder you can write to")


def check_output_folder(folder: Path, what: str) -> None:
    """PxvmError unless `folder` (where `what` goes) exists or can be made, and takes files."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PxvmError(f"cannot create {folder} for {what}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PxvmError(f"cannot write {what} to {folder}: no permission")
