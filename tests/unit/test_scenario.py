"""Scenario timelines without a run: files in, validated events, a Timeline on a fake clock."""
from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu.config import ConfigError
from gasloc_emu.scenario import load as scenario_file
from gasloc_emu.scenario.events import (
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    PartitionEvent,
    PauseEvent,
    ScenarioError,
    SpeedEvent,
    as_record,
)
from gasloc_emu.scenario.load import load_scenario
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.timeline import Timeline
from gasloc_emu.scenario.trace import LinkTrace, TracePoint, load_link_trace

BASE = (50.0, 0.0, 0.0)


class FakeClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def base_link(src: int, dst: int) -> tuple[float, float, float]:
    return BASE


def load(tmp_path: Path, text: str, workers: int = 4, rounds: int = 20) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(text))
    return load_scenario(path, workers, rounds)


def events_toml(*tables: str) -> str:
    return "\n".join(f"[[event]]\n{textwrap.dedent(t).strip()}\n" for t in tables)


def error_of(tmp_path: Path, *tables: str, workers: int = 4, rounds: int = 20) -> str:
    with pytest.raises(ScenarioError) as info:
        load(tmp_path, events_toml(*tables), workers, rounds)
    message = str(info.value)
    assert "\n" not in message
    return message


def timeline(sc: Scenario, clock: FakeClock | None = None,
             trace: LinkTrace | None = None) -> Timeline:
    return Timeline(sc, base_link, clock or FakeClock(), trace)


# -- the file format

def test_scenario_errors_are_config_errors():
    # the CLI maps ConfigError to exit 2: a bad scenario is bad input
    assert issubclass(ScenarioError, ConfigError) and issubclass(ScenarioError, ValueError)


def test_the_docstring_example_loads(tmp_path):
    example = scenario_file.__doc__.split("::\n\n", 1)[1].split("\nA link trace", 1)[0]
    sc = load(tmp_path, example, workers=6, rounds=20)
    assert [e.kind for e in sc.round_events] == ["speed", "leave", "link", "join"]
    assert [e.kind for e in sc.time_events] == ["pause", "partition"]
    assert sc.round_events[3] == JoinEvent(round=8, worker=2, from_worker=1)
    assert sc.time_events[1] == PartitionEvent(at_s=30.0, groups=((0, 1, 2), (3, 4, 5)),
                                               end_s=90.0)
    assert sc.time_events[0] == PauseEvent(at_s=12.5, worker=4, seconds=3.0)
    assert sc.round_events[0] == SpeedEvent(round=3, worker=1, speed=0.25)


def test_link_one_pair(tmp_path):
    sc = load(tmp_path, events_toml("type = 'link'\nround = 5\nlink = [0, 1]\nrate_mbit = 5"))
    assert sc.events == (LinkEvent(round=5, links=((0, 1),), rate_mbit=5.0),)
    assert isinstance(sc.events[0].rate_mbit, float)


def test_link_list_with_latency_and_loss(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'link'\nat_s = 3\nlinks = [[0, 1], [2, 3]]\nlatency_ms = 20\nloss_pct = 1.5"))
    ev = sc.events[0]
    assert ev.links == ((0, 1), (2, 3)) and ev.at_s == 3.0 and isinstance(ev.at_s, float)
    assert ev.changes() == {"latency_ms": 20.0, "loss_pct": 1.5}


def test_link_worker_form_expands_to_every_link_from_and_to_it(tmp_path):
    sc = load(tmp_path, events_toml("type = 'link'\nround = 1\nworker = 2\nrate_mbit = 5"))
    assert sc.events[0].worker == 2
    assert sc.events[0].links == ((0, 2), (1, 2), (2, 0), (2, 1), (2, 3), (3, 2))


def test_link_worker_form_covers_only_the_living(tmp_path):
    sc = load(tmp_path, events_toml("type = 'leave'\nround = 2\nworker = 0",
                                    "type = 'link'\nround = 2\nworker = 2\nrate_mbit = 5",
                                    "type = 'join'\nround = 3\nworker = 4",
                                    "type = 'link'\nround = 3\nworker = 1\nrate_mbit = 7"))
    assert sc.events[1].links == ((1, 2), (2, 1), (2, 3), (3, 2))
    assert sc.events[3].links == ((1, 2), (1, 3), (1, 4), (2, 1), (3, 1), (4, 1))


def test_link_worker_form_of_the_other_trigger_kind_covers_every_id(tmp_path):
    # membership is by round, the link event by time: it cannot know who is alive then
    sc = load(tmp_path, events_toml("type = 'join'\nround = 3\nworker = 3",
                                    "type = 'link'\nat_s = 1\nworker = 0\nrate_mbit = 5"),
              workers=3)
    assert sc.events[1].links == ((0, 1), (0, 2), (0, 3), (1, 0), (2, 0), (3, 0))


def test_partition_speed_pause_leave_join_fields(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'partition'\nround = 2\ngroups = [[0], [1, 2]]\nend_round = 6",
        "type = 'speed'\nat_s = 1.5\nworker = 3\nspeed = 1",
        "type = 'pause'\nround = 1\nworker = 0\nseconds = 2",
        "type = 'leave'\nround = 4\nworker = 1",
        "type = 'join'\nround = 7\nworker = 4",
        "type = 'join'\nround = 9\nworker = 1\nfrom_worker = 4"))
    part, speed, pause, leave, join_new, rejoin = sc.events
    assert part.groups == ((0,), (1, 2)) and part.end == 6
    assert part.cut_links() == ((0, 1), (0, 2), (1, 0), (2, 0))
    assert speed.speed == 1.0 and pause.seconds == 2.0 and leave.worker == 1
    assert join_new == JoinEvent(round=7, worker=4) and join_new.from_worker is None
    assert rejoin.from_worker == 4
    assert sc.total_workers == 5 and sc.departures == {1}
    assert sc.membership_trigger == "round"


