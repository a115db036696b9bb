"""Random faults (``scenario.faults``): the section checked when made, the draw the same for a
seed on any machine, its statistics those of the distributions asked for, the placement's
rules, the record's round trip, and the scenario file's ``[faults]`` section."""
from __future__ import annotations

import itertools
import json
import math
import statistics
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu.report.records import RECORD_FILES
from gasloc_emu.scenario.events import (
    JoinEvent,
    LeaveEvent,
    PartitionEvent,
    PauseEvent,
    ScenarioError,
    SpeedEvent,
)
from gasloc_emu.scenario.faults import (
    FAULTS_FILE,
    Fault,
    FaultSource,
    FaultSpec,
    FaultTimeline,
    draw,
    place,
    read_recorded,
    spec_from_table,
    timeline,
    uniform,
)
from gasloc_emu.scenario.load import load_scenario

PINNED_SPEC = FaultSpec(seed=42, horizon_s=20.0, sources=(
    FaultSource(kind="crash", mtbf_s=10.0, duration_median_s=2.0),
    FaultSource(kind="slow", mtbf_s=8.0, distribution="weibull", weibull_shape=1.5,
                duration_median_s=1.0, duration_sigma=0.8, speed=0.25, workers=(2,))))


def test_the_generator_and_a_timeline_are_pinned_to_the_bit():
    """What any machine must draw for these seeds: a change of generator, transform or
    rounding shows here."""
    assert uniform(1, "crash#0/0", 0).hex() == "0x1.aff8078d9700ap-3"
    assert uniform(2 ** 63, "s", 7).hex() == "0x1.6321c3e874fc8p-1"
    got = [(f.kind, f.target, f.at_s, f.duration_s) for f in draw(PINNED_SPEC, 3)]
    assert got == [("crash", (2,), 0.366, 1.015), ("crash", (1,), 1.796, 2.354),
                   ("crash", (0,), 10.394, 2.633), ("slow", (2,), 11.256, 1.165),
                   ("slow", (2,), 14.733, 0.771), ("crash", (1,), 15.955, 2.417)]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 64), workers=st.integers(2, 6))
def test_the_same_seed_draws_the_same_timeline(seed, workers):
    spec = FaultSpec(seed=seed, horizon_s=30.0, sources=(
        FaultSource(kind="crash", mtbf_s=20.0, duration_median_s=1.0),
        FaultSource(kind="hang", mtbf_s=5.0, duration_median_s=0.2),
        FaultSource(kind="link_flap", mtbf_s=15.0, duration_median_s=0.5)))
    a, b = timeline(spec, workers), timeline(spec, workers)
    assert a == b and a.to_json() == b.to_json()
    for f in a.faults:   # on the grid, inside the horizon, in time order
        assert 0.0 <= f.at_s < 30.0 and f.at_s == round(f.at_s, 3)
    assert [f.at_s for f in a.faults] == sorted(f.at_s for f in a.faults)


def test_another_seed_or_stream_draws_otherwise_and_streams_are_independent():
    one = FaultSpec(seed=1, horizon_s=50.0, sources=(
        FaultSource(kind="hang", mtbf_s=5.0, duration_median_s=0.2),))
    two = FaultSpec(seed=2, horizon_s=50.0, sources=one.sources)
    assert draw(one, 3) != draw(two, 3)
    # a fourth worker adds its faults and leaves the others' as they were
    assert [f for f in draw(one, 4) if f.target != (3,)] == draw(one, 3)


def _ttfs(source: FaultSource, n: int) -> list[float]:
    return [source.time_to_failure_s(uniform(7, "stats", k)) for k in range(n)]


@pytest.mark.parametrize("distribution,shape,tol", [("exponential", 1.0, 0.07),
                                                    ("weibull", 0.7, 0.10),
                                                    ("weibull", 2.5, 0.04)])
def test_the_time_to_failure_has_the_mtbf_as_its_mean(distribution, shape, tol):
    """4000 draws: the sample mean within ~4 standard errors of mtbf_s (the exponential's
    coefficient of variation is 1, Weibull k = 0.7's 1.46, k = 2.5's 0.44)."""
    source = FaultSource(kind="crash", mtbf_s=12.0, distribution=distribution,
                         weibull_shape=shape)
    ttf = _ttfs(source, 4000)
    assert statistics.fmean(ttf) == pytest.approx(12.0, rel=tol)
    assert min(ttf) > 0.0


def test_the_weibull_shape_changes_the_spread_not_the_mean():
    wide = _ttfs(FaultSource(kind="crash", mtbf_s=5.0, distribution="weibull",
                             weibull_shape=0.7), 4000)
    narrow = _ttfs(FaultSource(kind="crash", mtbf_s=5.0, distribution="weibull",
                               weibull_shape=4.0), 4000)
    assert statistics.stdev(wide) > 3 * statistics.stdev(narrow)


