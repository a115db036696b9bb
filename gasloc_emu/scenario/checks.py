"""What the runners cannot play, refused before the run: one clock per kind of event, donors a
joiner can reach, partitions the algorithm can run through.
"""
from __future__ import annotations

import math

from gasloc_emu.scenario.events import (
    JoinEvent,
    LeaveEvent,
    LinkEvent,
    PartitionEvent,
    ScenarioError,
    SpeedEvent,
)
from gasloc_emu.scenario.fixing import TIMED_KINDS
from gasloc_emu.scenario.links import edge_key
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.trace import LinkTrace
from netem.shapers import turned_off


def churns(scenario: Scenario) -> bool:
    """Whether the scenario's workers leave or join."""
    return any(isinstance(ev, (LeaveEvent, JoinEvent)) for ev in scenario.events)


def check_supported(scenario: Scenario, trace: LinkTrace | None = None) -> None:
    """Refuse, before the run, what the runners cannot do yet (one line, exit 2)."""
    _check_one_clock(scenario)
    _check_timed_donors(scenario)
    for ev in scenario.events:
        if isinstance(ev, LinkEvent) and ev.loss_pct is not None:
            raise ScenarioError(f"{scenario.source}: link event at {ev.when()}: loss_pct = "
                                f"{ev.loss_pct:g} is not applied (neither the simulator nor the "
                                "userspace shaper models loss); give only rate_mbit and "
                                "latency_ms")
        if isinstance(ev, JoinEvent) and ev.worker >= scenario.workers:
            raise ScenarioError(f"{scenario.source}: join of worker {ev.worker}: the run has "
                                f"ids 0..{scenario.workers - 1}; count a new worker in workers "
                                f"(workers = {ev.worker + 1}): a worker whose first event is a "
                                "join is absent from the start until then")
    _check_one_clock_per_link(scenario, trace)
    _check_one_trigger_per_speed(scenario)


def _check_one_trigger_per_speed(scenario: Scenario) -> None:
    """A worker's speed set both at rounds and at times would take whichever came last, which
    depends on how fast the run goes: refused."""
    by_round = {ev.worker for ev in scenario.round_events if isinstance(ev, SpeedEvent)}
    for ev in scenario.time_events:
        if isinstance(ev, SpeedEvent) and ev.worker in by_round:
            raise ScenarioError(f"{scenario.source}: worker {ev.worker}'s speed is set both at "
                                f"rounds and at a time ({ev.when()}); give its speed events "
                                "one trigger")


def _check_one_clock_per_link(scenario: Scenario, trace: LinkTrace | None) -> None:
    """A link changed both at rounds and at times would take whichever came last, which
    depends on how fast the run goes: refused."""
    by_round = {link for ev in scenario.round_events if isinstance(ev, LinkEvent)
                for link in ev.links}
    timed = [(link, ev) for ev in scenario.time_events if isinstance(ev, LinkEvent)
             for link in ev.links]
    timed += [(link, None) for link in (trace.points if trace is not None else ())]
    for link, ev in timed:
        if link in by_round:
            what = f"a link event at {ev.when()}" if ev is not None else trace.source
            raise ScenarioError(f"{scenario.source}: link {link[0]}->{link[1]} is changed both "
                                f"by round and by time ({what}); use one clock per link")


def _check_one_clock(scenario: Scenario) -> None:
    """Leaves, joins and partitions all by round or all at a time: an event at a time is fixed
    at a round only as the run goes, so its order against one by round is not known before."""
    kinds = {ev.by_round: ev for ev in scenario.events if isinstance(ev, TIMED_KINDS)}
    if len(kinds) == 2:
        timed, by_round_ev = kinds[False], kinds[True]
        raise ScenarioError(f"{scenario.source}: {timed.kind} event at {timed.when()} and "
                            f"{by_round_ev.kind} event at {by_round_ev.when()}: leave, join and "
                            "partition events must all use round or all use at_s (a time is "
                            "fixed at a round only as the run goes)")


def _check_timed_donors(scenario: Scenario) -> None:
    """A join at a time whose named donor a partition cuts from it at that time is refused."""
    parts = [ev for ev in scenario.time_events if isinstance(ev, PartitionEvent)]
    for ev in scenario.time_events:
        if not isinstance(ev, JoinEvent) or ev.from_worker is None:
            continue
        for p in parts:
            holds = p.at_s <= ev.at_s and (p.end_s is None or ev.at_s < p.end_s)
            if holds and edge_key(ev.worker, ev.from_worker) in {edge_key(*link)
                                                              for link in p.cut_links()}:
                raise ScenarioError(
                    f"{scenario.source}: join of worker {ev.worker} at {ev.when()} from worker "
                    f"{ev.from_worker}: the partition at {p.when()} cuts them apart then; name a "
                    "donor in the joiner's group")


