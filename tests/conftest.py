"""Helpers every kind of test shares, as fixtures: process liveness, free ports, the CLI."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.slow``: tests whose coverage another test of the default suite already
    gives (each one's docstring names it). Without GASLOC_SLOW_TESTS=1 they are deselected, as
    by ``-m "not slow"``, so that the default suite stays under CI's 15 minutes."""
    if os.environ.get("GASLOC_SLOW_TESTS"):
        return
    slow = [item for item in items if "slow" in item.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "slow" not in item.keywords]


def process_alive(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped) holds no sockets or namespaces, so it is dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the (command name)


def free_tcp_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that were free a moment ago (bound together, then closed)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_gasloc(*args: str, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    """``gasloc-emu ARGS`` in a fresh interpreter, output captured as text."""
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=timeout, **kw)


@pytest.fixture
def alive():
    return process_alive


@pytest.fixture
def free_ports():
    return free_tcp_ports


@pytest.fixture
def loopback_addrs():
    """``n`` -> {rank: tcp://127.0.0.1:PORT} on ports that were free a moment ago."""
    return lambda n: {r: f"tcp://127.0.0.1:{p}" for r, p in enumerate(free_tcp_ports(n))}


@pytest.fixture
def gasloc():
    return run_gasloc
