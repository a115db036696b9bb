"""Overlapped GASLoC and DiLoCo in ``run`` against ``simulate``, on shaped links.

What overlap must deliver, at a size CI can afford: compute and one message transfer of about the
same length (5 nominal steps of 0.12 s; a tiny model's 0.48 MB at 6.4 Mbit/s is 0.6 s), under
the userspace shaper (no privileges needed). The emulator must really overlap (its measured
round is at most 0.7x the sequential one), agree with the simulator's losses, and the
simulator's predicted time must stay within 15 % of the measured one.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROUNDS, H = 4, 5
BASE = ["--workers", "4", "--model", "tiny", "--seed", "3", "--no-dashboard", "--rounds",
        str(ROUNDS), "--local-steps", str(H), "--bw-profile", "uniform", "--rate-mbit", "6.4",
        "--shaper", "userspace",
        "--step-time-s", "0.12",   # a real step takes up to ~0.085 s of a shared core here
        "--set", "data.max_corpus_mb=1", "--set", "data.eval_batches=1"]
ARMS = {"gasloc": ["--algo", "gasloc", "--topology", "ring", "--set", "algo.alpha=0.75"],
        "diloco": ["--algo", "diloco"]}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=300)


def record(out: Path) -> tuple[dict, list[dict]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), rows


def finished(rows: list[dict]) -> float:
    """When the last worker finished its last round, on the run's clock."""
    return max(r["time_s"] for r in rows)


def both(tmp_path: Path, name: str, *args: str) -> tuple[tuple, tuple]:
    """(run's record, simulate's record) for the same arguments."""
    out = {}
    for cmd in ("run", "simulate"):
        probe = ["--no-probe"] if cmd == "run" else []   # links.json is not what this checks
        res = cli(cmd, *BASE, *args, *probe, "--out", str(tmp_path / f"{name}-{cmd}"))
        assert res.returncode == 0, res.stderr
        out[cmd] = record(tmp_path / f"{name}-{cmd}")
    return out["run"], out["simulate"]


def assert_same_losses(ran: tuple, simulated: tuple) -> None:
    key = lambda r: (r["round"], r["worker"])  # noqa: E731
    got, want = sorted(ran[1], key=key), sorted(simulated[1], key=key)
    assert [key(r) for r in got] == [key(r) for r in want]
    for a, b in zip(got, want, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5), key(a)
    assert ran[0]["final_eval_loss"] == pytest.approx(simulated[0]["final_eval_loss"], abs=1e-5)


@pytest.mark.parametrize("algo", ["gasloc", pytest.param("diloco", marks=pytest.mark.slow)])
def test_overlap_hides_the_transfer_in_run_and_simulate_alike(tmp_path, algo):
    """DiLoCo's arm is slow (the CI suite's budget). Covered in the default suite by
    test_overlapped_diloco_in_worker_processes_is_simulate_to_the_bit (its losses in run) and
    test_overlap_hides_the_transfer_in_run_and_simulate_alike[gasloc] (the hiding)."""
    seq_run, seq_sim = both(tmp_path, "seq", *ARMS[algo])
    ovl_run, ovl_sim = both(tmp_path, "ovl", *ARMS[algo], "--overlap", "1")
    assert_same_losses(ovl_run, ovl_sim)
    measured = finished(ovl_run[1]) / finished(seq_run[1])
    predicted = finished(ovl_sim[1]) / finished(seq_sim[1])
    assert measured <= 0.7 and predicted <= 0.7, (measured, predicted)
    for ran, sim in ((seq_run, seq_sim), (ovl_run, ovl_sim)):
        assert finished(sim[1]) == pytest.approx(finished(ran[1]), rel=0.15)
        # the host kept the nominal steps (a stray one over 0.12 s on a busy CI host is noise)
        assert sum(ran[0]["compute"]["overruns"]) <= 0.02 * 4 * H * ROUNDS, ran[0]["compute"]
    # the staleness is paid in loss, not hidden: overlap changes the iterates
    assert ovl_run[0]["final_eval_loss"] != seq_run[0]["final_eval_loss"]


