"""The on-disk tier of `IndexCache`: a directory of `*.index` files (a regex's byte automaton, pickled with what it
stands for), trimmed to a byte budget, least recently used (by modification time: a load touches its file) first."""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

__all__ = ["read_automaton", "trim_dir", "write_automaton"]


def read_automaton(path: str, regex: str, fingerprint: str) -> tuple[Any, Any, Any] | None:
    """The (transitions, initial, finals) saved at `path` for `regex` under the vocabulary `fingerprint`; None when
    there is no file, or it is truncated, foreign, or saved for another regex (the file name is a digest: what it
    stands for is checked before it is trusted). A load touches the file: used now, the last to go in a trim."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as handle:
            saved = pickle.load(handle)
        if saved.get("regex") != regex or saved.get("fingerprint") != fingerprint:
            return None
        arrays = saved["transitions"], saved["initial"], saved["finals"]
    except Exception:  # noqa: BLE001 -- a truncated or foreign file: rebuild (and overwrite it)
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return arrays


def write_automaton(directory: str, path: str, regex: str, fingerprint: str, transitions: Any, initial: Any,
                    finals: Any) -> None:
    """Save an automaton at `path` in `directory`: written then renamed, so a concurrent reader never sees half a
    file."""
    os.makedirs(directory, exist_ok=True)
    payload = {"regex": regex, "fingerprint": fingerprint, "transitions": transitions, "initial": initial,
               "finals": finals}
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        pickle.dump(payload, handle, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def trim_dir(directory: str, limit: int, keep: str | None = None) -> int:
    """Delete the least recently used `*.index` files of `directory` (by modification time: a load touches its
    file) until their bytes are at most `limit` (0: count only); never `keep`. Returns the bytes left."""
    files = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(".index"):
                try:
                    stat = entry.stat()
                except OSError:  # (deleted by another process meanwhile)
                    continue
                files.append((stat.st_mtime, stat.st_size, entry.path))
    total = sum(size for _, size, _ in files)
    if limit <= 0:
        return total
    for _, size, path in sorted(files):
        if total <= limit:
            break
        if path == keep:
            continue
        try:
            os.remove(path)
        except OSError:
            continue
        total -= size
    return total
