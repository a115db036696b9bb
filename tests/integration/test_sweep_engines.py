"""A sweep on submitit's local executor (each run a job, a process of its own): the records and
the report the local engine makes, finished runs reused without a job, and a failed job named
with its point and its log."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import submitit  # noqa: F401  (the test extra has it: missing is an error, not a skip)

from gasloc_emu import config as C
from gasloc_emu.experiments import data, engines, sweep

pytestmark = pytest.mark.integration

# two workers, two rounds, nominal step times (the clock is the compute model's, not this busy
# host's); the arm "bad" reads a corpus that does not exist, which only its run finds out
TINY = """
seed = 0
workers = 2
[model]
preset = "tiny"
[algo]
name = "diloco"
local_steps = 1
[data]
max_corpus_mb = 1.0
[compute]
step_time_s = 0.01
[run]
rounds = 2
[sweep]
title = "tiny"
seeds = [0, 1]
[[sweep.arm]]
name = "d"
[[sweep.arm]]
name = "bad"
set = { "data.path" = "/no/such/corpus.txt" }
"""


def _submitit(out: Path) -> engines.SubmititEngine:
    cfg = C.resolve_engine({"engine.name": "submitit", "engine.cluster": "local",
                            "engine.time_limit_min": 10})
    return engines.make_engine(cfg, out)


def _rows(out: Path) -> dict:
    """The data file's rows by (arm, phase, seed), without how long each run took."""
    _, rows = data.read(out / "data.jsonl")
    return {(r["arm"], r["phase"], r["seed"]): {k: v for k, v in r.items() if k != "run_wall_s"}
            for r in rows}


def test_jobs_make_the_local_engines_records_name_failures_and_are_not_resubmitted(
        tmp_path, monkeypatch):
    """One array of four jobs: the two of "bad" fail, each named with its point and its log,
    and the two of "d" finish; the next call reuses those without a job, and the report is
    the local engine's to the bit."""
    monkeypatch.setattr(sweep, "plot_sweep", lambda *_: None)   # plots are not compared
    preset = tmp_path / "tiny.toml"
    preset.write_text(TINY)
    out, said = tmp_path / "jobs", []
    engine = _submitit(out)
    with pytest.raises(engines.EngineError) as caught:
        sweep.run_sweep(preset, out, log=said.append, engine=engine)
    assert engine.submitted == 4 and sum("runs submitted as jobs" in s for s in said) == 1
    assert len(caught.value.failures) == 2
    for seed, line in enumerate(caught.value.failures):
        assert line.startswith(f"{out / f'bad-s{seed}'} (simulate): job ") and "DataError" in line
        log = Path(line.split("; log: ")[1])
        assert log.parent == out / "engine-logs" and "/no/such/corpus.txt" in log.read_text()
    for seed in (0, 1):   # the other jobs of the array finished, and stay
        assert json.loads((out / f"d-s{seed}" / "summary.json").read_text())["status"] == "ok"
    stamps = {d.name: (d / "metrics.jsonl").stat().st_mtime_ns for d in out.glob("d-*")}
    job_files = sorted(p.name for p in (out / "engine-logs").iterdir())

    again = _submitit(out)   # a second call, as a new command would make it
    report = sweep.run_sweep(preset, out, log=lambda *_: None, arms=("d",), engine=again)
    assert again.submitted == 0
    assert sorted(p.name for p in (out / "engine-logs").iterdir()) == job_files
    assert {d.name: (d / "metrics.jsonl").stat().st_mtime_ns for d in out.glob("d-*")} == stamps

    local = sweep.run_sweep(preset, tmp_path / "local", log=lambda *_: None, arms=("d",))
    # the same runs, to the bit: losses, curves, clocks; the same records
    assert report["rows"] == local["rows"]
    assert _rows(out) == _rows(tmp_path / "local") and len(_rows(out)) == 2
    for run in ("d-s0", "d-s1"):
        assert (out / run / "config.toml").read_text() == \
            (tmp_path / "local" / run / "config.toml").read_text()