def test_events_are_sorted_by_trigger_and_stable_within_one(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'speed'\nround = 5\nworker = 0\nspeed = 0.5",
        "type = 'pause'\nat_s = 9\nworker = 0\nseconds = 1",
        "type = 'speed'\nround = 1\nworker = 1\nspeed = 0.5",
        "type = 'speed'\nround = 5\nworker = 2\nspeed = 0.5",
        "type = 'pause'\nat_s = 2.5\nworker = 1\nseconds = 1",
        "type = 'speed'\nround = 0\nworker = 3\nspeed = 0.5",
        "type = 'pause'\nat_s = 9\nworker = 2\nseconds = 1"))
    assert [(e.round, e.worker) for e in sc.round_events] == [(0, 3), (1, 1), (5, 0), (5, 2)]
    assert [(e.at_s, e.worker) for e in sc.time_events] == [(2.5, 1), (9.0, 0), (9.0, 2)]
    assert sc.membership_trigger is None


def test_an_empty_scenario_is_fine(tmp_path):
    sc = load(tmp_path, "")
    assert sc.events == () and sc.membership_at(5) == {0, 1, 2, 3}


def test_events_built_in_code_are_validated_too():
    with pytest.raises(ScenarioError, match=r"^preset event #2 \(leave\): worker 1 already "):
        Scenario((LeaveEvent(round=1, worker=1), LeaveEvent(round=2, worker=1)), 3, 5, "preset")


# -- every validation error, one line naming file, event and problem

WHERE = "scenario s.toml event #"


