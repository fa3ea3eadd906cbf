"""Which images of a pixel container have had their bytes checked against the SHA-256 in
their headers, known by each file's status (device, inode, size, modification and
change times), so a container loaded again is not hashed again while its images are
unchanged: the way git's index and ccache know unchanged files without reading them.
Any write to an image changes its change time (which no user can set back), so a
changed image is hashed again.

The record of a container is a small JSON file in the user's cache
(`pxvm.core.tuning.cache_root()/pixels`); a record that cannot be read or written only
means hashing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from ..core.tuning import cache_root

#: A record larger than this is not read (a container's record holds a few lines an image).
MAX_RECORD_BYTES = 1 << 22
VERSION = 1


def signature(status: os.stat_result) -> list[int]:
    """What tells a file's bytes unchanged since `status` was taken."""
    return [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns,
            status.st_ctime_ns]


class CheckedImages:
    """The record of one container's checked images: image name -> its signature when its
    part's SHA-256 was last found right."""

    def __init__(self, folder: Path, file_sha256: str):
        key = hashlib.sha256(f"{Path(folder).resolve()}\0{file_sha256}".encode()).hexdigest()
        self.path = cache_root() / "pixels" / f"{key[:32]}.json"
        self._lock = threading.Lock()
        self._known = self._read()
        self._added: dict[str, list[int]] = {}

    def _read(self) -> dict[str, list[int]]:
        try:
            if self.path.stat().st_size > MAX_RECORD_BYTES:
                return {}
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(record, dict) or record.get("version") != VERSION:
            return {}
        images = record.get("images")
        return images if isinstance(images, dict) else {}

    def all_unchanged(self, images: dict[str, list[int]]) -> bool:
        """Whether every image (name -> signature now) was checked and is unchanged."""
        return bool(images) and all(self._known.get(name) == sig for name, sig in images.items())

    def add(self, images: dict[str, list[int]]) -> None:
        """Record images whose part was just found right."""
        with self._lock:
            self._added.update(images)

    def save(self) -> None:
        """Write the record with what was added (nothing to write: no file touched)."""
        if not self._added:
            return
        images = {**self._known, **self._added}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.partial")
            partial.write_text(json.dumps({"version": VERSION, "images": images}))
            partial.replace(self.path)  # readers never see half a record
        except OSError:
            pass  # a cache: the next load hashes again
