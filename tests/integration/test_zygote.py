"""Workers forked from the zygote: their exit codes reach the launcher, the zygote outlives
them and then exits, and a launcher killed with SIGKILL takes the zygote and every worker
with it."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from gasloc_emu.emulator.zygote import Zygote

pytestmark = pytest.mark.integration


def test_a_forked_worker_reports_its_exit_code_and_its_log(tmp_path):
    zygote = Zygote()
    try:
        log = tmp_path / "worker0.log"
        child = zygote.spawn([str(tmp_path / "no-run"), "0"], {"PATH": "/usr/bin"}, str(log),
                             append=False)
        assert child.wait(timeout=60) == 1 and child.poll() == 1
        assert "launch.json" in log.read_text()   # the worker's own traceback, in its log
    finally:
        zygote.close()
    assert zygote.proc.wait(timeout=10) == 0   # nothing left to wait for: it exits


def test_sigkill_of_the_launcher_takes_the_forked_workers_with_it(tmp_path, alive):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "gasloc_emu", "run", "--workers", "3",
                             "--model", "tiny", "--rounds", "500", "--local-steps", "1",
                             "--step-time-s", "0.05", "--no-dashboard", "--set",
                             "data.max_corpus_mb=0.5", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no round finished"
            time.sleep(0.2)
        pids = [w["pid"] for w in json.loads((out / "workers.json").read_text())]
        zygotes = [int(p) for p in subprocess.run(
            ["pgrep", "-P", str(proc.pid), "-f", "emulator.zygote"], capture_output=True,
            text=True).stdout.split()]
        assert len(zygotes) == 1 and all(alive(p) for p in pids), (zygotes, pids)
        # forked: the zygote is every worker's parent
        assert {_parent(p) for p in pids} == set(zygotes)
        # with the launcher's plan: no worker derives its own
        for rank in range(3):
            assert "run plan handed by the launcher" in \
                (out / "workers" / f"worker{rank}.log").read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    deadline = time.monotonic() + 10
    left = [p for p in pids + zygotes if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    assert not left, "the zygote or a worker survived the launcher"


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_wait_for_a_worker_of_a_zygote_that_is_gone_ends_at_once():
    """A zygote that exited reports no more exits: waiting for one ends at once, not at the
    deadline (the launcher's clean-up waits for every worker it kills)."""
    zygote = Zygote()   # never started: as one whose process has ended (not alive)
    t0 = time.monotonic()
    assert zygote.wait_exit(12345, time.monotonic() + 5.0) is None
    assert time.monotonic() - t0 < 1.0
