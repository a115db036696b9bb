"""The compute model: profiles, step times, the budget rule, DiLoCo's weights, the display."""
from __future__ import annotations

import math

import pytest

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.training import compute
from gasloc_emu.training.compute import ComputeError, ComputeModel


def cfg(**dotted) -> C.Config:
    return C.resolve(overrides={"workers": 4} | dotted)


def test_named_profiles_are_the_configs_list():
    assert compute.NAMED == C.COMPUTE_PROFILES


def test_compute_errors_are_config_errors():
    # the CLI maps ConfigError to exit 2: a bad profile is bad input, not a failed run
    assert issubclass(ComputeError, C.ConfigError)


@pytest.mark.parametrize("profile, want", [
    ("", (1.0, 1.0, 1.0, 1.0)),
    ("uniform", (1.0, 1.0, 1.0, 1.0)),
    ("straggler", (1.0, 1.0, 1.0, 0.25)),
    ("two-speed", (1.0, 1.0, 0.25, 0.25)),
])
def test_named_profiles(profile, want):
    assert compute.speeds(cfg(**{"compute.profile": profile})) == want


def test_two_speed_with_an_odd_count_puts_the_larger_half_at_slow_speed():
    got = compute.speeds(cfg(workers=5, **{"compute.profile": "two-speed",
                                           "compute.slow_speed": 0.5}))
    assert got == (1.0, 1.0, 0.5, 0.5, 0.5)


def test_lognormal_is_seeded_and_its_fastest_worker_has_speed_1():
    a = compute.speeds(cfg(workers=8, seed=3, **{"compute.profile": "lognormal"}))
    b = compute.speeds(cfg(workers=8, seed=3, **{"compute.profile": "lognormal"}))
    c = compute.speeds(cfg(workers=8, seed=4, **{"compute.profile": "lognormal"}))
    assert a == b and a != c
    assert max(a) == 1.0 and all(0 < v <= 1 for v in a) and min(a) < 0.9
    flat = compute.speeds(cfg(workers=8, **{"compute.profile": "lognormal",
                                            "compute.sigma": 0.0}))
    assert flat == (1.0,) * 8


def test_a_profile_file_sets_defaults_and_workers(tmp_path):
    p = tmp_path / "speeds.toml"
    p.write_text("[default]\nspeed = 0.5\n\n[[worker]]\nid = 3\nspeed = 0.25\n\n"
                 "[[worker]]\nid = 0\nspeed = 1.0\n")
    assert compute.speeds(cfg(**{"compute.profile": str(p)})) == (1.0, 0.5, 0.5, 0.25)


@pytest.mark.parametrize("text, needle", [
    ("[default]\nrate = 1.0\n", "unknown key 'rate'; allowed: speed"),
    ("[[worker]]\nid = 4\nspeed = 0.5\n", "id = 4 is out of range; expected a worker in [0, 3]"),
    ("[[worker]]\nid = -1\nspeed = 0.5\n", "id = -1 is out of range"),
    ("[[worker]]\nid = 1\nspeed = 0.5\n[[worker]]\nid = 1\nspeed = 0.7\n", "listed twice"),
    ("[[worker]]\nid = 1\nspeed = 0.0\n",
     "speed = 0.0 is out of range; expected a value in (0, 1]"),
    ("[[worker]]\nid = 1\nspeed = 1.5\n", "speed = 1.5 is out of range"),
    ("[default]\nspeed = true\n", "[default] speed = True is out of range"),
    ("[[worker]]\nid = 1\n", "missing 'speed'"),
    ("[[worker]]\nspeed = 0.5\n", "missing 'id'"),
    ("workers = 3\n", "unknown key 'workers'"),
    ("worker = 3\n", "worker must be a list of tables"),
    ("[default\n", "cannot be parsed"),
])
def test_a_bad_profile_file_names_the_file_the_key_and_the_range(tmp_path, text, needle):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ComputeError) as info:
        compute.speeds(cfg(**{"compute.profile": str(p)}))
    assert needle in str(info.value) and "bad.toml" in str(info.value)


def test_unknown_profiles_and_missing_files_are_refused(tmp_path):
    with pytest.raises(ComputeError, match="not a profile; expected one of uniform"):
        compute.speeds(cfg(**{"compute.profile": "fast"}))
    with pytest.raises(ComputeError, match="does not exist"):
        compute.speeds(cfg(**{"compute.profile": str(tmp_path / "none.toml")}))


