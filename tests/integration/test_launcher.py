"""The multi-process emulator: equivalence with the simulator, failures, bad messages, signals."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

pytestmark = pytest.mark.integration

BASE = ["--workers", "4", "--model", "tiny", "--local-steps", "3", "--seed", "3", "--no-dashboard",
        "--set", "data.max_corpus_mb=1"]


def cli(*args, timeout=240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=timeout, **kw)


def start(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gasloc_emu", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the launcher exited ({proc.returncode}) while waiting for "
                                 f"{what}: {proc.stderr.read()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")



def worker_pids(run_dir: Path) -> list[int]:
    return [w["pid"] for w in json.loads((run_dir / "workers.json").read_text())]


def start_long_run(out: Path, *args: str) -> tuple[subprocess.Popen, list[int]]:
    """A 400-round run, returned once its first round is in metrics.jsonl, with worker pids."""
    proc = start("run", *BASE, "--rounds", "400", *args, "--out", str(out))
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and rows(out), 120, "the first round",
                 proc)
    except BaseException:
        proc.kill()
        raise
    return proc, worker_pids(out)


@pytest.mark.parametrize("arm", [
    # gasloc-ring and diloco are also checked, with churn, by test_churn.py; dsgd is gasloc's
    # gossip code with eta = 1, gamma = 0 (test_simulate.py checks the identity)
    pytest.param(["--algo", "gasloc", "--topology", "ring"], marks=pytest.mark.slow),
    ["--algo", "gasloc", "--topology", "matching"],
    # gasloc on the complete graph is DiLoCo's update (test_simulate.py checks the identity)
    pytest.param(["--algo", "gasloc", "--topology", "complete"], marks=pytest.mark.slow),
    pytest.param(["--algo", "diloco"], marks=pytest.mark.slow),
    pytest.param(["--algo", "dsgd", "--topology", "ring", "--local-steps", "1"],
                 marks=pytest.mark.slow),
], ids=["gasloc-ring", "gasloc-matching", "gasloc-complete", "diloco", "dsgd"])
def test_run_matches_simulate(tmp_path, arm):
    """Only gasloc-matching is in the default suite; the slow arms are covered there by it,
    tests/integration/test_churn.py (gasloc-ring, diloco), test_simulate.py's identities
    (gasloc-complete is DiLoCo, dsgd is gasloc with eta 1 and gamma 0) and
    tests/integration/test_timed_self_run.py's DSGD run."""
    args = BASE + ["--rounds", "3"] + arm
    ran = cli("run", *args, "--out", str(tmp_path / "run"))
    assert ran.returncode == 0, ran.stderr
    sim = cli("simulate", *args, "--out", str(tmp_path / "sim"))
    assert sim.returncode == 0, sim.stderr
    key = lambda r: (r["round"], r["worker"])  # noqa: E731
    got = sorted(rows(tmp_path / "run"), key=key)
    want = sorted(rows(tmp_path / "sim"), key=key)
    assert [key(r) for r in got] == [key(r) for r in want]
    for a, b in zip(got, want, strict=True):
        assert a["train_loss"] == b["train_loss"]  # the same bits (docs/ARCHITECTURE.md)
        assert a["bytes_sent"] == b["bytes_sent"]
    lines = ran.stdout.strip().splitlines()  # --no-dashboard: plain lines, one per round
    assert "\x1b" not in ran.stdout
    assert [ln.split()[:2] for ln in lines[:3]] == [["round", f"{k}/3"] for k in (1, 2, 3)]
    assert lines[3].startswith("final eval loss") and lines[4].startswith("run record:")
    s_run, s_sim = summary(tmp_path / "run"), summary(tmp_path / "sim")
    assert s_run["status"] == "ok" and s_run["mode"] == "run"
    assert s_run["final_eval_loss"] == s_sim["final_eval_loss"]
    assert set(s_sim) <= set(s_run)  # the same record keys, and more
    # the host's CPU time by kind while it ran (a hypervisor's steal would slow shaped links)
    assert sum(s_run["host_cpu"].values()) == pytest.approx(1.0, abs=1e-3)
    links = json.loads((tmp_path / "run" / "links.json").read_text())["links"]
    assert sum(lk["bytes"] for lk in links) == s_run["bytes_sent_total"] > 0