@pytest.mark.parametrize("tables, expected", [
    (["type = 'flood'\nround = 1"],
     "#1: type = 'flood' is not an event type; expected one of link, partition, speed, pause, "
     "leave, join"),
    (["round = 1\nworker = 0"], "#1: missing 'type'"),
    (["type = 'leave'\nround = 1\nworker = 0\nspeed = 1"],
     "#1 (leave): unknown key 'speed'; allowed for leave: at_s, round, type, worker"),
    (["type = 'leave'\nworker = 0"], "#1 (leave): has no trigger; give round = R"),
    (["type = 'leave'\nworker = 0\nround = 1\nat_s = 2.0"], "#1 (leave): has two triggers"),
    (["type = 'speed'\nround = 1\nspeed = 0.5"], "#1 (speed): missing 'worker'"),
    (["type = 'partition'\nround = 1"], "#1 (partition): missing 'groups'"),
    (["type = 'leave'\nround = 20\nworker = 0"],
     "#1 (leave): round = 20 is out of range; this run has rounds 0..19"),
    (["type = 'leave'\nround = 2.5\nworker = 0"], "#1 (leave): round = 2.5 is not an integer"),
    (["type = 'leave'\nround = -1\nworker = 0"], "#1 (leave): round = -1 is out of range"),
    (["type = 'pause'\nat_s = -1.0\nworker = 0\nseconds = 1"],
     "#1 (pause): at_s = -1.0 is out of range; expected a finite value >= 0"),
    (["type = 'pause'\nat_s = inf\nworker = 0\nseconds = 1"], "#1 (pause): at_s = inf is out"),
    (["type = 'speed'\nround = 1\nworker = 9\nspeed = 0.5"],
     "#1 (speed): worker 9 is not alive at round 1 (alive: 0-3)"),
    (["type = 'speed'\nround = 1\nworker = true\nspeed = 0.5"],
     "#1 (speed): worker = True is not an integer"),
    (["type = 'speed'\nround = 1\nworker = 0\nspeed = 1.5"],
     "#1 (speed): speed = 1.5 is out of range; expected a value in (0, 1]"),
    (["type = 'speed'\nround = 1\nworker = 0\nspeed = 0"], "#1 (speed): speed = 0 is out of"),
    (["type = 'pause'\nround = 1\nworker = 0\nseconds = 0"],
     "#1 (pause): seconds = 0 is out of range; expected a finite value > 0"),
    (["type = 'leave'\nround = 3\nworker = 2", "type = 'leave'\nround = 5\nworker = 2"],
     "#2 (leave): worker 2 already left at round 3 (event #1)"),
    (["type = 'leave'\nround = 3\nworker = 2", "type = 'leave'\nround = 5\nworker = 2",
      "type = 'join'\nround = 8\nworker = 2"],
     "#2 (leave): worker 2 already left at round 3 (event #1); its join (event #3) is only at "
     "round 8"),
    (["type = 'leave'\nround = 1\nworker = 1", "type = 'join'\nround = 2\nworker = 1",
      "type = 'join'\nround = 4\nworker = 1"],
     "#3 (join): worker 1 is already alive at round 4"),
    (["type = 'join'\nround = 5\nworker = 4", "type = 'leave'\nround = 2\nworker = 4"],
     "#2 (leave): worker 4 leaves at round 2, before it joins at round 5 (event #1)"),
    (["type = 'leave'\nround = 2\nworker = 7"],
     "#1 (leave): worker 7 is not alive at round 2 (alive: 0-3)"),
    (["type = 'join'\nround = 2\nworker = 5"],
     "#1 (join): worker 5 cannot join at round 2: a new worker takes the next id, 4"),
    (["type = 'leave'\nround = 3\nworker = 1", "type = 'join'\nround = 3\nworker = 1"],
     "#2 (join): worker 1 already changes at round 3 (event #1); its leave and join need"),
    (["type = 'join'\nround = 3\nworker = 4\nfrom_worker = 4"],
     "#1 (join): from_worker = 4 is the joining worker itself"),
    (["type = 'leave'\nround = 3\nworker = 0", "type = 'join'\nround = 3\nworker = 4\n"
      "from_worker = 0"], "#2 (join): from_worker 0 must be alive both before and at round 3 "
                         "(such workers: 1-3)"),
    ([f"type = 'leave'\nround = 1\nworker = {w}" for w in (0, 1, 2)]
     + ["type = 'leave'\nround = 2\nworker = 3"],
     "#4 (leave): no worker would be alive after round 2; at least one must remain"),
    (["type = 'leave'\nround = 1\nworker = 0", "type = 'join'\nat_s = 5\nworker = 0"],
     "#2 (join): uses at_s while event #1 uses round; leave and join events must all use "
     "round or all use at_s"),
    (["type = 'partition'\nround = 4\ngroups = [[0], [1]]\nend_round = 8",
      "type = 'partition'\nround = 6\ngroups = [[2], [3]]\nend_round = 9"],
     "#2 (partition): from round 6 until round 9 overlaps the partition of event #1 (from "
     "round 4 until round 8); only one partition may be active at a time"),
    (["type = 'partition'\nat_s = 10\ngroups = [[0], [1]]",
      "type = 'partition'\nat_s = 50\ngroups = [[2], [3]]\nend_s = 60"],
     "#2 (partition): from 50 s until 60 s overlaps the partition of event #1 (from 10 s to "
     "the end)"),
    (["type = 'partition'\nround = 4\ngroups = [[0], [1]]\nend_round = 8",
      "type = 'partition'\nround = 4\ngroups = [[2], [3]]\nend_round = 5"],
     "overlaps the partition of event #"),
    (["type = 'partition'\nround = 4\ngroups = [[0], [1]]\nend_round = 8",
      "type = 'partition'\nat_s = 4\ngroups = [[2], [3]]\nend_s = 5"],
     "#2 (partition): uses at_s while event #1 uses round; partitions must all use round or "
     "all use at_s"),
    (["type = 'partition'\nround = 1\ngroups = [[0, 1], [1, 2]]"],
     "#1 (partition): groups = [[0, 1], [1, 2]]: worker 1 is named twice; the groups must be "
     "disjoint"),
    (["type = 'partition'\nround = 1\ngroups = [[0, 1]]"],
     "#1 (partition): groups = [[0, 1]] is not two non-empty lists of workers"),
    (["type = 'partition'\nround = 1\ngroups = [[0, 1], []]"], "is not two non-empty lists"),
    (["type = 'partition'\nround = 5\ngroups = [[0], [1]]\nend_round = 5"],
     "#1 (partition): end_round = 5 is not after round = 5"),
    (["type = 'partition'\nround = 5\ngroups = [[0], [1]]\nend_round = 20"],
     "#1 (partition): end_round = 20 is out of range; this run has rounds 0..19"),
    (["type = 'partition'\nround = 5\ngroups = [[0], [1]]\nend_s = 50"],
     "#1 (partition): end_s goes with an at_s trigger; this partition has round, so use "
     "end_round"),
    (["type = 'partition'\nat_s = 5\ngroups = [[0], [1]]\nend_round = 7"],
     "#1 (partition): end_round goes with a round trigger; this partition has at_s, so use "
     "end_s"),
    (["type = 'partition'\nround = 5\ngroups = [[0], [9]]"],
     "#1 (partition): worker 9 is not alive at round 5 (alive: 0-3)"),
    (["type = 'leave'\nround = 3\nworker = 2", "type = 'link'\nround = 5\nlink = [0, 2]\n"
      "rate_mbit = 5"], "#2 (link): worker 2 is not alive at round 5 (alive: 0-1, 3)"),
    (["type = 'leave'\nround = 3\nworker = 2", "type = 'link'\nround = 3\nworker = 2\n"
      "rate_mbit = 5"], "#2 (link): worker 2 is not alive at round 3"),
    (["type = 'link'\nat_s = 5\nlink = [0, 4]\nrate_mbit = 5"],
     "#1 (link): worker 4 is not a worker of this run (ids 0-3)"),
    (["type = 'link'\nround = 1\nlink = [1, 1]\nrate_mbit = 5"],
     "#1 (link): link = [1, 1]: src and dst are both worker 1"),
    (["type = 'link'\nround = 1\nlink = [1]\nrate_mbit = 5"],
     "#1 (link): link = [1] is not a [src, dst] pair"),
    (["type = 'link'\nround = 1\nlinks = [[0, 1], [0, 1]]\nrate_mbit = 5"],
     "#1 (link): links: link 0->1 is listed twice"),
    (["type = 'link'\nround = 1\nlinks = []\nrate_mbit = 5"], "#1 (link): links = [] names no"),
    (["type = 'link'\nround = 1\nrate_mbit = 5"],
     "#1 (link): give exactly one of link = [src, dst], links = [[src, dst], ...] or worker = k"),
    (["type = 'link'\nround = 1\nlink = [0, 1]\nworker = 0\nrate_mbit = 5"],
     "or worker = k; got link and worker"),
    (["type = 'link'\nround = 1\nlink = [0, 1]"],
     "#1 (link): sets nothing; give rate_mbit, latency_ms or loss_pct"),
    (["type = 'link'\nround = 1\nlink = [0, 1]\nrate_mbit = 0"],
     "#1 (link): rate_mbit = 0 is out of range; expected a value in (0, 100000]"),
    (["type = 'link'\nround = 1\nlink = [0, 1]\nloss_pct = 101"],
     "#1 (link): loss_pct = 101 is out of range; expected a value in [0, 100]"),
    (["type = 'link'\nround = 1\nlink = [0, 1]\nlatency_ms = 'x'"],
     "#1 (link): latency_ms = 'x' is not a number"),
])
def test_validation_errors(tmp_path, tables, expected):
    message = error_of(tmp_path, *tables)
    assert message.startswith(WHERE), message
    assert expected in message, message


