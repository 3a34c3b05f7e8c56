"""Where transferred blocks live: a `KVStore` maps a key (layout namespace + block digest) to a block's bytes.

Two transports:
- `InProcessStore`: a dict shared by engines of one process (tests; a prefill engine handing blocks to a decode
  engine in the same process);
- `DirectoryStore`: one file per block in a directory (the disk tier, `PagedConfig.kv_offload_dir`), bounded by
  bytes, least recently used files deleted first, atomic writes (a temporary file of this writer's own renamed into
  place), and read back after a restart: the files found at start are ordered by their modification times, which
  reads refresh. One process per directory (`dir_lock.py`: a `flock` on its `.lock` file); a directory removed
  while open is made again at the next save; failures are counted and the first of each kind logged
  (`failure_log.py`).

A store knows nothing of layouts or tensors; it moves bytes. Checking what it returns is the connector's business
(`block_format.decode_block`); a blob that fails the check is `delete`d.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Protocol, runtime_checkable

from hf_paged.errors import InvalidConfigError, KVDirectoryInUseError
from hf_paged.kv_transfer import dir_lock
from hf_paged.kv_transfer.failure_log import FailureLog

__all__ = ["DirectoryStore", "InProcessStore", "KVStore", "expand_path"]


@runtime_checkable
class KVStore(Protocol):
    """Bytes by key, bounded or not; every method is thread-safe."""

    name: str  # "in-process", "directory": how stats and benchmarks name the transport
    background_reads: bool  # reads are slow enough (files, network) that the connector runs them in a worker thread

    def contains(self, key: bytes) -> bool: ...

    def get(self, key: bytes) -> bytes | None:
        """The blob under `key`, or None when it is not there (any more)."""
        ...

    def put(self, key: bytes, data: bytes) -> bool:
        """Keep `data` under `key` (a no-op, refreshing it, when the key is there); False when it cannot be kept."""
        ...

    def delete(self, key: bytes) -> None: ...

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        ...


class _LruBytes:
    """Keys in least-recently-used order with their sizes, bounded by total bytes (both stores' bookkeeping)."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.sizes: OrderedDict[bytes, int] = OrderedDict()
        self.nbytes = 0

    def add(self, key: bytes, size: int) -> None:
        self.sizes[key] = size
        self.nbytes += size

    def pop(self, key: bytes) -> None:
        self.nbytes -= self.sizes.pop(key, 0)

    def victims(self, incoming: int) -> list[bytes]:
        """Oldest keys to drop so that `incoming` more bytes fit."""
        out, total = [], self.nbytes
        if self.max_bytes is None:
            return out
        for key, size in self.sizes.items():
            if total + incoming <= self.max_bytes:
                break
            out.append(key)
            total -= size
        return out


class InProcessStore:
    """Blocks in a dict, shared by the engines it is given to (one process). Optional byte bound, LRU.

    Example:
        >>> store = InProcessStore()
        >>> store.put(b"k", b"blob"), store.get(b"k"), store.nbytes
        (True, b'blob', 4)
    """

    name = "in-process"
    background_reads = False  # memory copies: read inside the admission

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise ValueError(f"InProcessStore max_bytes must be an int >= 1 (bytes, e.g. 1 << 30 for 1 GiB) or None "
                             f"(no bound), got {max_bytes!r}")
        self._blobs: dict[bytes, bytes] = {}
        self._lru = _LruBytes(max_bytes)
        self._lock = threading.Lock()

    def contains(self, key: bytes) -> bool:
        return key in self._blobs

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            blob = self._blobs.get(key)
            if blob is not None:
                self._lru.sizes.move_to_end(key)
            return blob

    def put(self, key: bytes, data: bytes) -> bool:
        with self._lock:
            if key in self._blobs:
                self._lru.sizes.move_to_end(key)
                return True
            if self._lru.max_bytes is not None and len(data) > self._lru.max_bytes:
                return False
            for old in self._lru.victims(len(data)):
                self._blobs.pop(old, None)
                self._lru.pop(old)
            self._blobs[key] = bytes(data)
            self._lru.add(key, len(data))
            return True

    def delete(self, key: bytes) -> None:
        with self._lock:
            if self._blobs.pop(key, None) is not None:
                self._lru.pop(key)

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes


class DirectoryStore:
    """One file per block (`<key hex>.kvb`) in `path`, at most `max_bytes` in all, least recently used first out.

    Files are written to a temporary name of this writer's own (`<file>.<pid>-<n>.tmp`) and renamed, so a reader
    never sees half a file (a crash leaves at most a `.tmp` file, removed when a process next opens the directory).
    A file that vanished or cannot be read is forgotten. One engine process per directory: the store holds the
    directory's lock (`dir_lock.py`) until `close()` (or until it is collected, or the process ends); another
    process opening it gets `KVDirectoryInUseError`. Stores of one process may share it (each counts the files it
    found at start and those it wrote). `~` and `$VARS` in `path` are expanded. A directory removed while open is
    made again (empty) at the next save; save and read failures are counted (`failures.counts`) and the first of
    each kind is logged.
    """

    name = "directory"
    background_reads = True
    SUFFIX = ".kvb"

    def __init__(self, path: str | os.PathLike, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"DirectoryStore max_bytes must be an int >= 1, got {max_bytes!r}")
        self.path = Path(expand_path(path))
        self._make_directory(str(path))
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise InvalidConfigError(f"the KV directory {str(path)!r} (kv_offload_dir) is not writable by this "
                                     "process; give one it may write")
        first = dir_lock.lock(self.path)  # (raises KVDirectoryInUseError: another process holds it)
        self._unlock = weakref.finalize(self, dir_lock.unlock, os.path.realpath(self.path))
        self.failures = FailureLog(f"KV directory {str(self.path)!r}")
        self._lru = _LruBytes(max_bytes)
        self._lock = threading.Lock()
        self._lost = False  # the directory was made again and another process took its lock: saves stop
        found = []
        for entry in os.scandir(self.path):
            if entry.name.endswith(".tmp"):
                if first:  # no store of this process writes here yet, and no other process may
                    _unlink(entry.path)
            elif entry.name.endswith(self.SUFFIX) and entry.is_file():
                try:
                    key = bytes.fromhex(entry.name[: -len(self.SUFFIX)])
                except ValueError:
                    continue  # not one of ours: left alone, not counted
                stat = entry.stat()
                found.append((stat.st_mtime_ns, key, stat.st_size))
        for _, key, size in sorted(found):
            self._lru.add(key, size)
        for old in self._lru.victims(0):  # the bound may have shrunk since the files were written
            self._remove(old)

    def _make_directory(self, given: str) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            link = _dangling_link(self.path)
            if link is not None:
                raise InvalidConfigError(
                    f"the KV directory {given!r} (kv_offload_dir) is{'' if link == self.path else ' under'} a "
                    f"dangling link: {str(link)!r} points to {os.readlink(link)!r}, which does not exist; make that "
                    "directory or give another path") from None
            raise InvalidConfigError(f"the KV directory {given!r} (kv_offload_dir) is a file, or under one; give "
                                     "a directory path") from None
        except PermissionError:
            raise InvalidConfigError(f"cannot create the KV directory {given!r} (kv_offload_dir): permission "
                                     "denied; give a directory this process may write") from None
        except OSError as exc:  # a read-only filesystem, /proc, a missing device...
            raise InvalidConfigError(f"cannot create the KV directory {given!r} (kv_offload_dir): "
                                     f"{exc.strerror or exc}; give a directory this process may write") from None

    def close(self) -> None:
        """Let go of the directory's lock (the last store of this process on it releases it). Idempotent; the
        store must not be used after."""
        self._unlock()

    def _file(self, key: bytes) -> Path:
        return self.path / f"{key.hex()}{self.SUFFIX}"

    def contains(self, key: bytes) -> bool:
        return key in self._lru.sizes

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            if key not in self._lru.sizes:
                return None
            self._lru.sizes.move_to_end(key)
        file = self._file(key)
        try:
            data = file.read_bytes()
        except OSError as exc:
            self.failures.record("load", exc)
            with self._lock:
                if not self.path.is_dir():  # removed under us: every file it held is gone
                    self._lru = _LruBytes(self._lru.max_bytes)
                else:
                    self._remove(key)
            return None
        try:
            os.utime(file)  # recency survives a restart
        except OSError:  # (a file we may read but not touch: its bytes are good, only its age is older)
            pass
        return data

    def put(self, key: bytes, data: bytes) -> bool:
        with self._lock:
            if key in self._lru.sizes:
                self._lru.sizes.move_to_end(key)
                return True
            if len(data) > self._lru.max_bytes:  # type: ignore[operator]
                self.failures.record("save", f"a file of {len(data):,} bytes is over the bound of "
                                             f"{self._lru.max_bytes:,} (kv_offload_bytes)")
                return False
            if self._lost:
                return False
            for old in self._lru.victims(len(data)):
                self._remove(old)
            if not self._write(key, data) and not (self._remade() and self._write(key, data)):
                return False
            self._lru.add(key, len(data))
            return True

    def _write(self, key: bytes, data: bytes) -> bool:
        file = self._file(key)
        tmp = file.with_name(f"{file.name}.{os.getpid()}-{next(_TMP_IDS)}.tmp")  # no other writer's name
        try:
            tmp.write_bytes(data)
            os.replace(tmp, file)
        except OSError as exc:
            _unlink(tmp)
            if self.path.is_dir():  # (a removed directory is made again, then counted if that fails too)
                self.failures.record("save", exc)
            return False
        return True

    def _remade(self) -> bool:
        """After a failed write: when the directory is gone, forget its files, make it again and take its new lock
        (True: write again)."""
        if self.path.is_dir():
            return False
        self._lru = _LruBytes(self._lru.max_bytes)  # every file it held went with it
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            dir_lock.relock(self.path)
        except KVDirectoryInUseError as exc:  # another process made it and took it meanwhile: it is theirs now
            self._lost = True
            self.failures.record("save", exc)
            return False
        except OSError as exc:  # replaced by a file, a read-only parent...
            self.failures.record("save", f"the directory was removed and cannot be made again: {exc}")
            return False
        return True

    def delete(self, key: bytes) -> None:
        with self._lock:
            self._remove(key)

    def _remove(self, key: bytes) -> None:
        self._lru.pop(key)
        _unlink(self._file(key))

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes

    @property
    def max_bytes(self) -> int:
        return self._lru.max_bytes  # type: ignore[return-value]


_TMP_IDS = itertools.count()


def expand_path(path: str | os.PathLike) -> str:
    """`~` and `$VARS` expanded, as a shell would for an unquoted path (`kv_offload_dir`)."""
    return os.path.expandvars(os.path.expanduser(os.fspath(path)))


def _dangling_link(path: Path) -> Path | None:
    """`path` or the nearest of its folders that exists as a name, when that name is a link to nothing."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path if path.is_symlink() and not path.exists() else None


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