def test_killed_worker_stops_the_run(tmp_path, alive):
    out = tmp_path / "run"
    proc, pids = start_long_run(out, "--algo", "gasloc", "--topology", "ring",
                                "--set", "run.heartbeat_timeout_s=20")
    try:
        t_kill = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t_kill
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "worker 1" in err and "signal 9" in err, err
    assert took < 20
    assert not [p for p in pids if alive(p)], "worker processes left behind"
    s = summary(out)
    assert s["status"] == "failed" and "worker 1" in s["error"]
    assert rows(out), "metrics written before the failure are kept"


def test_silent_worker_is_detected(tmp_path, alive):
    out = tmp_path / "run"
    proc, pids = start_long_run(out, "--algo", "gasloc", "--topology", "ring",
                                "--set", "run.heartbeat_timeout_s=3")
    try:
        os.kill(pids[2], signal.SIGSTOP)  # alive but silent: only the heartbeat timeout sees it
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "worker 2 silent" in err, err  # the stopped one is named, not a peer that waited on it
    assert not [p for p in pids if alive(p)]


def test_sigterm_stops_every_worker(tmp_path, alive):
    out = tmp_path / "run"
    proc, pids = start_long_run(out, "--algo", "diloco")
    try:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert not [p for p in pids if alive(p)]
    assert summary(out)["status"] == "stopped"


def _garbage(addr: str) -> list[list[bytes]]:
    import msgpack
    good = {"v": 1, "src": 0, "round": 0, "kind": "z", "dtype": "float32", "shape": [4],
            "nbytes": 16}
    return [
        [b"\x00garbage\xff"],
        [b"not msgpack at all", b"x" * 16],
        [msgpack.packb(good | {"src": 99}), b"\0" * 16],           # unknown sender
        [msgpack.packb(good | {"round": 10**6}), b"\0" * 16],      # far outside the round window
        [msgpack.packb(good | {"dtype": "int64"}), b"\0" * 32],    # dtype mismatch
        [msgpack.packb(good | {"nbytes": 16}), b"\0" * 7],         # truncated payload
        [msgpack.packb(good | {"shape": [5]}), b"\0" * 16],        # shape/size mismatch
        [msgpack.packb([1, 2, 3]), b""],                           # header not a map
    ]


# by default the data plane authenticates, so garbage never gets in: the same barrier as
# test_forger's keyless forger (which runs in CI); this one also counts drops when it does
@pytest.mark.slow
def test_garbage_from_outside_the_run_changes_nothing(tmp_path):
    """Covered in the default suite by tests/integration/test_forger.py's
    test_a_forger_without_the_keys_changes_nothing (one shaper drawn per session)."""
    out = tmp_path / "run"
    proc = start("run", *BASE, "--rounds", "10", "--algo", "gasloc", "--topology", "ring",
                 "--out", str(out))
    ctx = zmq.Context()
    try:
        wait_for(lambda: (out / "workers.json").exists(), 120, "the workers to start", proc)
        addr = json.loads((out / "workers.json").read_text())[0]["addr"]
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(addr)
        messages = _garbage(addr)
        for msg in messages:
            sock.send_multipart(msg)
        sock.close()
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
        ctx.term()
    assert proc.returncode == 0, err
    s = summary(out)
    assert s["status"] == "ok" and math.isfinite(s["final_eval_loss"])
    # the data plane authenticates: a socket without the run's keys never gets a message in,
    # so nothing reached the mailbox (insider garbage is tested in test_zmq_transport)
    assert set(s["drops"]["by_reason"]) <= {r for r in s["drops"]["by_reason"]
                                            if r.startswith("zap.")}
    sim = cli("simulate", *BASE, "--rounds", "10", "--algo", "gasloc", "--topology", "ring",
              "--out", str(tmp_path / "sim"))
    assert sim.returncode == 0, sim.stderr
    # the garbage changed nothing: parameters are those of an undisturbed (simulated) run
    assert summary(tmp_path / "sim")["final_eval_loss"] == pytest.approx(s["final_eval_loss"],
                                                                         rel=1e-5)


