"""Helpers every kind of test shares, as fixtures: process liveness, free ports, the CLI."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests: on CI (.ci/run sets HYPOTHESIS_PROFILE=ci) from a fixed seed (derandomize)
# with no example database, so CI's verdict is the code's, not the draw's; locally from fresh
# draws with hypothesis's database of found failures ("dev"), so a developer's runs keep
# looking; HYPOTHESIS_PROFILE=explore looks harder.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("dev")
settings.register_profile("explore", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


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


@pytest.fixture(scope="module")
def preempted_ms() -> float:
    """How long a runnable process may wait for a core on this host now, in ms: twice the
    longest gap in a second of spinning (0 on an idle machine; several milliseconds beside
    a busy job on every core). Timing bounds of processes that share the cores (the packet
    line's releases, a timed event's lateness, a receiver's reads) are their idle ones plus
    this, measured in the same session. Twice, because while a test runs its own processes
    want the cores too, about doubling the runnable tasks the probe competed with (beside one
    hog per core: the probe's longest gap 5.4 ms, the packet line's late-release p99 3.4-4.5 ms
    against its idle bound of 3 ms)."""
    longest, t = 0.0, time.perf_counter()
    end = t + 1.0
    while t < end:
        now = time.perf_counter()
        longest, t = max(longest, now - t), now
    return 2 * longest * 1e3
