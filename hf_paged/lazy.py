"""Package faces that import their names on first use: `__getattr__ = lazy_attributes(__name__, {name: module})`.

A face stays light (importing `hf_paged.processors.index` in a compiling child loads neither torch nor
transformers) while `from package import Name` keeps working. A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package`: `table[name]` names the module that defines `name`; the value is
    imported at first access and kept on the package, so later lookups never come back here."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
