"""Part: devservices. Free TCP ports on the loopback interface.

A port found free here can be taken by another process before the server binds it. The servers in this
package therefore look for "address already in use" when a start fails, and retry on fresh ports.
"""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that nothing listened on a moment ago."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Return ``count`` distinct free TCP ports on ``host``.

    Every socket is held open until all the ports are chosen, so the kernel cannot hand out one port twice.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def port_accepts(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def is_address_in_use(text: str) -> bool:
    """Whether a server's error output says its listening address was taken."""
    return "address already in use" in text.lower()
