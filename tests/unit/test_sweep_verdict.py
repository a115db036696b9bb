"""The statistics of the results page and the verdicts built on them: sample standard
deviations, Student-t intervals, and paired differences over seeds."""
from __future__ import annotations

import math
import statistics

import pytest

from gasloc_emu.experiments import page, stats, sweep
from gasloc_emu.experiments.spec import spec_dict


def test_sample_uses_n_minus_1_and_the_t_quantile():
    s = stats.sample([1.0, 2.0, 4.0, None, math.nan, math.inf])
    assert s.n == 3 and s.mean == pytest.approx(7 / 3)
    assert s.sd == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))   # not pstdev
    assert s.half == pytest.approx(4.303 * s.sd / math.sqrt(3))
    assert stats.sample([2.0]) == stats.Sample(2.0, None, None, 1)
    assert stats.sample([]) == stats.Sample(None, None, None, 0)
    assert stats.t975(1) == 12.706 and stats.t975(200) == 1.96
    with pytest.raises(ValueError, match="df = 0"):
        stats.t975(0)


def test_paired_differences_remove_what_the_seed_does():
    """The seeds move both arms alike: unpaired, the intervals overlap; paired, the candidate
    is lower on every seed by 0.01 +- 0.001 and the interval excludes zero."""
    cand = {0: 2.40, 1: 2.60, 2: 2.80}
    base = {0: 2.411, 1: 2.609, 2: 2.81}
    assert stats.direction(stats.paired(cand, base)) == "lower"
    assert stats.direction(stats.paired(base, cand)) == "higher"
    assert stats.direction(stats.paired({0: 1.0, 1: 2.0}, {0: 1.5, 1: 1.6})) == "tie"
    assert stats.direction(stats.paired({0: 1.0}, {0: 2.0})) == "one seed"
    assert stats.paired({0: 1.0, 1: 2.0}, {1: 1.0, 2: 3.0}).n == 1   # only seeds both ran


def _row(arm, role, per_seed: dict, key="final_eval_loss"):
    return {"arm": arm, "group": "g", "role": role, "failed_runs": 0, "seeds": list(per_seed),
            key: sweep._stat(per_seed.values()), "per_seed": {key: per_seed}}


def _spec(rule: str):
    return sweep.SweepSpec("t", "c", "simulate", (0, 1, 2), (), target_loss=2.8, verdict=rule)


def test_beats_needs_every_paired_interval_below_zero():
    cand = _row("cand", "candidate", {0: 2.40, 1: 2.60, 2: 2.80})
    clear = _row("a", "baseline", {0: 2.411, 1: 2.609, 2: 2.81})
    noisy = _row("b", "baseline", {0: 2.30, 1: 2.70, 2: 2.90})
    (judged,) = sweep.verdict(_spec("beats"), [cand, clear])["g"]
    assert judged["holds"] == "yes"
    (judged,) = sweep.verdict(_spec("beats"), [cand, clear, noisy])["g"]
    assert judged["holds"] == "tie"
    line = page._verdict_line("g", judged, spec_dict(_spec("beats")))
    assert line.startswith("- g: cand (2.6000) lower final eval loss than a 2.6100, "
                           "difference -0.0100 [-0.0125, -0.0075] over 3 seeds; b 2.6333")
    assert line.endswith("under two standard deviations: **tie**")


def test_a_candidate_that_missed_the_target_on_some_seeds_is_not_faster():
    key = "time_to_target_s"
    cand = _row("cand", "candidate", {0: 9.0, 1: None, 2: None}, key)
    base = _row("base", "baseline", {0: 9.5, 1: 9.0, 2: 10.0}, key)
    (judged,) = sweep.verdict(_spec("faster"), [cand, base])["g"]
    assert judged["holds"] == "no" and judged["missed"] == 2
    line = page._verdict_line("g", judged, spec_dict(_spec("faster")))
    assert line == ("- g: cand (9.0 s) reaches the target sooner than base 9.5 s, difference "
                    "-0.5 s no interval over 1 seeds: **no** (it missed the target on 2 of 3 "
                    "seeds)")


