"""Link plans from named and file profiles: shapes, seeding, validation, the simulator's link
model."""
from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu.config import NetConfig
from netem.profiles import (
    PAIR_PROFILES,
    Link,
    LinkPlan,
    ProfileError,
    WorkerCaps,
    build_link_plan,
    lognormal_worker_rates,
)


def plan_of(profile: str, workers: int = 8, seed: int = 0, **net) -> LinkPlan:
    return build_link_plan(NetConfig(bw_profile=profile, **net), workers, seed)


def rates(plan: LinkPlan) -> dict:
    return {k: link.rate_mbit for k, link in plan.links.items()}


def write(tmp_path, data: dict | str, suffix: str = ".toml") -> str:
    path = tmp_path / f"profile{suffix}"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# ---------------------------------------------------------------- named profiles

def test_uniform_has_every_directed_link_at_the_rate():
    plan = plan_of("uniform", 5, rate_mbit=20.0)
    assert len(plan.links) == 20 and set(rates(plan).values()) == {20.0}
    assert plan.shaped and plan.profile == "uniform"


def test_skewed_slows_about_ten_percent_of_pairs_in_both_directions():
    plan = plan_of("skewed", 8, rate_mbit=50.0, slow_rate_mbit=5.0)
    slow = {k for k, r in rates(plan).items() if r == 5.0}
    assert len(slow) == 2 * 3                        # 3 of 28 pairs, as in docs/ALGORITHM.md
    assert all((j, i) in slow for i, j in slow)
    assert plan_of("skewed", 4).note.count("-") == 1  # one of six pairs


def test_skewed_is_seeded():
    assert rates(plan_of("skewed", 8, seed=3)) == rates(plan_of("skewed", 8, seed=3))
    assert any(rates(plan_of("skewed", 8, seed=s)) != rates(plan_of("skewed", 8, seed=0))
               for s in range(1, 6))


def test_skewed_worker_slows_every_link_of_one_worker():
    plan = plan_of("skewed-worker", 6, seed=4, rate_mbit=50.0, slow_rate_mbit=2.0)
    slow = {k for k, r in rates(plan).items() if r == 2.0}
    worker = int(plan.note.split()[-1])
    assert slow == {(i, j) for i in range(6) for j in range(6) if i != j and worker in (i, j)}


def test_two_cluster_is_fast_inside_and_slow_between():
    plan = plan_of("two-cluster", 5, rate_mbit=40.0, slow_rate_mbit=4.0)
    for (i, j), r in rates(plan).items():
        assert r == (40.0 if (i < 3) == (j < 3) else 4.0)


def test_lognormal_link_rate_is_the_slower_endpoint():
    plan = plan_of("lognormal", 6, seed=7, rate_mbit=50.0)
    per_worker = lognormal_worker_rates(50.0, 6, 7)
    for (i, j), r in rates(plan).items():
        assert r == min(per_worker[i], per_worker[j])


def test_lognormal_median_is_the_configured_rate():
    draws = lognormal_worker_rates(50.0, 4001, 1)
    assert statistics.median(draws) == pytest.approx(50.0, rel=0.05)
    assert min(draws) > 0


def test_every_link_gets_the_runs_latency_jitter_and_loss():
    plan = plan_of("skewed", 4, latency_ms=12.0, jitter_ms=1.0, loss_pct=0.5)
    assert {(link.latency_ms, link.jitter_ms, link.loss_pct)
            for link in plan.links.values()} == {(12.0, 1.0, 0.5)}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(PAIR_PROFILES), st.integers(1, 12), st.integers(0, 10_000))
def test_named_profiles_cover_all_links_symmetrically(name, workers, seed):
    plan = plan_of(name, workers, seed)
    assert len(plan.links) == workers * (workers - 1)
    for (i, j), link in plan.links.items():
        assert link.rate_mbit > 0 and plan.links[(j, i)].rate_mbit == link.rate_mbit


# ---------------------------------------------------------------- empty and unknown

def test_empty_profile_is_an_unshaped_plan():
    plan = plan_of("", 4)
    assert not plan.shaped and plan.links == {}
    assert plan.link_model()(0, 1, 10**9) == (0.0, 0.0)


def test_latency_without_a_profile_is_refused():
    with pytest.raises(ProfileError, match="needs a bandwidth profile"):
        plan_of("", 4, latency_ms=10.0)


def test_unknown_profile_names_the_choices():
    with pytest.raises(ProfileError,
                       match="'fast' is not a profile; expected one of uniform, skewed"):
        plan_of("fast")


@pytest.mark.parametrize("workers", [0, -1, True, 2.0])
def test_bad_worker_counts(workers):
    with pytest.raises(ProfileError, match="workers"):
        build_link_plan(NetConfig(bw_profile="uniform"), workers, 0)


# ---------------------------------------------------------------- files

def test_toml_file_with_default_links_symmetric_and_workers(tmp_path):
    path = write(tmp_path, """
[default]
rate_mbit = 50
latency_ms = 2
[[link]]
src = 0
dst = 3
rate_mbit = 5
latency_ms = 30
symmetric = true
[[link]]
src = 1
dst = 2
rate_mbit = 10
[[worker]]
id = 2
up_mbit = 20
down_mbit = 25
""")
    plan = plan_of(path, 4)
    assert plan.links[(0, 3)] == Link(0, 3, 5, 30) and plan.links[(3, 0)] == Link(3, 0, 5, 30)
    assert plan.links[(1, 2)].rate_mbit == 10 and plan.links[(2, 1)].rate_mbit == 50
    assert plan.links[(0, 1)] == Link(0, 1, 50, 2)
    assert plan.cap(2) == WorkerCaps(20, 25) and plan.cap(1) == WorkerCaps()