# -- control messages: checked, dispatched by type, every drop counted by reason

FORGED_HB = {"type": "hb", "worker": 2, "round": 0, "step": 0, "state": "done", "peer": None,
             "sent": {0: 10**12}, "dropped": 5, "drop_reasons": {"forged": 5}}
CONTROL_RUN = [*BASE, "--rounds", "6", "--algo", "gasloc", "--topology", "ring"]


def _forge(run_dir: Path) -> None:
    """From outside the run, on its control sockets (named in launch.json): the probe's
    malformed heartbeat, a well-formed heartbeat for a worker it is not, bytes that are not
    msgpack, and an error report from two sockets that are no worker's."""
    from gasloc_emu.transport import control
    spec = json.loads((run_dir / "launch.json").read_text())
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 2000)
        push.connect(spec["heartbeat_addr"])
        for raw in (control.pack({"type": "hb", "worker": 0, "sent": {"x": "y"}}),
                    control.pack(FORGED_HB), b"\xc1 not msgpack"):
            push.send(raw)
        push.close()
        for ident in (None, b"w9"):
            dealer = ctx.socket(zmq.DEALER)
            if ident is not None:
                dealer.setsockopt(zmq.IDENTITY, ident)
            dealer.setsockopt(zmq.LINGER, 2000)
            dealer.connect(spec["ctl_addr"])
            dealer.send(control.pack({"type": "error", "worker": 0, "error": "forged: stop"}))
            dealer.close()
    finally:
        ctx.term()


