"""A run that survives: kill -9 of the launcher (or of ``simulate``, or of one worker) at a
random round, then ``--resume RUN_DIR``; the record must end as an uninterrupted run's would,
bit for bit."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROUNDS = 8
ARGS = ["--workers", "4", "--model", "tiny", "--rounds", str(ROUNDS), "--topology", "ring",
        "--local-steps", "3", "--eval-every", "2", "--step-time-s", "0.02",
        "--checkpoint-every", "1", "--no-dashboard", "--set", "data.max_corpus_mb=1"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=300)


def rows(run_dir: Path) -> list[dict]:
    out = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sorted(out, key=lambda r: (r["round"], r["worker"]))


def losses(run_dir: Path) -> list[tuple]:
    return [(r["round"], r["worker"], r["train_loss"], r.get("eval_loss")) for r in rows(run_dir)]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def kill_after(args: list[str], run_dir: Path, n_rows: int) -> None:
    """Start ``args`` and kill -9 its process once ``n_rows`` metrics rows are on disk."""
    proc = subprocess.Popen([sys.executable, "-m", "gasloc_emu", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path, deadline = run_dir / "metrics.jsonl", time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if path.exists() and path.read_text().count("\n") >= n_rows:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before the kill"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def kill_worker_after(args: list[str], run_dir: Path, n_rows: int,
                      rank: int) -> tuple[int, str]:
    """Start ``run *args`` and kill -9 worker ``rank``'s process (its launcher lives) once
    ``n_rows`` metrics rows are on disk; the launcher's exit status and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "gasloc_emu", "run", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    path, deadline = run_dir / "metrics.jsonl", time.monotonic() + 240
    try:
        while not (path.exists() and path.read_text().count("\n") >= n_rows):
            assert proc.poll() is None and time.monotonic() < deadline, "no kill before the end"
            time.sleep(0.02)
        os.kill(json.loads((run_dir / "workers.json").read_text())[rank]["pid"], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    res = cli("simulate", *ARGS, "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out


def test_run_killed_at_a_random_round_resumes_to_the_uninterrupted_losses(
        tmp_path, uninterrupted):
    kill_round = random.Random().randrange(2, ROUNDS - 2)   # a different one each time
    cut = tmp_path / "cut"
    kill_after(["run", *ARGS, "--out", str(cut)], cut, 4 * kill_round + 1)
    time.sleep(0.5)   # the workers die with the launcher (PR_SET_PDEATHSIG)
    res = cli("run", "--resume", str(cut), "--no-dashboard")
    assert res.returncode == 0, res.stderr
    got = summary(cut)
    assert got["status"] == "ok" and got["resumed"]["round"] >= kill_round - 1, got["resumed"]
    assert losses(cut) == losses(uninterrupted), f"killed after round {kill_round}"
    assert got["final_eval_loss"] == summary(uninterrupted)["final_eval_loss"]
    # files below the round before the last every worker has are gone: two rounds are left,
    # and nothing of a write the kill cut short
    assert {p.name.split("-")[1] for p in (cut / "checkpoints").iterdir()} == \
        {f"r{ROUNDS - 2:06d}.ckpt", f"r{ROUNDS - 1:06d}.ckpt"}


def test_a_worker_killed_at_a_random_round_ends_the_run_and_resume_repeats_it(
        tmp_path, uninterrupted):
    """kill -9 of one worker (not the launcher): the run ends failed naming it, and
    ``--resume`` goes on from the last round every worker has, to the uninterrupted losses."""
    kill_round = random.Random().randrange(2, ROUNDS - 2)
    cut = tmp_path / "cut"
    returncode, err = kill_worker_after([*ARGS, "--out", str(cut)], cut, 4 * kill_round + 1, 2)
    assert returncode != 0 and "worker 2" in err, err
    assert summary(cut)["status"] == "failed"
    res = cli("run", "--resume", str(cut), "--no-dashboard")
    assert res.returncode == 0, res.stderr
    assert summary(cut)["status"] == "ok"
    assert losses(cut) == losses(uninterrupted), f"worker 2 killed after round {kill_round}"
    assert summary(cut)["final_eval_loss"] == summary(uninterrupted)["final_eval_loss"]


def test_simulate_resumes_past_a_damaged_checkpoint(tmp_path, uninterrupted):
    cut = tmp_path / "cut"
    kill_after(["simulate", *ARGS, "--out", str(cut)], cut, 4 * 5)
    from gasloc_emu.report.records import rows_by_round
    from gasloc_emu.training.checkpoint import Checkpoints
    store = Checkpoints(cut)
    first_choice = store.latest_common(range(4), rows_by_round(cut)).round
    latest = store.path(2, first_choice)
    latest.write_bytes(latest.read_bytes()[:-1000])   # cut short, as a full disk would
    res = cli("simulate", "--resume", str(cut), "--no-dashboard")
    assert res.returncode == 0, res.stderr
    resumed = summary(cut)["resumed"]
    assert any(str(latest) in why and "truncated" in why for why in resumed["refused"])
    assert resumed["round"] < first_choice
    assert losses(cut) == losses(uninterrupted)
    assert [r["time_s"] for r in rows(cut)] == [r["time_s"] for r in rows(uninterrupted)]


def test_a_diloco_worker_killed_when_the_run_goes_on_is_survived_and_replayed(tmp_path):
    """``run.on_worker_loss = continue``: kill -9 of one DiLoCo worker process (its launcher
    lives) at a random round. The launcher sees it die, fixes the round it leaves at and
    tells the others; the ring's round that lost its chunks is not committed where the gap
    reached (``uncommitted``), the survivors merge and all-reduce over the two of them, the
    run ends ok, the messages lost are counted, and ``simulate --replay`` gives its losses row
    by row (``scenario.hostloss``)."""
    from gasloc_emu import config
    from gasloc_emu.plan import build_plan
    from gasloc_emu.scenario.hostloss import HostLoss
    rng = random.Random()
    victim, kill_round, rounds = rng.randrange(3), rng.randrange(2, 6), 9
    why = f"worker {victim} killed after round {kill_round}"
    out = tmp_path / "run"
    returncode, err = kill_worker_after(
        ["--workers", "3", "--model", "tiny", "--algo", "diloco", "--rounds", str(rounds),
         "--local-steps", "2", "--eval-every", "3", "--step-time-s", "0.02", "--no-dashboard",
         "--set", "data.max_corpus_mb=1", "--set", "run.on_worker_loss=continue",
         "--out", str(out)], out, 3 * kill_round + 1, victim)
    got = summary(out)
    assert returncode == 0 and got["status"] == "ok", (why, err[-2000:])
    [loss] = got["membership"]["host_losses"]
    assert loss["ranks"] == [victim] and loss["cause"] == "worker", (why, loss)
    assert got["membership"]["alive_at_end"] == sorted({0, 1, 2} - {victim}), why
    ran = rows(out)
    last = loss["last_rows"][str(victim)]
    assert max(r["round"] for r in ran if r["worker"] == victim) == last, why
    for w in {0, 1, 2} - {victim}:   # every round of every survivor
        assert [r["round"] for r in ran if r["worker"] == w] == list(range(rounds)), why
    # only a round the dead worker was a member of but dead in goes uncommitted, and the
    # summary lists each such round
    flagged = [r for r in ran if r.get("uncommitted")]
    assert all(last < r["round"] < loss["round"] for r in flagged), why
    assert got.get("uncommitted", {}).get("total", 0) == len(flagged), (why, got)
    # every message lost with it is counted: those done without (the rows) and those sent to
    # it in the rounds it was a member but dead (2(n - 1) a round, by the worker before it)
    plan = build_plan(config.resolve(out / "config.toml"), data=False)
    plan.world.lose(HostLoss.from_json(loss))
    lost = {w: sum(len(r.get("dead_peer") or ()) for r in ran if r["worker"] == w)
            for w in {0, 1, 2} - {victim}}
    sent = plan.world.sent_to_dead()
    assert got["drops"]["by_reason"].get("dead_peer", 0) == \
        sum(lost.values()) + sum(sent.values()), (why, got["drops"], lost, sent)
    res = cli("simulate", "--replay", str(out), "--out", str(tmp_path / "replay"))
    assert res.returncode == 0, (why, res.stderr)
    again = rows(tmp_path / "replay")
    assert [(r["round"], r["worker"], r["train_loss"], r.get("eval_loss"),
             r.get("uncommitted")) for r in again] == \
        [(r["round"], r["worker"], r["train_loss"], r.get("eval_loss"), r.get("uncommitted"))
         for r in ran], why
    assert summary(tmp_path / "replay")["final_eval_loss"] == got["final_eval_loss"], why
    assert summary(tmp_path / "replay")["drops"] == got["drops"], why   # the same messages
    assert summary(tmp_path / "replay").get("uncommitted") == got.get("uncommitted"), why