def test_durations_have_the_median_and_the_log_sigma_asked_for():
    source = FaultSource(kind="hang", mtbf_s=1.0, duration_median_s=0.4, duration_sigma=0.6)
    d = [source.duration_s(uniform(3, "d", k)) for k in range(4000)]
    assert statistics.median(d) == pytest.approx(0.4, rel=0.05)
    assert statistics.stdev(math.log(x) for x in d) == pytest.approx(0.6, rel=0.05)


def test_a_renewal_counts_from_the_end_of_the_last_fault():
    """Over a long horizon the number of faults is horizon / (mean up time + mean down time)
    (the renewal theorem); a lognormal's mean is median * exp(sigma^2 / 2)."""
    spec = FaultSpec(seed=5, horizon_s=4000.0, sources=(
        FaultSource(kind="hang", mtbf_s=3.0, duration_median_s=1.0, duration_sigma=0.5,
                    workers=(0,)),))
    n = len(draw(spec, 1))
    assert n == pytest.approx(4000.0 / (3.0 + math.exp(0.125)), rel=0.06)
    faults = draw(spec, 1)
    assert all(b.at_s >= a.end_s for a, b in itertools.pairwise(faults))


@pytest.mark.parametrize("kwargs,message", [
    ({"kind": "meteor", "mtbf_s": 1.0}, "kind = 'meteor' is not a fault kind"),
    ({"kind": "crash", "mtbf_s": 0.0}, "mtbf_s = 0.0 is out of range; expected a finite "
                                       "value > 0"),
    ({"kind": "crash", "mtbf_s": 1.0, "distribution": "gamma"}, "distribution = 'gamma'"),
    ({"kind": "crash", "mtbf_s": 1.0, "distribution": "weibull", "weibull_shape": 50},
     "weibull_shape = 50 is out of range; expected a value in [0.1, 20]"),
    ({"kind": "crash", "mtbf_s": 1.0, "weibull_shape": 2.0}, "goes with distribution"),
    ({"kind": "hang", "mtbf_s": 1.0}, "needs duration_median_s"),
    ({"kind": "hang", "mtbf_s": 1.0, "duration_median_s": 1.0, "duration_sigma": -1},
     "duration_sigma = -1 is out of range; expected a value in [0, 5]"),
    ({"kind": "slow", "mtbf_s": 1.0, "duration_median_s": 1.0}, "needs speed"),
    ({"kind": "slow", "mtbf_s": 1.0, "duration_median_s": 1.0, "speed": 1.5},
     "speed = 1.5 is out of range"),
    ({"kind": "hang", "mtbf_s": 1.0, "duration_median_s": 1.0, "links": [[0, 1]]},
     "links does not go with a hang fault"),
    ({"kind": "partition", "mtbf_s": 1.0, "duration_median_s": 1.0}, "needs workers"),
    ({"kind": "host", "mtbf_s": 1.0}, "needs hosts"),
    ({"kind": "crash", "mtbf_s": 1.0, "workers": [1, 1]}, "names a worker twice"),
    ({"kind": "crash", "mtbf_s": 1.0, "duration_median_s": 1.0, "restart_from": "disk"},
     "restart_from = 'disk' is not allowed; expected one of peer, checkpoint"),
    ({"kind": "crash", "mtbf_s": 1.0, "restart_from": "checkpoint"},
     "goes with a crash or host fault that has a duration"),
    ({"kind": "hang", "mtbf_s": 1.0, "duration_median_s": 1.0, "restart_from": "checkpoint"},
     "goes with a crash or host fault that has a duration"),
])
def test_a_bad_source_is_refused_naming_the_value_and_the_range(kwargs, message):
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("(", r"\(")):
        FaultSource(**kwargs)


def test_the_section_is_checked_as_a_table():
    with pytest.raises(ScenarioError, match="faults: missing 'seed'"):
        spec_from_table({"horizon_s": 1.0})
    with pytest.raises(ScenarioError, match="faults: unknown key 'crashes'"):
        spec_from_table({"seed": 1, "horizon_s": 1.0, "crashes": []})
    with pytest.raises(ScenarioError, match=r"faults.hang #1: unknown key 'mtbf'"):
        spec_from_table({"seed": 1, "horizon_s": 1.0, "hang": [{"mtbf": 1.0}]})
    with pytest.raises(ScenarioError, match="faults: horizon_s = -1 is out of range"):
        spec_from_table({"seed": 1, "horizon_s": -1})
    spec = FaultSpec(seed=1, horizon_s=5.0, sources=(
        FaultSource(kind="crash", mtbf_s=1.0, workers=(7,)),))
    with pytest.raises(ScenarioError, match=r"worker 7 is not a worker of this run \(ids 0..3"):
        draw(spec, 4)


