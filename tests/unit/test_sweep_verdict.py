"""The sweep's "faster" verdict: an arm that misses the target on some seeds is not faster."""
from __future__ import annotations

from gasloc_emu.experiments import page, sweep


def row(arm, role, time_stat, seeds=3):
    return {"arm": arm, "group": "g", "role": role, "failed_runs": 0,
            "time_to_target_s": time_stat, "final_eval_loss": (2.7, 0.0, seeds),
            "runs": [f"{arm}-s{k}" for k in range(seeds)]}


def spec():
    return sweep.SweepSpec("t", "c", "simulate", (0, 1, 2), (), target_loss=2.8,
                           verdict="faster")


def test_a_candidate_that_missed_the_target_on_some_seeds_is_not_faster():
    rows = [row("cand", "candidate", (9.0, 0.0, 1)), row("base", "baseline", (9.5, 1.0, 3))]
    (judged,) = sweep.verdict(spec(), rows)["g"]
    assert judged["holds"] is False and judged["missed"] == 2
    line = page._verdict_line("g", judged, sweep._spec_dict(spec()))
    assert line == ("- g: cand (9.0 s) reaches the target sooner than base 9.5 s: **no** "
                    "(it missed the target on 2 of 3 seeds)")


def test_a_candidate_that_reached_it_on_every_seed_is_judged_on_its_mean():
    rows = [row("cand", "candidate", (9.0, 0.0, 3)), row("base", "baseline", (9.5, 1.0, 3))]
    (judged,) = sweep.verdict(spec(), rows)["g"]
    assert judged["holds"] is True
    assert page._verdict_line("g", judged, sweep._spec_dict(spec())).endswith("**yes**")