def test_unknown_top_level_key(tmp_path):
    with pytest.raises(ScenarioError, match=r"scenario s.toml: unknown top-level key 'events'"):
        load(tmp_path, "[[events]]\ntype = 'leave'\n")


def test_event_must_be_an_array_of_tables(tmp_path):
    with pytest.raises(ScenarioError, match=r"event must be a list of tables"):
        load(tmp_path, "[event]\ntype = 'leave'\n")


def test_type_that_is_not_a_string(tmp_path):
    message = error_of(tmp_path, "type = [1]\nround = 1")
    assert message.startswith("scenario s.toml event #1: type = [1] is not an event type")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ScenarioError, match=r"scenario file .*nope.toml' does not exist"):
        load_scenario(tmp_path / "nope.toml", 4, 20)
    (tmp_path / "bad.toml").write_text("[[event]\n")
    with pytest.raises(ScenarioError, match=r"bad.toml' is not valid TOML"):
        load_scenario(tmp_path / "bad.toml", 4, 20)


def test_run_size_is_checked(tmp_path):
    with pytest.raises(ScenarioError, match=r"scenario s.toml: rounds = 0 is out of range"):
        load(tmp_path, "", rounds=0)


def test_a_rejoin_and_a_new_worker_in_order_validate(tmp_path):
    sc = load(tmp_path, events_toml("type = 'leave'\nround = 2\nworker = 3",
                                    "type = 'join'\nround = 4\nworker = 4",
                                    "type = 'join'\nround = 4\nworker = 5",
                                    "type = 'join'\nround = 6\nworker = 3",
                                    "type = 'leave'\nround = 9\nworker = 3"))
    assert [sc.membership_at(r) for r in (0, 2, 4, 6, 9)] == [
        {0, 1, 2, 3}, {0, 1, 2}, {0, 1, 2, 4, 5}, {0, 1, 2, 3, 4, 5}, {0, 1, 2, 4, 5}]
    assert sc.total_workers == 6


def test_a_join_needs_a_worker_alive_before_and_in_its_round(tmp_path):
    # alone, worker 0 leaves as worker 1 joins: someone is alive in every round, but nobody
    # holds round 2's parameters in round 3 to hand them over (a leaver's process is gone)
    with pytest.raises(ScenarioError, match="#2 .join.: no worker alive both before and at "
                                            "round 3 to give worker 1 its parameters"):
        load(tmp_path, events_toml("type = 'leave'\nround = 3\nworker = 0",
                                   "type = 'join'\nround = 3\nworker = 1"), workers=1)
    sc = load(tmp_path, events_toml("type = 'leave'\nround = 3\nworker = 0",
                                    "type = 'join'\nround = 2\nworker = 1"), workers=1)
    assert sc.membership_at(2) == {0, 1} and sc.membership_at(3) == {1}