# ---------------------------------------------------------------- placing

def _f(kind, target, at_s, duration_s, source=0):
    return Fault(kind, source, tuple(target), at_s, duration_s)


SOURCES = (FaultSource(kind="crash", mtbf_s=1.0),
           FaultSource(kind="slow", mtbf_s=1.0, duration_median_s=1.0, speed=0.5))


def test_each_kind_becomes_the_scenario_events_it_stands_for():
    faults = [_f("crash", [1], 1.0, 2.0), _f("hang", [0], 1.5, 0.3),
              _f("slow", [2], 2.0, 1.0, source=1), _f("link_flap", [0, 2], 4.0, 0.5),
              _f("partition", [0], 5.0, 1.0), _f("host", [2, 3], 7.0, None)]
    placed, events = place(faults, SOURCES, 4)
    assert [f.outcome for f in placed] == ["played"] * 6
    assert events == [
        LeaveEvent(worker=1, at_s=1.0), PauseEvent(worker=0, seconds=0.3, at_s=1.5),
        SpeedEvent(worker=2, speed=0.5, at_s=2.0), JoinEvent(worker=1, at_s=3.0),
        SpeedEvent(worker=2, speed=1.0, at_s=3.0),
        PartitionEvent(groups=((0,), (2,)), at_s=4.0, end_s=4.5),
        PartitionEvent(groups=((0,), (1, 2, 3)), at_s=5.0, end_s=6.0),
        LeaveEvent(worker=2, at_s=7.0), LeaveEvent(worker=3, at_s=7.0)]


def test_a_fault_that_cannot_happen_is_kept_with_its_reason():
    faults = [_f("crash", [0], 1.0, None), _f("crash", [1], 2.0, None),
              _f("crash", [2], 2.5, None), _f("hang", [0], 3.0, 0.5),
              _f("hang", [1], 1.5, 1.0), _f("link_flap", [1, 2], 0.2, 1.0),
              _f("partition", [2], 0.5, 0.2), _f("hang", [2], 0.1, 1.0),
              _f("hang", [2], 0.5, 1.0)]
    placed, events = place(faults, SOURCES, 3)
    assert [f.outcome for f in placed] == [
        "played", "played", "last_worker", "down", "down", "played", "cut_busy", "played",
        "overlap"]
    assert LeaveEvent(worker=2, at_s=2.5) not in events
    counts = FaultTimeline(FaultSpec(seed=0, horizon_s=9.0), tuple(placed), tuple(events)).counts
    assert counts["crash"] == {"played": 2, "last_worker": 1}
    assert counts["hang"] == {"down": 2, "played": 1, "overlap": 1}


def test_a_lost_host_takes_its_living_workers_and_brings_back_only_those():
    faults = [_f("crash", [1], 1.0, None), _f("host", [0, 1], 2.0, 1.0)]
    _, events = place(faults, SOURCES, 3)
    assert events == [LeaveEvent(worker=1, at_s=1.0), LeaveEvent(worker=0, at_s=2.0),
                      JoinEvent(worker=0, at_s=3.0)]


def test_restarts_come_from_a_peer_or_from_the_checkpoint_as_each_source_says():
    sources = (FaultSource(kind="crash", mtbf_s=1.0, duration_median_s=1.0),
               FaultSource(kind="host", mtbf_s=1.0, duration_median_s=1.0, hosts=((2, 3),),
                           restart_from="checkpoint"))
    faults = [_f("crash", [1], 1.0, 2.0), _f("host", [2, 3], 2.0, 2.0, source=1)]
    _, events = place(faults, sources, 4)
    assert [(ev.worker, ev.at_s, ev.from_checkpoint) for ev in events
            if isinstance(ev, JoinEvent)] == [(1, 3.0, False), (2, 4.0, True), (3, 4.0, True)]


def test_the_scenarios_own_leaves_and_cuts_count():
    fixed = (LeaveEvent(worker=0, at_s=1.0),
             PartitionEvent(groups=((1,), (2,)), at_s=4.0, end_s=6.0))
    placed, _ = place([_f("hang", [0], 2.0, 0.1), _f("link_flap", [1, 2], 5.0, 2.0)],
                      SOURCES, 3, fixed)
    assert [f.outcome for f in placed] == ["down", "cut_busy"]


# ---------------------------------------------------------------- the record and the file