def test_overlapped_diloco_in_worker_processes_is_simulate_to_the_bit(tmp_path):
    """Overlapped DiLoCo in worker processes, short: 3 workers, 3 rounds of 2 nominal steps,
    unshaped, with a scenario that slows one worker and pauses another (overlap takes every
    event but leaves, joins and partitions). Every loss equals the simulator's, and differs
    from sequential DiLoCo's (the background All-Reduce's outer step lands a round late)."""
    scenario = tmp_path / "slow.toml"
    scenario.write_text("[[event]]\ntype = 'speed'\nworker = 1\nround = 1\nspeed = 0.5\n\n"
                        "[[event]]\ntype = 'pause'\nworker = 2\nround = 2\nseconds = 0.1\n")
    args = ["--workers", "3", "--model", "tiny", "--seed", "3", "--no-dashboard", "--rounds",
            "3", "--local-steps", "2", "--step-time-s", "0.05", "--algo", "diloco",
            "--scenario", str(scenario),
            "--set", "data.max_corpus_mb=1", "--set", "data.eval_batches=1"]
    out = {}
    for name, cmd, extra in (("ovl-run", "run", ["--overlap", "1"]),
                             ("ovl-sim", "simulate", ["--overlap", "1"]),
                             ("seq-sim", "simulate", [])):
        res = cli(cmd, *args, *extra, "--out", str(tmp_path / name))
        assert res.returncode == 0, res.stderr
        out[name] = record(tmp_path / name)
    key = lambda r: (r["round"], r["worker"])  # noqa: E731
    losses = {n: {key(r): r["train_loss"] for r in rows} for n, (_, rows) in out.items()}
    assert len(losses["ovl-run"]) == 3 * 3 and losses["ovl-run"] == losses["ovl-sim"]
    assert out["ovl-run"][0]["final_eval_loss"] == out["ovl-sim"][0]["final_eval_loss"]
    assert out["ovl-run"][0]["final_eval_loss"] != out["seq-sim"][0]["final_eval_loss"]


def final_loss(tmp_path: Path, name: str, overlap: int, alpha: float) -> float:
    """GASLoC on one-peer matchings (runs/overlap.toml, gamma 0.9, eta 0.35), 4 workers, 20
    rounds of 5 inner steps (the preset's 10 halved, for CI's budget), in the simulator (its
    losses are run's, as above)."""
    from gasloc_emu import config
    from gasloc_emu.plan import build_plan
    from gasloc_emu.simulator.simulate import simulate
    cfg = config.resolve(Path(__file__).parents[2] / "runs" / "overlap.toml",
                         {"workers": 4, "run.rounds": 20, "algo.local_steps": 5,
                          "run.eval_every": 0, "net.bw_profile": "", "algo.overlap": overlap,
                          "algo.alpha": alpha, "algo.outer_lr": 0.35})
    return simulate(build_plan(cfg), tmp_path / name)["final_eval_loss"]


def test_overlapped_gasloc_ends_within_2_percent_of_sequential_at_equal_rounds(tmp_path):
    """The loss half of the must-hold (3 % at the sweep's 10 inner steps: 1.3 % at 20 rounds
    of them), each arm with the gossip step the sweep found best for it (docs/RESULTS.md,
    "Overlap"), at 5 inner steps a round. The bound is this setting's own, from seeds 0-7:
    overlapped ends -0.73 % to +0.52 % from sequential (+0.46 % on seed 0, the preset's, taken
    here), and overlapped at alpha = 1, whose late correction overshoots (docs/ALGORITHM.md,
    "What the lag costs", and its test on the quadratic harness in tests/unit/test_overlap.py),
    ends +3.5 % to +6.4 % above: 2 % keeps about 1.5 points from either."""
    sequential = final_loss(tmp_path, "seq", 0, 0.5)
    lazy = final_loss(tmp_path, "lazy", 1, 0.35)
    assert lazy <= 1.02 * sequential, (lazy, sequential)


def test_overlap_refuses_leaves_joins_and_partitions_and_says_why(tmp_path):
    scenario = tmp_path / "leave.toml"
    scenario.write_text("[[event]]\ntype = 'leave'\nworker = 1\nround = 1\n")
    res = cli("simulate", "--workers", "4", "--model", "tiny", "--rounds", "3", "--overlap", "1",
              "--topology", "matching", "--scenario", str(scenario), "--no-dashboard",
              "--out", str(tmp_path / "r"))
    assert res.returncode == 2
    assert "algo.overlap = 1 does not take leaves, joins or partitions" in res.stderr
    assert not (tmp_path / "r").exists()