def test_step_time_is_nominal_or_measured_divided_by_speed():
    assert ComputeModel(0.05, 0.25).step_s(0.01) == pytest.approx(0.2)
    assert ComputeModel(0.0, 0.5).step_s(0.01) == pytest.approx(0.02)
    assert ComputeModel(0.0, 1.0).step_s(0.03) == 0.03
    assert ComputeModel(0.05).nominal and not ComputeModel(0.0).nominal


@pytest.mark.parametrize("step, speed, budget, steps", [
    (0.05, 1.0, 0.5, 10),   # the numbers: 10 and 2
    (0.05, 0.25, 0.5, 2),
    (0.05, 0.1, 0.5, 1),    # one step (0.5 s) exactly fills the budget
    (0.05, 0.05, 0.5, 1),   # one step overshoots it: at least one step anyway
    (0.1, 1.0, 0.3, 3),     # 0.1 + 0.1 + 0.1 = 0.30000000000000004: still fits
    (0.1, 1.0, 0.29, 2),
    (0.01, 1.0, 1.0, 100),
])
def test_steps_in_budget(step, speed, budget, steps):
    assert ComputeModel(step, speed, budget).steps_in_budget() == steps


def test_fits_is_the_budget_rule_with_a_small_tolerance():
    m = ComputeModel(0.0, 1.0, 0.5)
    assert m.fits(0.45, 0.05) and m.fits(0.45, 0.05 + 1e-12) and not m.fits(0.45, 0.0501)
    with pytest.raises(ComputeError, match="needs compute.step_time_s > 0"):
        m.steps_in_budget()


@pytest.mark.parametrize("kw, needle", [
    ({"speed": 0.0}, "speed = 0.0 is out of range; expected a value in (0, 1]"),
    ({"speed": 2.0}, "speed = 2.0"),
    ({"speed": math.nan}, "speed = nan"),
    ({"step_time_s": -1.0}, "step_time_s = -1.0 is out of range"),
    ({"inner_budget_s": math.inf}, "inner_budget_s = inf is out of range"),
])
def test_a_model_is_validated_at_construction(kw, needle):
    with pytest.raises(ComputeError) as info:
        ComputeModel(**kw)
    assert needle in str(info.value)


def cplan(c: C.Config) -> compute.ComputePlan:
    """The compute the run plan derives from ``c``."""
    return build_plan(c, data=False).compute


def profile_lines(c: C.Config) -> list[str]:
    return compute.profile_lines(c, cplan(c))


def test_step_counts_are_known_for_fixed_h_and_for_nominal_budgets():
    assert cplan(cfg(**{"algo.local_steps": [3, 4, 5, 6]})).step_counts() == (3, 4, 5, 6)
    budget = cfg(**{"compute.profile": "straggler", "compute.step_time_s": 0.05,
                    "compute.inner_budget_s": 0.5})
    assert cplan(budget).step_counts() == (10, 10, 10, 2)
    assert cplan(cfg(**{"compute.inner_budget_s": 0.5})).step_counts() is None


def test_diloco_weights_are_steps_over_their_mean():
    c = cfg(**{"algo.name": "diloco", "algo.pseudo_grad_mean": "steps",
               "compute.profile": "straggler", "compute.step_time_s": 0.05,
               "compute.inner_budget_s": 0.5})
    weights = [cplan(c).pseudo_grad_weight(r) for r in range(4)]
    assert weights == pytest.approx([4 * 10 / 32] * 3 + [4 * 2 / 32])
    assert sum(weights) == pytest.approx(4.0)
    plain = C.replace(c, **{"algo.pseudo_grad_mean": "plain"})
    assert [cplan(plain).pseudo_grad_weight(r) for r in range(4)] == [1.0] * 4


def test_weighting_by_measured_step_counts_is_refused_before_the_run():
    c = cfg(**{"algo.name": "diloco", "algo.pseudo_grad_mean": "steps",
               "compute.inner_budget_s": 0.5})
    with pytest.raises(ComputeError, match="needs compute.step_time_s > 0"):
        cplan(c)
    with pytest.raises(ComputeError, match="needs compute.step_time_s > 0"):
        cplan(c).pseudo_grad_weight(0)
    cplan(C.replace(c, **{"algo.name": "gasloc"}))  # gossip ignores the setting


