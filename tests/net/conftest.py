"""Net tests build real namespaces and qdiscs; they skip, with the reason, where that is impossible,
and fail instead where GASLOC_REQUIRE_NET=1 (CI: see ``needs.py``).

Every test here is marked ``net``. Tests that need tc take the ``tc_caps`` fixture, which skips
with "needs network namespaces and tc: <what is missing>". Scenarios run as separate processes
(``scenario.py``) the way the launcher runs: re-executed into their own user namespace.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from needs import tc_or_unavailable

from netem.capabilities import probe

SCENARIO = Path(__file__).with_name("scenario.py")
HOSTS = Path(__file__).with_name("hosts.py")
REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.net)


@pytest.fixture(scope="session")
def tc_caps():
    return tc_or_unavailable(probe())


class Scenarios:
    """What tests use to run scenario.py (the ``scenario`` fixture)."""

    run = staticmethod(lambda args, timeout_s=60.0: run_scenario(args, timeout_s))
    start = staticmethod(lambda args: start_scenario(args))
    read = staticmethod(lambda proc, timeout_s=30.0: read_result(proc, timeout_s))


@pytest.fixture
def scenario() -> Scenarios:
    return Scenarios()


def run_scenario(args: dict, timeout_s: float = 60.0) -> dict:
    """Run scenario.py to completion; its RESULT json."""
    proc = subprocess.run([sys.executable, str(SCENARIO), json.dumps(args)], capture_output=True,
                          text=True, timeout=timeout_s, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, \
        f"scenario failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def start_scenario(args: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCENARIO), json.dumps(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def read_result(proc: subprocess.Popen, timeout_s: float = 30.0) -> dict:
    """The RESULT line of a scenario that keeps running (read with a deadline via a thread)."""
    import queue
    import threading
    q: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            if line.startswith("RESULT "):
                q.put(json.loads(line[len("RESULT "):]))
                return
        q.put(None)
    threading.Thread(target=pump, daemon=True).start()
    try:
        out = q.get(timeout=timeout_s)
    except queue.Empty:
        out = None
    if out is None:
        proc.kill()
        raise AssertionError(f"scenario gave no result: {proc.stderr.read()[-2000:]}")
    return out


@pytest.fixture
def hosts(tc_caps, tmp_path):
    """Run nodes on emulated hosts (``hosts.py``); returns its RESULT (exit codes, output,
    leftovers). Each call logs into a folder of its own."""
    calls = []

    def run(nodes: list[dict], kill: dict | None = None, timeout_s: float = 150.0) -> dict:
        log_dir = tmp_path / f"hosts{len(calls)}" if calls else tmp_path
        log_dir.mkdir(exist_ok=True)
        calls.append(log_dir)
        args = {"hosts": len(nodes), "nodes": nodes, "kill": kill, "timeout_s": timeout_s,
                "log_dir": str(log_dir)}
        proc = subprocess.run([sys.executable, str(HOSTS), json.dumps(args)], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout_s + 60)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"hosts.py failed: {proc.stderr[-3000:]}"
        return json.loads(lines[-1][len("RESULT "):])
    return run