def check_with_config(scenario: Scenario, cfg, algo, trace: LinkTrace | None = None) -> None:
    """What a scenario (and a link trace) cannot be combined with (one line, exit 2)."""
    if trace is not None and turned_off(cfg.net.shaper):
        raise ScenarioError(f"{trace.source} with net.shaper = 'none' would not be applied; "
                            "choose net.shaper = 'auto' or 'userspace'")
    # a host lost without warning is a departure too (``scenario.hostloss``)
    churn = churns(scenario) or cfg.run.on_worker_loss == "continue"
    why = algo.scenario_refusal(cfg, churn)
    if why:
        raise ScenarioError(f"{scenario.source}: {why}")
    _check_partitions_for(scenario, cfg, algo)
    timed_speed = [ev for ev in scenario.time_events if isinstance(ev, SpeedEvent)]
    if timed_speed and cfg.compute.inner_budget_s > 0:
        raise ScenarioError(f"{scenario.source}: speed event at {timed_speed[0].when()} with "
                            f"compute.inner_budget_s = {cfg.compute.inner_budget_s:g}: the steps "
                            "a budget allows would depend on how fast the run goes; give it a "
                            "round (round = R)")
    if churn and cfg.fault.worker >= 0:
        raise ScenarioError(f"{scenario.source}: workers leave or join, and fault.worker = "
                            f"{cfg.fault.worker} injects a failure too; use one or the other")
    _check_checkpoint_joins(scenario, cfg, algo)


def checkpoint_rounds_before(scenario: Scenario, worker: int, t: int, every: int) -> list[int]:
    """The rounds before t that end with a checkpoint (every K rounds: K-1, 2K-1, ...; the
    rule of ``training.checkpoint.due``) and in which ``worker`` takes part: those it has
    files of. ``scenario``: by round (a world's view, its timed events fixed so far)."""
    if every <= 0:
        return []
    return [r for r in range(every - 1, t, every) if worker in scenario.membership_at(r)]


def _check_checkpoint_joins(scenario: Scenario, cfg, algo) -> None:
    """A join from a checkpoint needs checkpoints, a worker that wrote one before it left
    (at a round: checked here; at a time: the round is known only as the run goes, and
    without one it joins from a donor, ``World``), and an algorithm whose state between
    rounds is each worker's own: an all-reduce's shared state (DiLoCo's momentum) taken
    from an old checkpoint would differ from the others'."""
    every = cfg.run.checkpoint_every
    for ev in scenario.events:
        if not (isinstance(ev, JoinEvent) and ev.from_checkpoint):
            continue
        head = f"{scenario.source}: join of worker {ev.worker} at {ev.when()} from its checkpoint"
        if every == 0:
            raise ScenarioError(f"{head}: the run writes none; set run.checkpoint_every")
        if algo.groups_all_reduce():
            raise ScenarioError(f"{head}: {algo.name} shares its outer state across workers, "
                                "which an old checkpoint would not match; join from a donor")
        if ev.by_round and not checkpoint_rounds_before(scenario, ev.worker, ev.round, every):
            raise ScenarioError(f"{head}: it takes part in no checkpoint round before it "
                                f"(every {every} rounds: {every - 1}, {2 * every - 1}, ...)")


def _check_partitions_for(scenario: Scenario, cfg, algo) -> None:
    """An algorithm that all-reduces within each group (DiLoCo): a living worker in neither
    group would have no ring (it reaches both sides, which cannot reach each other). Link
    events need a shaper."""
    flaps = scenario.faults is not None and any(
        s.kind == "link_flap" for s in scenario.faults.spec.sources)
    if flaps and algo.groups_all_reduce():
        raise ScenarioError(f"{scenario.source}: faults.link_flap cannot be played with "
                            f"{algo.name}: a flap cuts one link, and with {algo.name} every "
                            "living worker must be in one group of a cut; use partition "
                            "faults")
    for ev in scenario.events:
        if isinstance(ev, LinkEvent) and turned_off(cfg.net.shaper):
            raise ScenarioError(f"{scenario.source}: link event at {ev.when()} with "
                                "net.shaper = 'none' would not be applied; choose net.shaper = "
                                "'auto' or 'userspace'")
        if not isinstance(ev, PartitionEvent) or not algo.groups_all_reduce():
            continue
        named = set(ev.groups[0] + ev.groups[1])
        for when, alive in _alive_during(scenario, ev, cfg.run.rounds):
            stray = sorted(alive - named)
            if stray:
                raise ScenarioError(f"{scenario.source}: partition at {ev.when()}: worker "
                                    f"{stray[0]} is alive {when} and in neither group; "
                                    f"with {algo.name} every living worker must be in one "
                                    "group")


def _alive_during(scenario: Scenario, p: PartitionEvent, rounds: int):
    """(when, who is alive then) over a partition: each of its rounds, or (at a time) each
    membership the scenario's leaves and joins at a time give while it holds."""
    if p.by_round:
        end = p.end_round if p.end_round is not None else rounds
        yield from ((f"in round {t}", scenario.membership_at(t)) for t in range(p.round, end))
        return
    end_s = math.inf if p.end_s is None else p.end_s
    spans = [(0.0, scenario.initial), *scenario.time_members]
    for k, (start_s, alive) in enumerate(spans):
        next_s = spans[k + 1][0] if k + 1 < len(spans) else math.inf
        if start_s < end_s and next_s > p.at_s:
            yield f"at {max(start_s, p.at_s):g} s", alive