def test_a_baseline_that_never_reached_the_target_is_slower():
    key = "time_to_target_s"
    cand = _row("cand", "candidate", {0: 9.0, 1: 9.2, 2: 9.1}, key)
    base = _row("base", "baseline", {0: None, 1: None, 2: None}, key)
    (judged,) = sweep.verdict(_spec("faster"), [cand, base])["g"]
    assert judged["holds"] == "yes"
    assert "base never (never reached): **yes**" in page._verdict_line(
        "g", judged, spec_dict(_spec("faster")))


def test_competitive_compares_the_relative_difference_with_the_tolerance():
    cand = _row("cand", "candidate", {0: 2.51, 1: 2.61, 2: 2.71})   # 0.4 % above
    base = _row("base", "baseline", {0: 2.50, 1: 2.60, 2: 2.70})
    (judged,) = sweep.verdict(_spec("competitive"), [cand, base])["g"]
    assert judged["holds"] == "yes"
    worse = _row("cand", "candidate", {0: 2.60, 1: 2.70, 2: 2.80})  # 3.5 % above
    (judged,) = sweep.verdict(_spec("competitive"), [worse, base])["g"]
    assert judged["holds"] == "no"


class _StubRunner:
    """Makes a 'run' by returning a row whose loss is given per (arm, seed)."""

    def __init__(self, spec, losses):
        self.spec, self.losses, self.made = spec, losses, []
        self.log = lambda *_: None

    def rows(self, requests):
        return [self.row(*r) for r in requests]

    def row(self, arm, phase, seed, point):
        self.made.append((arm.name, seed))
        return {"arm": arm.name, "phase": phase, "seed": seed, "point": list(point),
                "status": "ok", "final_eval_loss": self.losses[arm.name](seed), "curve": []}


def _results(spec, runner):
    out = []
    for arm in spec.arms:
        res = sweep.ArmResult(arm, best=())
        res.runs = [runner.row(arm, "report", s, ()) for s in spec.seeds]
        out.append(res)
    return out


@pytest.mark.parametrize("gap, more", [(0.05, False), (0.0005, True)])
def test_a_close_verdict_gets_more_seeds_for_every_arm_of_its_group(gap, more):
    """Seed noise of about 0.01: a gap of 0.05 is clear on 3 seeds, one of 0.0005 is not."""
    arms = (sweep.Arm("c", {}, "g", "candidate"), sweep.Arm("b", {}, "g", "baseline"))
    spec = sweep.SweepSpec("t", "c", "simulate", (0, 1, 2), arms, close_seeds=5)
    noise = {0: 0.01, 1: -0.008, 2: 0.002, 3: -0.011, 4: 0.004}
    runner = _StubRunner(spec, {"c": lambda s: 2.5 + (s - 1) / 500,
                                "b": lambda s: 2.5 + gap + noise[s]})
    results = _results(spec, runner)
    sweep._more_seeds_where_close(runner, results)
    seeds = [[r["seed"] for r in res.runs] for res in results]
    assert seeds == ([[0, 1, 2, 3, 4]] * 2 if more else [[0, 1, 2]] * 2)


def test_a_sweep_reuses_runs_that_ended_by_themselves_and_reruns_failed_ones(tmp_path):
    """A run a timeout, a kill or a full disk ended says nothing about its settings: resuming
    runs it again (its folder and its kept row are not taken); ok and diverged runs are kept."""
    import json

    from gasloc_emu.experiments import data
    for status, reused in (("ok", True), ("diverged", True), ("failed", False),
                           ("stopped", False), ("error", False)):
        run = tmp_path / status
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"status": status}))
        assert data.finished_record(run) is reused, status
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "summary.json").write_text('{"status": "o')   # cut short by a kill
    assert not data.finished_record(tmp_path / "cut") and not data.finished_record(tmp_path)
    kept = data.KeptRows(tmp_path / "kept.jsonl")
    for tag, status in (("a", "ok"), ("b", "failed"), ("c", "diverged")):
        kept.add(tag, "tune", "sha", {"status": status})
    again = data.KeptRows(tmp_path / "kept.jsonl")
    assert [again.get(t, "tune", "sha") is not None for t in "abc"] == [True, False, True]
