"""The routers living in this process, for the gateway's debug view.

Its own module on purpose: Ray Serve pickles the request router's module by value, so a registry kept there would
be a private copy per unpickling; this module is imported by reference, so there is one per process.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["register", "routers"]

_ROUTERS: weakref.WeakSet = weakref.WeakSet()


def register(router: Any) -> None:
    _ROUTERS.add(router)


def routers() -> list[Any]:
    return list(_ROUTERS)