def test_back_to_back_partitions_do_not_overlap(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'partition'\nround = 2\ngroups = [[0], [1]]\nend_round = 4",
        "type = 'partition'\nround = 4\ngroups = [[1], [2]]"))
    assert len(sc.round_events) == 2


def test_event_construction_checks_its_own_fields():
    with pytest.raises(ScenarioError, match="is not a link of worker 3"):
        LinkEvent(round=1, worker=3, links=((0, 1),), rate_mbit=5)
    with pytest.raises(ScenarioError, match="source = 'x' is not one of"):
        LinkEvent(round=1, links=((0, 1),), rate_mbit=5, source="x")
    with pytest.raises(ScenarioError, match="has both end_round and end_s"):
        PartitionEvent(round=1, groups=((0,), (1,)), end_round=3, end_s=4.0)
    held_only = LinkEvent(round=1, held=((0, 1),), rate_mbit=5)
    assert held_only.links == ()


# -- membership

def test_membership_at_counts_round_leaves_and_joins_from_their_round(tmp_path):
    sc = load(tmp_path, events_toml("type = 'leave'\nround = 4\nworker = 2",
                                    "type = 'join'\nround = 8\nworker = 2"), workers=6)
    tl = timeline(sc)
    assert tl.membership_at(3) == {0, 1, 2, 3, 4, 5}
    assert tl.membership_at(4) == tl.membership_at(7) == {0, 1, 3, 4, 5}
    assert tl.membership_at(8) == tl.membership_at(19) == {0, 1, 2, 3, 4, 5}


def test_time_triggered_membership_is_not_predicted(tmp_path):
    sc = load(tmp_path, events_toml("type = 'leave'\nat_s = 4\nworker = 2",
                                    "type = 'speed'\nat_s = 5\nworker = 1\nspeed = 0.5"))
    assert sc.membership_trigger == "at_s"
    assert sc.membership_at(10) == {0, 1, 2, 3}


def test_time_triggered_membership_is_still_checked_in_time_order(tmp_path):
    message = error_of(tmp_path, "type = 'leave'\nat_s = 4\nworker = 2",
                       "type = 'speed'\nat_s = 5\nworker = 2\nspeed = 0.5",
                       "type = 'leave'\nat_s = 3\nworker = 1",
                       "type = 'leave'\nat_s = 3.5\nworker = 0",
                       "type = 'leave'\nat_s = 3.7\nworker = 3")
    assert message.startswith(WHERE + "1 (leave): no worker would be alive after 4 s")


# -- link traces

