"""Package faces that import their names on first use: `__getattr__ = lazy_attributes(__name__, {name: module})`.

A face stays light (importing `hf_paged.processors.index` in a compiling child loads neither torch nor
transformers) while `from package import Name` keeps working. A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ModuleAliases", "lazy_attributes"]


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


class ModuleAliases:
    """An import hook that keeps old module paths working after a module moved: `import old.path` (or `from
    old.path import X`) loads `new.path` and binds the same module object under both names, so a patch through one
    name is seen through the other. Install one with `ModuleAliases.install({old: new})`."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table

    @classmethod
    def install(cls, table: dict[str, str]) -> None:
        if not any(isinstance(f, cls) and f.table == table for f in sys.meta_path):
            sys.meta_path.append(cls(table))

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.table:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> Any:
        return importlib.import_module(self.table[spec.name])  # the moved module itself, not a copy

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the module ran when it was imported under its own name."""
