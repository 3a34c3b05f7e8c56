"""`bounded`: run a call that might hang in a daemon thread, so a test fails instead of hanging the suite."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def bounded(fn: Callable[[], Any], seconds: float, what: str = "a hang") -> Any:
    """`fn()` in a daemon thread: its result or its exception, or a failure naming `what` when it does not return
    within `seconds`."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not return in {seconds}s ({what})"
    if "error" in box:
        raise box["error"]
    return box["value"]