def test_forged_and_malformed_control_messages_change_nothing(tmp_path):
    out = tmp_path / "run"
    proc = start("run", *CONTROL_RUN, "--out", str(out))
    try:
        wait_for(lambda: (out / "workers.json").exists(), 120, "the workers to start", proc)
        _forge(out)
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    s = summary(out)
    assert s["status"] == "ok"
    # counted by reason where they reached the launcher; where its sockets authenticate
    # senders, the forger cannot connect and nothing reaches it
    assert s["control_drops"] in ({}, {"hb.fields": 1, "undecodable": 1, "sender": 2})
    clean = cli("run", *CONTROL_RUN, "--out", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr
    c = summary(tmp_path / "clean")
    assert s["final_eval_loss"] == c["final_eval_loss"]  # bit for bit
    assert s["worker_eval_loss"] == c["worker_eval_loss"]
    assert c["control_drops"] == {}
    # data-plane drops come from the workers' own final counters, never from a heartbeat
    assert s["drops"] == c["drops"] and "forged" not in s["drops"]["by_reason"]
    assert set(s["drops"]) == {"total", "by_reason", "by_worker"}
    assert sorted(s["drops"]["by_worker"]) == ["0", "1", "2", "3"]


def _bare_supervisor(workers: int = 3, rounds: int = 4):
    """The launcher's message handling alone: a Supervisor without sockets or processes;
    returns it with the metric rows it records and the progress events it emits."""
    from types import SimpleNamespace

    from gasloc_emu.config import resolve
    from gasloc_emu.emulator import supervisor
    from gasloc_emu.emulator.conductor import Conductor
    from gasloc_emu.emulator.desk import ControlDesk
    from gasloc_emu.emulator.processes import WorkerSlot
    from gasloc_emu.training.devices import DeviceAssignment
    from gasloc_emu.training.model import count_parameters
    from gasloc_emu.transport import control
    sup = object.__new__(supervisor.Supervisor)
    recorded, events = [], []
    sup.cfg = resolve(overrides={"workers": workers, "model.preset": "tiny",
                                 "run.rounds": rounds})
    sup.rec, sup.progress = SimpleNamespace(metric=recorded.append), events.append
    sup.slots = [WorkerSlot(r, None, DeviceAssignment("cpu"), 0.0)
                 for r in range(workers)]
    sup.link_meter, sup.goodput, sup.t0 = supervisor.LinkMeter(), supervisor.Goodput(), 1.0
    sup.expect = control.Expect(workers, rounds, count_parameters(sup.cfg.model))
    sup.desk, sup.feed, sup.pairer, sup.lanes = ControlDesk(sup), None, None, None
    sup.checkpoints = supervisor.CheckpointWatch(0, range(workers))   # none taken
    sup.scenario = Conductor(None, None, rounds, sup._clock,
                             lambda rank, msg: sup._tell(rank, msg))  # no scenario
    return sup, recorded, events


def _frames(ident: bytes, msg: dict, *extra: bytes) -> list[zmq.Frame]:
    from gasloc_emu.transport import control
    return [zmq.Frame(ident), zmq.Frame(control.pack(msg)), *map(zmq.Frame, extra)]


ROW = {"worker": 1, "round": 0, "step": 3, "train_loss": 5.5, "compute_s": 0.5, "comm_s": 0.1,
       "wait_s": 0.0, "bytes_sent": 10, "bytes_recv": 10, "peers": [0, 2], "time_s": 1.0,
       "dropped": 0}


def test_the_launcher_drops_and_counts_what_it_cannot_trust():
    sup, recorded, events = _bare_supervisor()
    metric = {"type": "metric", "worker": 1, "row": ROW}
    hb = FORGED_HB | {"worker": 1, "drop_reasons": {"stale": 5}}
    sup.desk.on_control(_frames(b"w2", metric))                      # w2 speaking for worker 1
    sup.desk.on_control(_frames(b"\x00\x80\x00\x00\x29", metric))   # a socket that is no worker's
    sup.desk.on_control(_frames(b"w1", hb))                          # heartbeats go on the PULL
    sup.desk.on_control(_frames(b"w1", {"type": "start", "peers": {}}))
    sup.desk.on_heartbeat({"type": "hb", "worker": 0, "sent": {"x": "y"}})  # the probe
    sup.desk.on_heartbeat({"type": "invalid"})                        # what unpack makes of garbage
    sup.desk.on_heartbeat({"type": "ready", "worker": 1, "addr": "tcp://h:1", "device": "cpu"})
    sup.desk.on_heartbeat(hb, sender="w0")                            # an authenticated liar
    assert sup.desk.control_drops == {"spoofed": 2, "sender": 1, "channel": 2, "type": 1,
                                 "hb.fields": 1, "undecodable": 1}
    assert recorded == [] and all(s.last_seen == 0.0 for s in sup.slots)
    assert events[-1] == {"kind": "control_drops", "drops": sup.desk.control_drops}
    sup.desk.on_control(_frames(b"w1", metric))
    sup.desk.on_heartbeat(hb)
    assert recorded == [ROW] and sup.slots[1].round == 0 and sup.slots[1].last_seen > 0
    status = events[-1]
    assert status["kind"] == "status" and status["drop_reasons"] == {"stale": 5}


def test_the_launcher_acts_on_errors_and_checked_finals():
    import torch

    from gasloc_emu.emulator import errors
    from gasloc_emu.transport import control
    sup, _, _ = _bare_supervisor()
    err = {"type": "error", "worker": 2, "error": "Diverged: worker 2 diverged in round 1"}
    with pytest.raises(errors.RunFailed) as info:
        sup.desk.on_control(_frames(b"w2", err))
    assert not isinstance(info.value, errors.RunDiverged)
    with pytest.raises(errors.RunDiverged) as info:
        sup.desk.on_control(_frames(b"w2", err | {"diverged_at": {"worker": 2, "round": 1}}))
    assert info.value.where == {"worker": 2, "round": 1}
    numel = sup.expect.numel
    counters = {"bytes_sent": {1: 8}, "bytes_recv": {}, "raw_bytes_sent": {1: 8}, "dropped": 1,
                "wait_s": 0.5, "drop_reasons": {"stale": 1}}
    final = {"type": "final", "worker": 0, "eval_loss": 4.0, "dtype": "float32", "numel": numel,
             "counters": counters}
    theta = bytes(control.tensor_frame(torch.ones(numel)))
    with pytest.raises(errors.RunFailed, match="final parameters"):  # fail, never hang
        sup.desk.on_control(_frames(b"w0", final, theta[:-4]))
    assert sup.desk.control_drops == {"final.frame": 1} and sup.slots[0].final is None
    sup.desk.on_control(_frames(b"w0", final, theta))
    assert sup.slots[0].final["counters"] == counters and torch.equal(sup.slots[0].theta,
                                                                      torch.ones(numel))
    from gasloc_emu.emulator.tally import link_bytes
    assert link_bytes(sup.slots) == [{"src": 0, "dst": 1, "bytes": 8, "raw_bytes": 8}]


def test_the_launcher_fixes_events_at_a_time_and_answers_round_starts():
    """Leaves and joins at a time (``fixing.RoundFixer`` on the launcher's clock): a round start
    is answered with every fixing due by then; a worker absent until a join waits for its
    answer until the join is fixed, or is let go once the others are done."""
    from gasloc_emu.scenario.events import JoinEvent, LeaveEvent
    from gasloc_emu.scenario.script import Scenario
    from gasloc_emu.scenario.world import World, ring_peers
    sup, _, _ = _bare_supervisor(workers=3, rounds=8)
    told = []
    sup._tell = lambda rank, msg: told.append((rank, msg))
    ask = {"type": "round", "worker": 1, "round": 0, "waiting": False}
    sup.desk.on_control(_frames(b"w1", ask))
    assert sup.desk.control_drops == {"round.scenario": 1} and told == []   # no events at a time
    scenario = Scenario((JoinEvent(at_s=5.0, worker=2), LeaveEvent(at_s=10.0, worker=1)), 3, 8)
    sup.scenario.world = World(scenario, 3, 8, 0.5, ring_peers)

    def at(now_s: float, rank: int, round_idx: int, waiting: bool = False) -> None:
        sup.t0 = time.time() - now_s
        sup.desk.on_control(_frames(f"w{rank}".encode(), {"type": "round", "worker": rank,
                                                      "round": round_idx, "waiting": waiting}))

    at(0.5, 2, 0, waiting=True)    # the new worker asks before its join's time: no answer yet
    at(0.5, 0, 2)
    assert told == [(0, {"type": "fixings", "released": False, "fixings": []})]
    at(5.5, 1, 3)                  # the join is due: fixed at 1 + the highest round started
    join = {"index": 0, "part": "start", "at_s": 5.0, "round": 3}
    assert told[1:] == [(2, {"type": "fixings", "released": False, "fixings": [join]}),
                        (1, {"type": "fixings", "released": False, "fixings": [join]})]
    assert sup.scenario.world.alive(3) == {0, 1, 2} and sup.scenario.join_waiters == {}
    at(10.5, 0, 4)                 # worker 1 had started round 3: the leave lands on round 4
    assert told[-1][1]["fixings"][-1] == {"index": 1, "part": "start", "at_s": 10.0, "round": 4}
    assert sup.scenario.world.alive(4) == {0, 2}


def test_the_launcher_lets_a_waiting_worker_go_once_the_others_are_done():
    from gasloc_emu.scenario.events import JoinEvent
    from gasloc_emu.scenario.script import Scenario
    from gasloc_emu.scenario.world import World, ring_peers
    sup, _, _ = _bare_supervisor(workers=3, rounds=8)
    told = []
    sup._tell = lambda rank, msg: told.append((rank, msg))
    sup.scenario.world = World(Scenario((JoinEvent(at_s=600.0, worker=2),), 3, 8), 3, 8, 0.5,
                               ring_peers)
    sup.t0 = time.time() - 1.0
    sup.desk.on_control(_frames(b"w2", {"type": "round", "worker": 2, "round": 0, "waiting": True}))
    sup.slots[0].final = {"eval_loss": 3.0}
    sup.scenario.fix_due(sup.slots)
    assert told == [] and not sup.slots[2].gone    # worker 1 still trains
    sup.slots[1].final = {"eval_loss": 3.0}
    sup.scenario.fix_due(sup.slots)
    assert told == [(2, {"type": "fixings", "released": True, "fixings": []})]
    assert sup.slots[2].gone and sup.scenario.join_waiters == {}