def test_the_record_block():
    c = cfg(**{"compute.profile": "straggler", "compute.step_time_s": 0.05,
               "compute.inner_budget_s": 0.5})
    assert cplan(c).record([0, 0, 1, 0]) == {
        "profile": "straggler", "step_time_s": 0.05, "inner_budget_s": 0.5,
        "speeds": [1.0, 1.0, 1.0, 0.25], "steps_per_round": [10, 10, 10, 2],
        "overruns": [0, 0, 1, 0]}
    assert cplan(cfg()).record()["profile"] == "uniform"


def test_profile_lines_show_speed_step_time_and_steps():
    lines = profile_lines(cfg(**{"compute.profile": "straggler",
                                         "compute.step_time_s": 0.05,
                                         "compute.inner_budget_s": 0.5}))
    assert lines[0] == ("compute profile 'straggler', 4 workers, step time 0.05 s at speed 1, "
                        "budget 0.5 s per round")
    assert lines[1] == "worker   0: speed 1.000  step 0.05 s  10 steps per round"
    assert lines[4] == "worker   3: speed 0.250  step 0.2 s  2 steps per round"
    measured = profile_lines(cfg(**{"algo.local_steps": 7}))
    assert measured[0] == "compute profile 'uniform', 4 workers, step time as measured"
    assert measured[1] == "worker   0: speed 1.000  7 steps per round (H)"


# ---------------------------------------------------------------- the inner phase, on a fake clock

class FakeClock:
    """A clock that moves only when a step 'runs' (``work``) or the phase sleeps."""

    def __init__(self):
        self.now_s, self.slept = 100.0, []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds


def run_phase(model, real_steps_s, fixed_steps=0, pace=True):
    """Drive an InnerPhase with steps that take ``real_steps_s`` in turn (the last repeats)."""
    clock = FakeClock()
    phase = compute.InnerPhase(model, fixed_steps, clock, clock.sleep if pace else None)
    k = 0
    while phase.another():
        clock.now_s += real_steps_s[min(k, len(real_steps_s) - 1)]
        phase.step_done()
        k += 1
    return phase, clock


def test_a_fixed_h_phase_takes_h_steps_and_sleeps_each_to_its_nominal_time():
    phase, clock = run_phase(ComputeModel(0.05, 0.25), [0.01], fixed_steps=10)
    assert phase.steps == 10 and clock.slept == pytest.approx([0.19] * 10)
    assert phase.elapsed_s() == pytest.approx(2.0) and phase.emulated_s == pytest.approx(2.0)
    assert phase.overruns == 0 and phase.worst_ratio == pytest.approx(0.05)


def test_the_simulator_phase_never_sleeps_and_reports_the_emulated_time():
    phase, clock = run_phase(ComputeModel(0.05, 0.25), [0.01], fixed_steps=10, pace=False)
    assert clock.slept == [] and clock.now_s == pytest.approx(100.1)
    assert phase.elapsed_s() == pytest.approx(2.0)
    slow, _ = run_phase(ComputeModel(0.05), [0.08], fixed_steps=2, pace=False)
    assert slow.overruns == 0 and slow.worst_ratio == pytest.approx(1.6)  # headroom, not late


def test_a_budget_decides_the_steps_as_steps_in_budget_does():
    for speed, steps in ((1.0, 10), (0.25, 2)):
        model = ComputeModel(0.05, speed, 0.5)
        phase, _ = run_phase(model, [0.01], fixed_steps=99)
        assert phase.steps == steps == model.steps_in_budget()


def test_measured_budgets_predict_the_next_step_from_the_last():
    # speed 0.5: steps of 0.1, 0.1, 0.2 emulated seconds; after 0.4 s the next is predicted at
    # 0.2 s and would end at 0.6 > 0.5: three steps
    phase, clock = run_phase(ComputeModel(0.0, 0.5, 0.5), [0.05, 0.05, 0.1])
    assert phase.steps == 3 and phase.emulated_s == pytest.approx(0.4)
    assert clock.slept == pytest.approx([0.05, 0.05, 0.1])  # the speed's share of each step
    assert phase.overruns == 0 and phase.worst_ratio == 0.0  # measured steps never overrun


