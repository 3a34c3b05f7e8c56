"""The bytes a compiled structure holds, measured: what the caches of constrained decoding weigh their entries by.

A token index holds numpy arrays (the automaton's transition table, per-rule facts, memoised mask words), byte
strings (live bytes per state) and `array.array` rows, inside dicts, lists and small objects. `held_bytes` walks
that object graph (attributes, dict values, list and tuple items) and adds up the buffers it meets: `ndarray.nbytes`,
`len(bytes)`, `array.itemsize * len(array)`. Each object is counted once (by identity); the objects in `skip` and
everything below them are not counted (shared structures with their own bounds: the vocabulary and its trie).
Containers count 8 bytes a slot (16 a dict entry); Python's per-object overhead is not counted otherwise: the
buffers are what grows with a schema and a vocabulary.

An array on an anonymous mapping (`automaton.lazy_zeros`: a grammar automaton sizes its per-state arrays for a
million states, and the OS hands out a page on its first write) counts the pages of its first `mapped_rows` rows,
the states named so far, not its capacity.
"""

from __future__ import annotations

import mmap
from array import array
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["held_bytes"]

_ATOMS = frozenset((int, float, bool, str, type(None), complex))  # (by exact type: one set lookup an item)


def held_bytes(root: Any, skip: tuple[Any, ...] = (), mapped_rows: int | None = None) -> int:
    """Bytes of the buffers reachable from `root` (see the module docstring), not counting `skip`'s; arrays on an
    anonymous mapping count their first `mapped_rows` rows, page-rounded (None: all of them)."""
    seen = {id(obj) for obj in skip}
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if type(obj) in _ATOMS or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            chain = [obj]  # views down to the array (or buffer) that holds the memory, counted once
            while isinstance(chain[-1].base, np.ndarray):
                chain.append(chain[-1].base)
            buffer = chain[-1].base
            if isinstance(buffer, memoryview):
                buffer = buffer.obj
            if isinstance(buffer, mmap.mmap) and mapped_rows is not None and obj.ndim:
                seen.update(id(view) for view in chain)
                row = obj.nbytes // max(1, obj.shape[0])
                total += min(obj.nbytes, -(-row * mapped_rows // mmap.PAGESIZE) * mmap.PAGESIZE)
            elif len(chain) == 1:
                total += obj.nbytes
            else:
                stack.append(chain[1])
        elif isinstance(obj, (bytes, bytearray, memoryview)):
            total += obj.nbytes if isinstance(obj, memoryview) else len(obj)
        elif isinstance(obj, array):
            total += obj.itemsize * len(obj)
        elif isinstance(obj, dict):
            # (`list(...)` copies in one C call, atomic under the GIL: another thread may be filling the dict)
            pairs = list(obj.items())
            total += 16 * len(pairs)  # a slot's two references
            stack.extend([part for pair in pairs for part in pair if type(part) not in _ATOMS])
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = list(obj)
            total += 8 * len(items)  # a slot's reference (numbers in a per-state table: their whole cost, nearly)
            if len(items) > 64 and all(type(item) in _ATOMS for item in items[:64]):
                continue  # a table of numbers (per state, per token): its slots are its cost, items not visited
            stack.extend([item for item in items if type(item) not in _ATOMS])
        elif callable(obj) or isinstance(obj, ModuleType):  # code, classes, kernels: nothing a schema built
            continue
        else:
            fields = getattr(obj, "__dict__", None)
            if fields is not None:
                stack.extend(fields.values())
            for cls in type(obj).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    value = getattr(obj, name, None)
                    if value is not None:
                        stack.append(value)
    return total
