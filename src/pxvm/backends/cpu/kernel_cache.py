"""Numba's disk cache of the CPU kernels, checked before it is trusted.

Numba keeps a kernel's compiled forms in an index (<kernel>.nbi) and one data file per
signature (<kernel>.<n>.nbc) holding its machine code and LLVM bitcode, in __pycache__
next to the source or under NUMBA_CACHE_DIR. A damaged data file is not noticed by
numba: its pickle may fail (an exception), or load and hand damaged code to LLVM, which
aborts the process, or to the CPU, which crashes it. Either way every later run fails
the same way.

So each data file numba writes gets a sidecar <file>.sha256 with its hash, and a data
file is loaded only if it still has that hash. A file that does not (or that has no
sidecar: numba wrote it without pxvm), and any other failure to load a kernel's cache,
removes that kernel's cache files, says so once on stderr, and numba compiles the
kernel again and writes a good cache.
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import os
import sys
import threading
from types import ModuleType

from numba.core.caching import FunctionCache, IndexDataCacheFile
from numba.core.dispatcher import Dispatcher

_CHECKSUM = ".sha256"


class CacheEntryMismatch(Exception):
    """A data file's bytes are not those pxvm recorded when numba wrote it."""


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class _CheckedCacheFile(IndexDataCacheFile):
    """Numba's index and data files, with a checksum beside each data file."""

    def _load_data(self, name):
        path = self._data_path(name)
        actual = _digest(path)  # a missing file raises OSError here: numba's plain miss
        try:
            with open(path + _CHECKSUM, encoding="ascii") as f:
                recorded = f.read().strip()
        except OSError:
            raise CacheEntryMismatch(f"{name} has no {_CHECKSUM} checksum") from None
        if actual != recorded:
            raise CacheEntryMismatch(f"{name} does not match its checksum")
        return super()._load_data(name)

    def _save_data(self, name, data):
        super()._save_data(name, data)
        path = self._data_path(name)
        with self._open_for_write(path + _CHECKSUM) as f:
            f.write(_digest(path).encode("ascii"))


class _CheckedCache(FunctionCache):
    """A kernel's cache whose load failures remove its files, so that numba compiles."""

    def __init__(self, py_func):
        super().__init__(py_func)
        self._cache_file = _CheckedCacheFile(self._cache_path, self._impl.filename_base,
                                             self._impl.locator.get_source_stamp())

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except Exception as err:  # any failure to load: compiling anew is always right
            self._remove_files()
            reason = (str(err).splitlines() or [type(err).__name__])[0]  # LLVM's run on
            named = isinstance(err, CacheEntryMismatch)  # its message names the file
            _notice(self._cache_path, reason if named else f"{self._impl.filename_base}: {reason}")
            return None

    def _remove_files(self):
        base = os.path.join(self._cache_path, glob.escape(self._impl.filename_base))
        for path in glob.glob(base + ".nbi") + glob.glob(base + ".*.nbc*"):
            try:
                os.remove(path)
            except OSError:
                pass  # numba overwrites it when it saves the new compile


_noticed: set[str] = set()
_lock = threading.Lock()


def _notice(cache_dir: str, reason: str) -> None:
    """One line on stderr per cache directory and process."""
    with _lock:
        if cache_dir in _noticed:
            return
        _noticed.add(cache_dir)
    print(f"pxvm: rebuilding the CPU kernels' cache in {cache_dir} ({reason}); "
          f"compiling takes a while", file=sys.stderr)


_checked_modules: set[str] = set()


def import_kernels(name: str) -> ModuleType:
    """Kernel module `name`, imported, its cached kernels and those of the kernel modules
    it imported given checked caches (before their first call, when numba loads them)."""
    module = importlib.import_module(name)
    if name not in _checked_modules:
        package = name.rpartition(".")[0] + "."
        with _lock:
            for other, imported in list(sys.modules.items()):
                if other.startswith(package) and other not in _checked_modules:
                    _checked_modules.add(other)
                    _check_module(imported)
    return module


def _check_module(module: ModuleType) -> None:
    for value in vars(module).values():
        if isinstance(value, Dispatcher) and type(value._cache) is FunctionCache:
            value._cache = _CheckedCache(value.py_func)