def test_the_timeline_reads_back_from_its_record(tmp_path):
    tl = timeline(PINNED_SPEC, 3)
    (tmp_path / "faults.json").write_text(json.dumps(tl.to_json()))
    assert read_recorded(tmp_path) == tl
    assert tl.file == FAULTS_FILE and FAULTS_FILE in RECORD_FILES   # --overwrite clears it
    assert read_recorded(tmp_path / "nothing") is None
    (tmp_path / "faults.json").write_text(json.dumps(tl.to_json() | {"version": 9}))
    with pytest.raises(ScenarioError, match="version 9 is not 1"):
        read_recorded(tmp_path)


SECTION = """
[[event]]
type = "leave"
worker = 3
at_s = 50.0

[faults]
seed = 9
horizon_s = 40.0

[[faults.crash]]
mtbf_s = 15.0
workers = [1, 2]
duration_median_s = 2.0

[[faults.hang]]
mtbf_s = 10.0
duration_median_s = 0.5
"""


def test_a_scenario_file_draws_its_section_after_its_own_events(tmp_path):
    (tmp_path / "s.toml").write_text(SECTION)
    sc = load_scenario(tmp_path / "s.toml", 4, 100)
    assert sc.faults is not None and sc.faults.events
    assert sc.events[0] == LeaveEvent(worker=3, at_s=50.0)
    assert sc.events[1:] == sc.faults.events
    assert load_scenario(tmp_path / "s.toml", 4, 100) == sc


def test_a_recorded_timeline_is_played_not_drawn_again(tmp_path):
    (tmp_path / "s.toml").write_text(SECTION)
    recorded = load_scenario(tmp_path / "s.toml", 4, 100).faults
    (tmp_path / "s.toml").write_text(SECTION.replace("seed = 9", "seed = 10"))
    assert load_scenario(tmp_path / "s.toml", 4, 100).faults != recorded
    assert load_scenario(tmp_path / "s.toml", 4, 100, recorded).faults == recorded


def test_a_bad_section_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "s.toml").write_text(SECTION.replace("mtbf_s = 10.0", "mtbf_s = -3"))
    with pytest.raises(ScenarioError, match=r"^scenario s.toml: faults.hang #1: mtbf_s = -3 is "
                                            r"out of range; expected a finite value > 0$"):
        load_scenario(tmp_path / "s.toml", 4, 100)


def test_the_examples_of_the_docstring_and_the_docs_load(tmp_path):
    from pathlib import Path

    from gasloc_emu.scenario import load
    doc = load.__doc__.split("::\n\n    [faults]", 1)[1].split("\n\nA ``type``", 1)[0]
    (tmp_path / "d.toml").write_text(textwrap.dedent("    [faults]" + doc))
    sc = load_scenario(tmp_path / "d.toml", 4, 100)
    assert sc.faults.spec.sources[0].weibull_shape == 1.5 and sc.faults.events
    page = (Path(__file__).resolve().parents[2] / "docs" / "NETWORK.md").read_text()
    worked = page.split("A worked example", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "w.toml").write_text(worked)
    sc = load_scenario(tmp_path / "w.toml", 4, 12)
    assert {s.kind for s in sc.faults.spec.sources} == {"crash", "hang", "slow", "link_flap"}


def test_the_run_ends_with_a_line_of_the_faults_drawn_and_played():
    from gasloc_emu.report.fmt import summary_lines
    counts = {"crash": {"played": 2, "last_worker": 1}, "hang": {"down": 2, "played": 3}}
    lines = summary_lines({"membership": {"faults": counts}}, "rec")
    assert "random faults: 8 drawn, 5 played; not played: down 2, last_worker 1 " \
           "(faults.json)" in lines
    assert not [ln for ln in summary_lines({"membership": {}}, "rec") if "random" in ln]


def test_errors_name_a_drawn_event_by_the_section_its_kind_and_time(tmp_path):
    (tmp_path / "s.toml").write_text(SECTION.replace("at_s = 50.0", "round = 5"))
    with pytest.raises(ScenarioError, match=r"^scenario s.toml \[faults\] \(leave at [0-9.]+ s, "
                                            r"drawn\): uses at_s while event #1 uses round"):
        load_scenario(tmp_path / "s.toml", 4, 100)


def test_a_kind_the_algorithm_cannot_play_is_refused_in_one_line(tmp_path):
    from gasloc_emu import config as C
    from gasloc_emu.plan import build_plan
    (tmp_path / "s.toml").write_text("[faults]\nseed = 3\nhorizon_s = 5.0\n"
                                     "[[faults.link_flap]]\nmtbf_s = 1.0\n"
                                     "duration_median_s = 0.2\n")
    cfg = C.resolve(overrides={"workers": 4, "algo.name": "diloco", "run.rounds": 12,
                               "run.scenario": str(tmp_path / "s.toml")})
    with pytest.raises(ScenarioError, match=r"^scenario s.toml: faults.link_flap cannot be "
                                            r"played with diloco: .* use partition faults$"):
        build_plan(cfg, data=False)
