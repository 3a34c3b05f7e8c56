"""The on-disk tier of `IndexCache`: a directory of `*.index` files, trimmed to a byte budget, least recently used
(by modification time: a load touches its file) first."""

from __future__ import annotations

import os

__all__ = ["trim_dir"]


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