def write_trace(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_trace_rates_are_piecewise_constant(tmp_path):
    trace = load_link_trace(write_trace(tmp_path, """\
        time_s,src,dst,rate_mbit
        10,0,1,20
        0,0,1,50
        5,1,0,7.5

        30,0,1,5
        """), workers=2)
    assert trace.points[(0, 1)] == (TracePoint(0.0, 50.0), TracePoint(10.0, 20.0),
                                    TracePoint(30.0, 5.0))
    assert [trace.rate_at(0, 1, t) for t in (0, 9.99, 10, 29, 30, 1e9)] == [
        50.0, 50.0, 20.0, 20.0, 5.0, 5.0]
    assert trace.rate_at(1, 0, 4.9) is None and trace.rate_at(1, 0, 5) == 7.5
    assert trace.rate_at(0, 2, 100) is None
    assert trace.latency_at(0, 1, 10) is None


def test_trace_with_latency(tmp_path):
    trace = load_link_trace(write_trace(tmp_path, """\
        time_s, src, dst, rate_mbit, latency_ms
        0, 0, 2, 50, 10
        4, 0, 2, 25, 40
        """), workers=3)
    assert trace.latency_at(0, 2, 3) == 10.0 and trace.latency_at(0, 2, 4) == 40.0


def test_changes_between_is_half_open_and_sorted(tmp_path):
    trace = load_link_trace(write_trace(tmp_path, """\
        time_s,src,dst,rate_mbit,latency_ms
        10,1,0,20,1
        0,0,1,50,2
        10,0,1,20,3
        20,0,1,5,4
        """), workers=2)
    got = trace.changes_between(0.0, 20.0)
    assert got == [
        LinkEvent(at_s=0.0, links=((0, 1),), rate_mbit=50.0, latency_ms=2.0, source="trace"),
        LinkEvent(at_s=10.0, links=((0, 1),), rate_mbit=20.0, latency_ms=3.0, source="trace"),
        LinkEvent(at_s=10.0, links=((1, 0),), rate_mbit=20.0, latency_ms=1.0, source="trace")]
    assert [e.at_s for e in trace.changes_between(10.0, 20.0001)] == [10.0, 10.0, 20.0]
    assert trace.changes_between(0.5, 10.0) == [] and trace.changes_between(20.5, 99) == []


@pytest.mark.parametrize("text, expected", [
    ("", "link trace t.csv is empty; expected the header time_s,src,dst,rate_mbit"),
    ("time,src,dst,rate\n0,0,1,5\n",
     "link trace t.csv line 1: header 'time,src,dst,rate' is not "
     "time_s,src,dst,rate_mbit[,latency_ms]"),
    ("time_s,src,dst,rate_mbit\n0,0,1,5\n1,0,1\n",
     "link trace t.csv line 3: expected 4 fields (time_s,src,dst,rate_mbit), got 3"),
    ("time_s,src,dst,rate_mbit\n-1,0,1,5\n",
     "link trace t.csv line 2: time_s = -1.0 is out of range; expected a finite value >= 0"),
    ("time_s,src,dst,rate_mbit\nsoon,0,1,5\n",
     "link trace t.csv line 2: time_s = 'soon' is not a number"),
    ("time_s,src,dst,rate_mbit\n0,0,1,0\n",
     "link trace t.csv line 2: rate_mbit = 0.0 is out of range; expected a value in (0, 100000]"),
    ("time_s,src,dst,rate_mbit\n0,0,1,-3\n", "line 2: rate_mbit = -3.0 is out of range"),
    ("time_s,src,dst,rate_mbit\n0,0,4,5\n",
     "link trace t.csv line 2: dst = 4 is out of range; this run has workers 0..3"),
    ("time_s,src,dst,rate_mbit\n0,1.0,2,5\n", "line 2: src = '1.0' is not an integer"),
    ("time_s,src,dst,rate_mbit\n0,2,2,5\n", "line 2: src and dst are both worker 2"),
    ("time_s,src,dst,rate_mbit,latency_ms\n0,0,1,5,-2\n",
     "line 2: latency_ms = -2.0 is out of range; expected a value in [0, 10000]"),
    ("time_s,src,dst,rate_mbit\n0,0,1,5\n3,0,1,6\n0,0,1,7\n",
     "link trace t.csv line 4: link 0->1 already has a row at time_s = 0 (line 2)"),
])
def test_trace_errors(tmp_path, text, expected):
    with pytest.raises(ScenarioError) as info:
        load_link_trace(write_trace(tmp_path, text), workers=4)
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_trace_file_missing(tmp_path):
    with pytest.raises(ScenarioError, match=r"link trace file .*none.csv' does not exist"):
        load_link_trace(tmp_path / "none.csv", 4)


def test_trace_built_in_code_must_be_sorted():
    with pytest.raises(ScenarioError, match="link 0->1 has rows out of order"):
        LinkTrace({(0, 1): (TracePoint(5.0, 1.0), TracePoint(1.0, 2.0))})


# -- the timeline

def test_due_returns_each_round_event_once_at_its_round(tmp_path):
    sc = load(tmp_path, events_toml("type = 'speed'\nround = 2\nworker = 0\nspeed = 0.5",
                                    "type = 'leave'\nround = 3\nworker = 1",
                                    "type = 'pause'\nround = 3\nworker = 2\nseconds = 1"))
    tl = timeline(sc)
    got = {r: tl.due(r) for r in range(6)}
    assert got[2] == [sc.events[0]] and got[3] == [sc.events[1], sc.events[2]]
    assert got[0] == got[1] == got[4] == got[5] == []
    assert tl.due(3) == [] and tl.pending() == 0


def test_due_catches_up_on_skipped_rounds(tmp_path):
    sc = load(tmp_path, events_toml("type = 'speed'\nround = 2\nworker = 0\nspeed = 0.5",
                                    "type = 'speed'\nround = 4\nworker = 0\nspeed = 1"))
    tl = timeline(sc)
    assert tl.due(5) == list(sc.round_events) and tl.due(6) == []


def test_due_fires_time_events_once_when_the_clock_passes_them(tmp_path):
    sc = load(tmp_path, events_toml("type = 'pause'\nat_s = 1.5\nworker = 0\nseconds = 1",
                                    "type = 'speed'\nround = 1\nworker = 1\nspeed = 0.5",
                                    "type = 'pause'\nat_s = 3\nworker = 1\nseconds = 1"))
    clock = FakeClock(1.0)
    tl = timeline(sc, clock)
    assert tl.due(0) == []
    clock.t = 1.5
    assert tl.due(0) == [sc.events[0]]
    assert tl.due(0) == []
    clock.t = 10.0
    # round events first, then the time events whose time came
    assert tl.due(1) == [sc.events[1], sc.events[2]]
    assert tl.due(2) == [] and tl.pending() == 0


def test_partition_end_restores_the_values_before_the_cut(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'link'\nround = 1\nlink = [0, 2]\nrate_mbit = 10\nlatency_ms = 5",
        "type = 'partition'\nround = 2\ngroups = [[0, 1], [2]]\nend_round = 5",
        "type = 'link'\nround = 5\nlink = [2, 0]\nloss_pct = 3"))
    tl = timeline(sc)
    assert tl.due(1) == [sc.events[0]]
    assert tl.due(2) == [sc.events[1]]
    assert tl.cut_links() == {(0, 2), (1, 2), (2, 0), (2, 1)}
    assert tl.due(4) == []
    fired = tl.due(5)
    assert fired == [
        LinkEvent(round=5, links=((0, 2),), rate_mbit=10.0, latency_ms=5.0, loss_pct=0.0,
                  source="restore"),
        LinkEvent(round=5, links=((1, 2), (2, 0), (2, 1)), rate_mbit=50.0, latency_ms=0.0,
                  loss_pct=0.0, source="restore"),
        sc.events[2]]
    assert tl.cut_links() == set() and tl.link_values(2, 0) == (50.0, 0.0, 3.0)
    assert tl.pending() == 0


