"""A free loopback port, for a server a test or benchmark must name before it starts."""

from __future__ import annotations

import random
import socket
from pathlib import Path

DRAWN = (10000, 20000)  # below the ports the stack tests name (tests/workers.py FIXED_PORTS: 20000 up)


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free when probed, drawn from DRAWN, below the kernel's ephemeral range: the kernel
    hands ports of that range to every bind to port 0 and every outgoing connection, so one found
    free there can be taken by any process (a torchrun's store, another test's client) before the
    server binds it."""
    low, high = DRAWN[0], min(DRAWN[1], _ephemeral_start())
    for _ in range(100):
        port = random.randrange(low, high)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # every draw taken: the kernel's choice
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