def test_a_slow_step_is_an_overrun_and_later_steps_catch_up():
    phase, clock = run_phase(ComputeModel(0.05), [0.08, 0.01, 0.01, 0.01], fixed_steps=4)
    assert phase.overruns == 1 and phase.worst_ratio == pytest.approx(1.6)
    # 0.03 s late after the first step: the second sleeps 0.01 instead of 0.04
    assert clock.slept == pytest.approx([0.01, 0.04, 0.04])
    assert phase.elapsed_s() == pytest.approx(0.2)


def test_a_phase_that_cannot_keep_up_is_late():
    phase, _ = run_phase(ComputeModel(0.05), [0.06], fixed_steps=4)
    assert phase.overruns == 4 and phase.elapsed_s() == pytest.approx(0.24)
    assert phase.emulated_s == pytest.approx(0.2)


def test_host_speed_needs_no_step_times():
    assert ComputeModel().at_host_speed
    assert not ComputeModel(speed=0.5).at_host_speed
    assert not ComputeModel(inner_budget_s=1.0).at_host_speed
    phase, clock = run_phase(ComputeModel(), [0.02], fixed_steps=3)
    assert phase.steps == 3 and clock.slept == []
    with pytest.raises(ComputeError, match="fixed_steps = -1"):
        compute.InnerPhase(ComputeModel(), -1, time_clock := FakeClock(), time_clock.sleep)


# ---------------------------------------------------------------- DiLoCo with unequal H_i

def diloco_round(drifts, weights):
    """One DiLoCo round (lr 1, mu 0) from theta0 = 0 over the in-memory transport, one thread
    per worker taking turns as in the simulator; every worker's new anchor."""
    import threading

    import torch

    from gasloc_emu.algorithms import DiLoCo
    from gasloc_emu.simulator.memory import Hub
    n = len(drifts)
    hub, out = Hub(n, timeout_s=60.0), {}

    def loop(rank: int) -> None:
        try:
            with hub.cond:
                algo = DiLoCo(rank, hub.transport(rank), 1.0, 0.0, weights[rank])
                theta = torch.zeros_like(drifts[rank])
                algo.begin(theta)
                theta.sub_(drifts[rank])  # the inner phase moved theta by -drift
                algo.outer_step(0, theta)
                out[rank] = theta.clone()
        except BaseException as exc:  # noqa: BLE001 - stop the other threads too
            hub.abort(exc)

    threads = [threading.Thread(target=loop, args=(r,), daemon=True) for r in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    if hub.error is not None:
        raise hub.error
    return [out[r] for r in range(n)]


def test_diloco_weighted_by_steps_is_the_step_weighted_mean_of_the_drifts():
    """The new anchor is -sum_i w_i/n * drift_i with w_i = n H_i / sum H: the mean of the drifts
    weighted by steps; w = 1 (plain) is the ordinary mean."""
    import torch
    n, steps = 4, [10, 10, 10, 2]
    g = torch.Generator().manual_seed(5)
    drifts = [torch.randn(24, generator=g, dtype=torch.float64) for _ in range(n)]
    for weights in ([1.0] * n, [n * h / sum(steps) for h in steps]):
        want = -sum(w * d for w, d in zip(weights, drifts, strict=True)) / n
        for got in diloco_round(drifts, weights):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    weighted = diloco_round(drifts, [n * h / sum(steps) for h in steps])[0]
    plain = diloco_round(drifts, [1.0] * n)[0]
    assert not torch.allclose(weighted, plain)


def test_diloco_refuses_a_weight_that_is_not_positive():
    from gasloc_emu.algorithms import DiLoCo
    with pytest.raises(ValueError, match="weight = 0.0 is out of range"):
        DiLoCo(0, None, 0.7, 0.9, 0.0)


def test_profile_lines_for_a_measured_budget_and_a_single_step():
    measured = profile_lines(cfg(**{"compute.inner_budget_s": 0.5}))
    assert measured[1] == "worker   0: speed 1.000  as many measured steps as fit per round"
    one = profile_lines(cfg(**{"compute.step_time_s": 0.5, "compute.inner_budget_s": 0.5}))
    assert one[1] == "worker   0: speed 1.000  step 0.5 s  1 step per round"
