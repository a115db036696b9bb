"""The round protocol (``training.rounds``) alone: a recording host, workers that only log,
and a scenario's world; no transport, no model, no clock."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from gasloc_emu.scenario.events import JoinEvent, LeaveEvent
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.world import World
from gasloc_emu.topology import LivingGraph, Topology
from gasloc_emu.training.rounds import RoundDriver

ROUNDS = 8


@dataclass
class Stats:
    round: int
    eval_loss: float | None = None


class LoggingWorker:
    """A worker that only says what the driver asked of it."""

    def __init__(self, name: str, log: list, eval_every: int = 0):
        self.name, self.log, self.eval_every = name, log, eval_every

    def run_round(self, t, on_compute_done=None, plan=None):
        self.log.append(("round", self.name, t))
        on_compute_done(0.25, True)
        return Stats(t)

    def should_eval(self, t):
        return self.eval_every > 0 and (t + 1) % self.eval_every == 0

    def evaluate(self, t):
        self.log.append(("evaluate", self.name, t))
        return 1.0

    def peer_joined(self, peer):
        self.log.append(("peer_joined", self.name, peer))

    def donate(self, joiner, t):
        self.log.append(("donate", self.name, joiner, t))

    def join(self, donor, t):
        self.log.append(("join", self.name, donor, t))


class RecordingHost:
    """Every step the driver takes, in order; ``stop_at``: the round whose start says stop."""

    def __init__(self, log: list, stop_at: int | None = None, release: bool = False):
        self.log, self.stop_at, self.release, self.joins = log, stop_at, release, 0

    def stop_requested(self):
        return self.stop_at is not None and len(self.rows()) >= self.stop_at

    def rows(self):
        return [e for e in self.log if e[0] == "report"]

    def await_fixings(self, t):
        self.log.append(("await", t))
        return not self.release

    def round_fixings(self, t):
        self.log.append(("fixings", t))
        return True

    def leave(self, t):
        self.log.append(("leave", t))

    def joiner(self, t):
        self.joins += 1
        return LoggingWorker(f"joiner{self.joins}", self.log)

    def due(self, plan, t):
        self.log.append(("due", t))
        return plan

    def begin(self, t):
        self.log.append(("begin", t))

    def compute_done(self, seconds, nominal):
        self.log.append(("computed", seconds, nominal))

    def evaluating(self, t):
        self.log.append(("evaluating", t))

    def report(self, t, stats):
        self.log.append(("report", t, stats.eval_loss))


def ring_world(scenario: Scenario | None) -> World:
    topo = Topology("ring", 4)
    return World(scenario, 4, ROUNDS, 0.0,
                 lambda rank, t, alive: LivingGraph(topo, lambda _t: alive).peers(rank, t),
                 lambda rank: sorted(j for e in topo.possible_edges if rank in e
                                     for j in e if j != rank))


def test_without_a_scenario_every_round_runs_in_protocol_order():
    log: list = []
    host = RecordingHost(log)
    done = RoundDriver(host, LoggingWorker("w", log, eval_every=4), None, 1, ROUNDS).run()
    assert done
    first = log[:5]
    assert first == [("due", 0), ("begin", 0), ("round", "w", 0), ("computed", 0.25, True),
                     ("report", 0, None)]
    assert [e[1] for e in host.rows()] == list(range(ROUNDS))
    # evaluation after the round's exchange, before its row, on rounds 3 and 7
    assert [e for e in log if e[0] in ("evaluating", "evaluate")] == [
        ("evaluating", 3), ("evaluate", "w", 3), ("evaluating", 7), ("evaluate", "w", 7)]
    assert [e[2] for e in host.rows()] == [None, None, None, 1.0, None, None, None, 1.0]


def test_a_stop_ends_the_rounds_before_the_next_one():
    log: list = []
    done = RoundDriver(RecordingHost(log, stop_at=3), LoggingWorker("w", log), None, 0,
                       ROUNDS).run()
    assert not done
    assert [e[1] for e in log if e[0] == "report"] == [0, 1, 2]


def test_a_rejoining_process_starts_at_its_first_round():
    log: list = []
    RoundDriver(RecordingHost(log), LoggingWorker("w", log), None, 0, ROUNDS).run(first=5)
    assert [e[1] for e in log if e[0] == "report"] == [5, 6, 7]


def test_leave_and_join_at_rounds():
    """Worker 2 leaves at round 3 and joins again at 6 from worker 1: the host hears the leave,
    nothing runs while it is away, the joiner takes the donor's parameters, and the donor
    donates at the same round."""
    sc = Scenario((LeaveEvent(worker=2, round=3), JoinEvent(worker=2, round=6, from_worker=1)),
                  4, ROUNDS)
    world = ring_world(sc)
    log2: list = []
    leaver = RoundDriver(RecordingHost(log2), LoggingWorker("w2", log2), world, 2, ROUNDS)
    assert leaver.run()
    assert ("leave", 3) in log2
    rounds = [(e[1], e[2]) for e in log2 if e[0] == "round"]
    assert rounds == [("w2", 0), ("w2", 1), ("w2", 2), ("joiner1", 6), ("joiner1", 7)]
    assert ("join", "joiner1", 1, 6) in log2
    assert log2.index(("join", "joiner1", 1, 6)) < log2.index(("round", "joiner1", 6))
    assert leaver.worker.name == "joiner1"

    log1: list = []
    RoundDriver(RecordingHost(log1), LoggingWorker("w1", log1), world, 1, ROUNDS).run()
    donation = ("donate", "w1", 2, 6)
    assert donation in log1
    assert log1.index(("begin", 6)) < log1.index(donation) < log1.index(("round", "w1", 6))
    # the joiner is a new process: every worker renews its way to it before sending anything
    # of round 6 (the donor's copy included), and only then
    renewal = ("peer_joined", "w1", 2)
    assert [e for e in log1 if e[0] == "peer_joined"] == [renewal]
    assert log1.index(("begin", 6)) < log1.index(renewal) < log1.index(donation)
    log3: list = []
    RoundDriver(RecordingHost(log3), LoggingWorker("w3", log3), world, 3, ROUNDS).run()
    assert [e for e in log3 if e[0] == "peer_joined"] == [("peer_joined", "w3", 2)]
    assert ("peer_joined", "joiner1", 2) not in log2


@pytest.mark.parametrize("release", [False, True])
def test_the_round_fixings_are_asked_only_under_events_at_a_time(release):
    """Without a fixer (events at rounds only) the host is never asked for fixings."""
    sc = Scenario((LeaveEvent(worker=2, round=3),), 4, ROUNDS)
    log: list = []
    RoundDriver(RecordingHost(log, release=release), LoggingWorker("w", log), ring_world(sc),
                0, ROUNDS).run()
    assert not [e for e in log if e[0] in ("await", "fixings")]
    assert [e[1] for e in log if e[0] == "report"] == list(range(ROUNDS))