def test_a_link_change_inside_a_cut_is_held_until_the_restore(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'partition'\nround = 2\ngroups = [[0], [1]]\nend_round = 6",
        "type = 'link'\nround = 3\nlinks = [[0, 1], [0, 2]]\nrate_mbit = 20",
        "type = 'link'\nround = 4\nlink = [1, 0]\nrate_mbit = 30"), workers=3)
    tl = timeline(sc)
    tl.due(2)
    (partly,) = tl.due(3)
    assert partly.links == ((0, 2),) and partly.held == ((0, 1),) and partly.rate_mbit == 20
    (wholly,) = tl.due(4)
    assert wholly.links == () and wholly.held == ((1, 0),)
    restores = tl.due(6)
    assert [(e.links, e.rate_mbit) for e in restores] == [(((0, 1),), 20.0), (((1, 0),), 30.0)]


def test_a_partition_without_an_end_stays(tmp_path):
    sc = load(tmp_path, events_toml("type = 'partition'\nround = 1\ngroups = [[0], [1]]"))
    tl = timeline(sc)
    tl.due(1)
    assert all(tl.due(r) == [] for r in range(2, 20)) and tl.cut_links() == {(0, 1), (1, 0)}


def test_time_partition_ends_on_the_clock(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'partition'\nat_s = 10\ngroups = [[0], [1]]\nend_s = 70"))
    clock = FakeClock(0.0)
    tl = timeline(sc, clock)
    clock.t = 30.0
    assert tl.due(3) == [sc.events[0]]
    clock.t = 69.9
    assert tl.due(4) == []
    clock.t = 70.0
    assert tl.due(5) == [LinkEvent(at_s=70.0, links=((0, 1), (1, 0)), rate_mbit=50.0,
                                   latency_ms=0.0, loss_pct=0.0, source="restore")]


def test_a_partition_and_its_end_in_one_call(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'partition'\nround = 1\ngroups = [[0], [1]]\nend_round = 3"))
    got = timeline(sc).due(7)
    assert [e.kind for e in got] == ["partition", "link"] and got[1].round == 3


def test_the_trace_plays_on_the_clock_with_the_scenario(tmp_path):
    trace = LinkTrace({(0, 1): (TracePoint(0.0, 40.0), TracePoint(5.0, 4.0, 9.0))})
    sc = load(tmp_path, events_toml("type = 'pause'\nat_s = 5\nworker = 0\nseconds = 1"))
    clock = FakeClock(0.0)
    tl = timeline(sc, clock, trace)
    assert tl.due(0) == [LinkEvent(at_s=0.0, links=((0, 1),), rate_mbit=40.0, source="trace")]
    clock.t = 6.0
    got = tl.due(1)
    assert got[0] == sc.events[0] and got[1].rate_mbit == 4.0 and got[1].latency_ms == 9.0
    assert tl.link_values(0, 1) == (4.0, 9.0, 0.0) and tl.pending() == 0


def test_as_record_has_a_stable_key_order_and_is_json(tmp_path):
    sc = load(tmp_path, events_toml(
        "type = 'link'\nround = 1\nlink = [0, 1]\nrate_mbit = 5",
        "type = 'partition'\nat_s = 2\ngroups = [[0], [1, 2]]\nend_s = 4",
        "type = 'join'\nround = 3\nworker = 4\nfrom_worker = 1"))
    link, join, part = sc.round_events + sc.time_events
    assert list(as_record(link)) == ["type", "round", "at_s", "links", "worker", "rate_mbit",
                                     "latency_ms", "loss_pct", "held", "source"]
    assert as_record(link)["links"] == [[0, 1]] and as_record(link)["at_s"] is None
    assert as_record(part) == {"type": "partition", "round": None, "at_s": 2.0,
                               "groups": [[0], [1, 2]], "end_round": None, "end_s": 4.0}
    assert as_record(join) == {"type": "join", "round": 3, "at_s": None, "worker": 4,
                               "from_worker": 1}
    assert Timeline.as_record is as_record
    assert json.loads(json.dumps(as_record(part))) == as_record(part)


# -- properties

def _oracle(workers: int, changes: list[tuple[str, int, int]]) -> dict[int, frozenset] | None:
    """Who is alive from each round with a change, or None when the sequence is invalid:
    a plain re-statement of the rules for round-triggered leaves and joins."""
    order = sorted(changes, key=lambda c: c[2])
    first = {}
    for kind, w, _ in order:
        first.setdefault(w, kind)
    # a worker whose first change is a join is new: absent from the start until then
    alive = set(range(workers)) - {w for w, k in first.items() if k == "join"}
    if not alive:
        return None
    next_id, seen, steps = workers, set(), {-1: frozenset(alive)}  # -1: before round 0
    for rnd, grouped in itertools.groupby(order, key=lambda c: c[2]):
        group, before = list(grouped), set(alive)
        for kind, w, _ in group:
            if (w, rnd) in seen:
                return None
            seen.add((w, rnd))
            if kind == "leave" and w not in alive:
                return None
            if kind == "join" and (w in alive or w > next_id):
                return None
            if kind == "leave":
                alive.remove(w)
            else:
                next_id += w == next_id
                alive.add(w)
        if not alive:
            return None
        if any(kind == "join" for kind, _, _ in group) and not before & alive:
            return None   # no one holds the last round's parameters to give a joiner
        steps[rnd] = frozenset(alive)
    return steps


change_lists = st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(1, 12).flatmap(lambda r: st.tuples(st.just(r), st.lists(
        st.tuples(st.sampled_from(["leave", "join"]), st.integers(0, n + 2),
                  st.integers(0, r - 1)), max_size=10)))))


