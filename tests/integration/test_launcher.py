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
    return subprocess.run([sys.executable, "-m", "gasloc_emu.cli", *args], capture_output=True,
                          text=True, timeout=timeout, **kw)


def start(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gasloc_emu.cli", *args], stdout=subprocess.PIPE,
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
    ["--algo", "gasloc", "--topology", "ring"],
    ["--algo", "gasloc", "--topology", "matching"],
    ["--algo", "gasloc", "--topology", "complete"],
    ["--algo", "diloco"],
    ["--algo", "dsgd", "--topology", "ring", "--local-steps", "1"],
], ids=["gasloc-ring", "gasloc-matching", "gasloc-complete", "diloco", "dsgd"])
def test_run_matches_simulate(tmp_path, arm):
    args = BASE + ["--rounds", "3"] + arm
    ran = cli("run", *args, "--out", str(tmp_path / "run"))
    assert ran.returncode == 0, ran.stderr
    sim = cli("simulate", *args, "--out", str(tmp_path / "sim"))
    assert sim.returncode == 0, sim.stderr
    key = lambda r: (r["round"], r["worker"])  # noqa: E731
    got = sorted(rows(tmp_path / "run"), key=key)
    want = sorted(rows(tmp_path / "sim"), key=key)
    assert [key(r) for r in got] == [key(r) for r in want]
    for a, b in zip(got, want):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["bytes_sent"] == b["bytes_sent"]
    lines = ran.stdout.strip().splitlines()  # --no-dashboard: plain lines, one per round
    assert "\x1b" not in ran.stdout
    assert [ln.split()[:2] for ln in lines[:3]] == [["round", f"{k}/3"] for k in (1, 2, 3)]
    assert lines[3].startswith("final eval loss") and lines[4].startswith("run record:")
    s_run, s_sim = summary(tmp_path / "run"), summary(tmp_path / "sim")
    assert s_run["status"] == "ok" and s_run["mode"] == "run"
    assert s_run["final_eval_loss"] == pytest.approx(s_sim["final_eval_loss"], rel=1e-5)
    assert set(s_sim) <= set(s_run)  # the same record keys, and more
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
    good = {"v": 1, "src": 0, "round": 0, "kind": "z", "dtype": "float32", "shape": [4], "nbytes": 16}
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


def test_malformed_messages_are_dropped_and_counted(tmp_path):
    out = tmp_path / "run"
    proc = start("run", *BASE, "--rounds", "30", "--algo", "gasloc", "--topology", "ring",
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
    assert s["dropped_messages"] >= len(messages) - 1  # one may be refused by zmq's size cap
    sim = cli("simulate", *BASE, "--rounds", "30", "--algo", "gasloc", "--topology", "ring",
              "--out", str(tmp_path / "sim"))
    assert sim.returncode == 0, sim.stderr
    # the garbage changed nothing: parameters are those of an undisturbed (simulated) run
    assert summary(tmp_path / "sim")["final_eval_loss"] == pytest.approx(s["final_eval_loss"], rel=1e-5)
