"""A free TCP port on 127.0.0.1 for a test's server (the tests' servers never listen elsewhere)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