@st.composite
def valid_change_lists(draw):
    """Sequences built to be valid (then shuffled in file order, which may still break one)."""
    workers, rounds = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    alive, next_id, out = set(range(workers)), workers, []
    for rnd in range(rounds):
        touched: set[int] = set()
        for _ in range(draw(st.integers(0, 2))):
            leaves = [("leave", w) for w in sorted(alive - touched) if len(alive) > 1]
            joins = [("join", w) for w in sorted(set(range(next_id)) - alive - touched)]
            kind, w = draw(st.sampled_from(leaves + joins + [("join", next_id)]))
            if kind == "leave":
                alive.remove(w)
            else:
                alive.add(w)
                next_id = max(next_id, w + 1)
            touched.add(w)
            out.append((kind, w, rnd))
    return workers, (rounds, draw(st.permutations(out)))


@settings(max_examples=300, deadline=None)
@given(st.one_of(change_lists, valid_change_lists()))
def test_round_membership_matches_the_rules_and_due_returns_everything_once(case):
    workers, (rounds, changes) = case
    events = [(LeaveEvent if k == "leave" else JoinEvent)(round=r, worker=w)
              for k, w, r in changes]
    steps = _oracle(workers, changes)
    if steps is None:
        with pytest.raises(ScenarioError):
            Scenario(tuple(events), workers, rounds)
        return
    sc = Scenario(tuple(events), workers, rounds)
    tl = timeline(sc)
    alive = steps[-1]
    assert sc.initial == alive
    fired = []
    for r in range(rounds):
        alive = steps.get(r, alive)
        assert tl.membership_at(r) == alive and alive
        due = tl.due(r)
        assert all(e.round == r for e in due)
        fired += due
    assert fired == list(sc.round_events) and sorted(map(id, fired)) == sorted(map(id, events))
    assert tl.pending() == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), max_size=12),
       st.lists(st.floats(0, 20, allow_nan=False), min_size=1, max_size=20))
def test_time_events_fire_once_and_never_early(times, steps):
    events = tuple(PauseEvent(at_s=t, worker=k % 3, seconds=1.0) for k, t in enumerate(times))
    sc = Scenario(events, 3, 5)
    clock = FakeClock(0.0)
    tl = timeline(sc, clock)
    fired, before = [], -1.0
    for k, step in enumerate(itertools.chain(steps, [1000.0])):
        clock.t += step
        due = tl.due(min(k, 4))
        assert all(before < e.at_s <= clock.t for e in due)   # not early, not held back
        fired, before = fired + due, clock.t
    assert sorted(map(id, fired)) == sorted(map(id, events)) and tl.pending() == 0


# -- new workers

def test_a_worker_whose_first_event_is_a_join_is_new_and_absent_until_then(tmp_path):
    sc = load(tmp_path, events_toml("type = 'join'\nround = 2\nworker = 1",
                                    "type = 'leave'\nround = 5\nworker = 1"), workers=3)
    assert sc.newcomers == {1} and sc.initial == {0, 2}
    assert sc.membership_at(1) == {0, 2}
    assert sc.membership_at(2) == sc.membership_at(4) == {0, 1, 2}
    assert sc.membership_at(5) == {0, 2}


def test_a_scenario_where_every_worker_is_new_is_refused(tmp_path):
    message = error_of(tmp_path, "type = 'join'\nround = 2\nworker = 0",
                       "type = 'join'\nround = 2\nworker = 1", workers=2)
    assert "no worker would be alive at the start" in message
