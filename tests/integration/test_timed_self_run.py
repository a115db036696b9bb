"""Speed and pause events at a time, in simulate and run: each worker takes them at its first
round that starts at or after their time, by the virtual clock or the run's wall-clock; they
change only timing, so the losses stay simulate's."""
from __future__ import annotations

import json

import pytest

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate

SCENARIO = """
[[event]]
type = "speed"
worker = 1
speed = 0.5
at_s = 0.9

[[event]]
type = "pause"
worker = 2
seconds = 0.7
at_s = 1.4
"""


def _cfg(tmp_path, **dotted) -> C.Config:
    (tmp_path / "timed.toml").write_text(SCENARIO)
    return C.resolve(overrides={
        "workers": 4, "algo.local_steps": 5, "run.rounds": 8, "compute.step_time_s": 0.05,
        "run.scenario": str(tmp_path / "timed.toml"), "run.dashboard": "off"} | dotted)


def _run_and_simulate(tmp_path, cfg: C.Config) -> tuple[dict, dict]:
    """(run's summary, simulate's summary) of ``cfg``; run is launched in this process."""
    from gasloc_emu.emulator.launcher import launch
    from gasloc_emu.report.records import new_run_dir
    sim = simulate(build_plan(cfg), tmp_path / "sim")
    result = launch(build_plan(cfg), new_run_dir(cfg, tmp_path / "run"))
    assert result.code == 0
    return json.loads((tmp_path / "run" / "summary.json").read_text()), sim


def _train_losses(run_dir) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["worker"], r["round"]): r["train_loss"] for r in rows}


def _rows(run_dir, worker: int) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sorted((r for r in rows if r["worker"] == worker), key=lambda r: r["round"])


def _check_speed(rows: list[dict], at_s: float, slack_s: float) -> None:
    """Full speed up to the first round that started at or after ``at_s``, half speed after."""
    k = next(r["round"] for r in rows if r["speed"] == 0.5)
    assert all(r["speed"] == 1.0 for r in rows[:k]) and all(r["speed"] == 0.5 for r in rows[k:])
    assert rows[k - 1]["time_s"] >= at_s - slack_s      # round k started at or after at_s
    assert k < 2 or rows[k - 2]["time_s"] < at_s + slack_s   # and round k-1 before it
    assert rows[k]["compute_s"] >= 2 * rows[k - 1]["compute_s"] * 0.95


def _check_pause(rows: list[dict], at_s: float, slack_s: float) -> None:
    """One round stood still 0.7 s before its compute: the first that started at or after
    ``at_s``."""
    starts = [0.0] + [r["time_s"] for r in rows[:-1]]
    took = [r["time_s"] - s for r, s in zip(rows, starts, strict=True)]
    paused = [k for k, t in enumerate(took) if t >= 0.7 + 0.2]
    assert len(paused) == 1, took
    k = paused[0]
    assert starts[k] >= at_s - slack_s and (k == 0 or starts[k - 1] < at_s + slack_s)


def _events(run_dir) -> list[str]:
    return [json.loads(x)["type"] for x in (run_dir / "events.jsonl").read_text().splitlines()]


def test_timed_speed_and_pause_in_simulate(tmp_path):
    simulate(build_plan(_cfg(tmp_path)), tmp_path / "sim")
    _check_speed(_rows(tmp_path / "sim", 1), 0.9, 0.0)
    _check_pause(_rows(tmp_path / "sim", 2), 1.4, 0.0)
    assert sorted(_events(tmp_path / "sim")) == ["pause", "speed"]


def test_timed_speed_and_pause_in_a_dsgd_run_as_in_simulate(tmp_path):
    """The same events in ``run``, short: DSGD (H = 1) on a ring of 3 with nominal steps of
    0.2 s. The workers take them on the run's wall-clock (within 0.05 s), and the losses are
    simulate's, to the bit."""
    cfg = _cfg(tmp_path, **{"workers": 3, "algo.name": "dsgd", "topology.name": "ring",
                            "algo.local_steps": 1, "run.rounds": 8, "compute.step_time_s": 0.2,
                            "model.preset": "tiny", "data.max_corpus_mb": 1.0,
                            "data.eval_batches": 1})
    run, sim = _run_and_simulate(tmp_path, cfg)
    _check_speed(_rows(tmp_path / "run", 1), 0.9, 0.05)
    _check_pause(_rows(tmp_path / "run", 2), 1.4, 0.05)
    assert sorted(_events(tmp_path / "run")) == ["pause", "speed"]
    assert _train_losses(tmp_path / "run") == _train_losses(tmp_path / "sim")
    assert run["final_eval_loss"] == sim["final_eval_loss"]


@pytest.mark.slow
def test_timed_speed_and_pause_in_run_as_in_simulate(tmp_path):
    """GASLoC, 4 workers, 8 rounds of 5 steps. Covered in the default suite by
    test_timed_speed_and_pause_in_a_dsgd_run_as_in_simulate (the same events in run)."""
    run, sim = _run_and_simulate(tmp_path, _cfg(tmp_path))
    _check_speed(_rows(tmp_path / "run", 1), 0.9, 0.05)
    _check_pause(_rows(tmp_path / "run", 2), 1.4, 0.05)
    assert sorted(_events(tmp_path / "run")) == ["pause", "speed"]
    assert _train_losses(tmp_path / "run") == _train_losses(tmp_path / "sim")
    assert run["final_eval_loss"] == sim["final_eval_loss"]