def test_json_file_falls_back_to_the_runs_settings(tmp_path):
    path = write(tmp_path, {"link": [{"src": 1, "dst": 0, "rate_mbit": 7}]}, ".json")
    plan = plan_of(path, 3, rate_mbit=33.0, latency_ms=4.0)
    assert plan.links[(1, 0)] == Link(1, 0, 7, 4.0)
    assert plan.links[(0, 2)] == Link(0, 2, 33.0, 4.0)


BAD = {
    "worker id >= N": ({"link": [{"src": 0, "dst": 4}]},
                       "dst = 4 is out of range; this run has workers 0..3"),
    "src == dst": ({"link": [{"src": 1, "dst": 1}]}, "src and dst are both worker 1"),
    "zero rate": ({"link": [{"src": 0, "dst": 1, "rate_mbit": 0}]},
                  r"rate_mbit = 0 is out of range; expected a value in \(0"),
    "negative default": ({"default": {"rate_mbit": -5}},
                         r"\[default\] rate_mbit = -5 is out of range"),
    "latency too big": ({"link": [{"src": 0, "dst": 1, "latency_ms": 10001}]},
                        r"latency_ms = 10001 is out of range; expected a value in \[0, 10000\]"),
    "loss too big": ({"default": {"loss_pct": 101}}, "loss_pct = 101 is out of range"),
    "unknown link key": ({"link": [{"src": 0, "dst": 1, "bw": 5}]}, "unknown key 'bw'"),
    "unknown top key": ({"links": []}, "unknown key 'links'"),
    "unknown default key": ({"default": {"rate": 5}}, "unknown key 'rate'"),
    "string rate": ({"link": [{"src": 0, "dst": 1, "rate_mbit": "5"}]},
                    "rate_mbit = '5' is not a number"),
    "bool id": ({"worker": [{"id": True}]}, "is not a worker id"),
    "missing dst": ({"link": [{"src": 0}]}, "missing 'dst'"),
    "twice": ({"link": [{"src": 0, "dst": 1}, {"src": 1, "dst": 0, "symmetric": True}]},
              "link 0->1 is set twice"),
    "worker twice": ({"worker": [{"id": 1, "up_mbit": 5}, {"id": 1}]}, "worker 1 is listed twice"),
    "zero cap": ({"worker": [{"id": 1, "down_mbit": 0}]}, "down_mbit = 0 is out of range"),
    "link not a list": ({"link": {"src": 0, "dst": 1}}, r"link must be a list of tables"),
    "symmetric not bool": ({"link": [{"src": 0, "dst": 1, "symmetric": 1}]},
                           "symmetric = 1 is not true or false"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_fail_with_one_clear_line(tmp_path, case):
    data, message = BAD[case]
    with pytest.raises(ProfileError, match=message) as info:
        plan_of(write(tmp_path, data, ".json"), 4)
    assert "\n" not in str(info.value)


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        plan_of(str(tmp_path / "nope.toml"))
    with pytest.raises(ProfileError, match="cannot be parsed"):
        plan_of(write(tmp_path, "[default\nrate_mbit = 5"), 4)


def test_links_and_caps_validate_themselves():
    with pytest.raises(ProfileError, match="src and dst are the same"):
        Link(1, 1, 5.0)
    with pytest.raises(ProfileError, match="jitter_ms"):
        Link(0, 1, 5.0, jitter_ms=-1)
    with pytest.raises(ProfileError, match="up_mbit"):
        WorkerCaps(up_mbit=0)
    with pytest.raises(ProfileError, match="leaves links without a rate"):
        LinkPlan(3, {(0, 1): Link(0, 1, 5.0)}, {}, "partial")


# ---------------------------------------------------------------- link model, table, describe

def test_link_model_wire_time_and_latency():
    model = plan_of("uniform", 3, rate_mbit=8.0, latency_ms=25.0).link_model()
    wire_s, latency_s = model(0, 2, 1_000_000)
    assert wire_s == pytest.approx(1.0) and latency_s == pytest.approx(0.025)


def test_link_model_takes_the_tightest_cap(tmp_path):
    path = write(tmp_path, {"default": {"rate_mbit": 80},
                            "worker": [{"id": 0, "up_mbit": 40}, {"id": 2, "down_mbit": 8}]},
                 ".json")
    plan = plan_of(path, 3)
    model = plan.link_model()
    assert model(0, 1, 10**6)[0] == pytest.approx(0.2)      # 40 Mbit/s uplink of 0
    assert model(0, 2, 10**6)[0] == pytest.approx(1.0)      # 8 Mbit/s downlink of 2
    assert model(1, 0, 10**6)[0] == pytest.approx(0.1)      # the link itself
    assert plan.effective_rate_mbit(0, 2) == 8


def test_table_and_describe_are_json_able():
    plan = plan_of("skewed", 4, latency_ms=3.0)
    rows = plan.table()
    assert len(rows) == 12 and rows[0]["src"] == 0 and rows[0]["dst"] == 1
    assert set(rows[0]) == {"src", "dst", "rate_mbit", "effective_mbit", "latency_ms", "jitter_ms",
                            "loss_pct"}
    back = json.loads(json.dumps(plan.describe()))
    assert back["profile"] == "skewed" and back["note"].startswith("slow pairs")
