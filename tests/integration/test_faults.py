"""Deterministic fault injection: worker w fails at round r, and the user sees exactly that.

Each case runs the real command (``simulate`` or ``run``) with a ``[fault]`` setting and asserts
what a user gets: exit code 1, status ``failed``, the failing worker named in the error and on
stderr, and every metrics row of the rounds before the fault kept (none of the fault's round).
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from gasloc_emu import config as C
from gasloc_emu.transport.faults import FaultPlan, FaultyTransport, InjectedFault, with_fault

pytestmark = pytest.mark.integration

WORKERS, ROUNDS, FAULT_WORKER, FAULT_ROUND = 3, 4, 1, 2
BASE = ["--workers", str(WORKERS), "--model", "tiny", "-H", "2", "-R", str(ROUNDS),
        "--topology", "ring", "--no-dashboard", "--set", "data.max_corpus_mb=0.5",
        "--set", "data.eval_batches=1", "--set", f"fault.worker={FAULT_WORKER}",
        "--set", f"fault.round={FAULT_ROUND}"]
EXPECT = {  # mode -> (words in the simulator's error, words in the emulator's error)
    "raise": ("worker 1 raise at round 2", "worker 1 failed in round 2"),
    "exit": ("worker 1 exited with code 3", "worker 1 died (exit code 3) in round 2"),
    "hang": ("worker 1 stopped responding at round 2", "worker 1 silent for"),
}


def with_fault_mode(gasloc, command: str, mode: str, out: Path, *extra: str):
    return gasloc(command, *BASE, "--set", f"fault.mode={mode}", "--out", str(out), *extra)


def assert_failed_as_a_user_sees_it(done: subprocess.CompletedProcess, out: Path,
                                    words: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert words in done.stderr, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and words in summary["error"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    kept = sorted((r["worker"], r["round"]) for r in rows)
    # every row written before the fault is kept: the failing worker's rounds before it all,
    # a peer's a prefix of them (a peer stopped while waiting may not have finished the last)
    assert [t for w, t in kept if w == FAULT_WORKER] == list(range(FAULT_ROUND))
    for w in range(WORKERS):
        mine = [t for v, t in kept if v == w]
        assert mine == list(range(len(mine))) and len(mine) <= FAULT_ROUND


@pytest.mark.parametrize("mode", ["raise", "exit", "hang"])
def test_simulate_reports_the_injected_fault(tmp_path, gasloc, mode):
    t0 = time.monotonic()
    done = with_fault_mode(gasloc, "simulate", mode, tmp_path / "sim")
    assert_failed_as_a_user_sees_it(done, tmp_path / "sim", EXPECT[mode][0])
    assert time.monotonic() - t0 < 120  # a hang is seen as a stall at once, not after 600 s


# a worker that dies without a word is also test_launcher's killed worker (SIGKILL), and one
# that goes silent its stopped worker (SIGSTOP: the heartbeat stops, as with an injected hang)
@pytest.mark.parametrize("mode", ["raise", pytest.param("exit", marks=pytest.mark.slow),
                                  pytest.param("hang", marks=pytest.mark.slow)])
def test_run_reports_the_injected_fault(tmp_path, gasloc, alive, mode):
    """The exit and hang arms are slow; covered in the default suite by the raise arm,
    test_simulate_reports_the_injected_fault and tests/integration/test_launcher.py's killed and
    stopped workers."""
    done = with_fault_mode(gasloc, "run", mode, tmp_path / "run",
                           "--set", "run.heartbeat_timeout_s=3")
    assert_failed_as_a_user_sees_it(done, tmp_path / "run", EXPECT[mode][1])
    workers = json.loads((tmp_path / "run" / "workers.json").read_text())
    assert not [w["pid"] for w in workers if alive(w["pid"])]  # the hung worker included


class _Recorder:
    """A transport that only records the calls it receives."""

    rank, world_size = 1, 3

    def __init__(self):
        self.calls: list[tuple] = []

    def send(self, peer, round_idx, kind, tensor):
        self.calls.append(("send", round_idx))

    def recv(self, peer, round_idx, kind):
        self.calls.append(("recv", round_idx))

    def counters(self):
        return {"dropped": 0}


def test_the_fault_fires_once_at_its_round_and_not_before():
    inner = _Recorder()
    tp = FaultyTransport(inner, FaultPlan(1, 2, "raise"), on_exit=None, on_hang=None)
    tp.send(0, 0, "z", None)
    tp.recv(0, 1, "z")
    assert tp.injected == 0 and tp.counters() == {"dropped": 0} and tp.world_size == 3
    with pytest.raises(InjectedFault, match="worker 1 raise at round 2"):
        tp.recv(0, 2, "z")
    assert tp.injected == 1 and inner.calls == [("send", 0), ("recv", 1)]


def test_exit_and_hang_call_their_hooks():
    seen = []
    tp = FaultyTransport(_Recorder(), FaultPlan(1, 0, "exit", exit_code=7),
                         on_exit=seen.append, on_hang=None)
    with pytest.raises(InjectedFault):  # the hook returned (a test hook): never train on
        tp.send(0, 0, "z", None)
    tp = FaultyTransport(_Recorder(), FaultPlan(1, 0, "hang"), on_exit=None,
                         on_hang=lambda: seen.append("hang"))
    with pytest.raises(InjectedFault):
        tp.recv(0, 3, "z")
    assert seen == [7, "hang"]


def test_only_the_named_worker_is_wrapped():
    tp = _Recorder()
    plan = FaultPlan(1, 2, "raise")
    assert with_fault(tp, None, 1, None, None) is tp
    assert with_fault(tp, plan, 0, None, None) is tp
    assert isinstance(with_fault(tp, plan, 1, None, None), FaultyTransport)


@pytest.mark.parametrize("bad", [{"fault.worker": 3}, {"fault.mode": "crash"},
                                 {"fault.round": -1}, {"fault.exit_code": 0}])
def test_bad_fault_settings_are_refused(bad):
    with pytest.raises(C.ConfigError, match=list(bad)[0]):
        C.resolve(None, {"workers": 3} | bad)
