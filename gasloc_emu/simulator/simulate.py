"""N workers in one process: the same Worker and algorithms, an in-memory transport, a virtual
clock.

Each worker runs in its own thread but only one computes at a time (see ``transport.memory``),
so results are deterministic and equal to the multi-process emulator's for the same seed. Times
come from ``virtual_clock``, which replays what the threads did on the emulator's network and
cores.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gasloc_emu.config import Config, ConfigError, resolve
from gasloc_emu.plan import RunPlan
from gasloc_emu.report.records import RunRecord
from gasloc_emu.report.schema import LinkRow, MetricRow, RunSummary
from gasloc_emu.report.summary import drops_summary, final_summary, with_dead_sends
from gasloc_emu.scenario.events import ScenarioError
from gasloc_emu.scenario.faults import FaultTimeline, read_recorded
from gasloc_emu.scenario.fixing import Fixing
from gasloc_emu.scenario.hostloss import HostBack, HostLoss, HostLossError, in_decided_order
from gasloc_emu.scenario.observed import event_feed, membership_summary
from gasloc_emu.scenario.world import RoundPlan
from gasloc_emu.simulator.async_sim import simulate_async
from gasloc_emu.simulator.batched import BatchedInner
from gasloc_emu.simulator.memory import Hub, LinkModel
from gasloc_emu.simulator.virtual_clock import slots_for
from gasloc_emu.training.checkpoint import Checkpoints, CheckpointWatch, ResumePoint
from gasloc_emu.training.devices import simulator_device, threads_per_worker
from gasloc_emu.training.drivers import Pairwise, Rounds
from gasloc_emu.training.model import build_model
from gasloc_emu.training.rounds import RoundDriver
from gasloc_emu.training.worker import Diverged, Worker
from gasloc_emu.transport.base import DEAD_PEER
from gasloc_emu.transport.faults import InjectedFault, plan_from_config, with_fault

STOP_GRACE_S = 30.0  # how long Ctrl-C waits for the worker threads to reach their next message

# progress(worker, round_stats_dict) is called after every round of every worker
Progress = Callable[[dict], None]


def simulate(plan: RunPlan, out: str | Path, progress: Progress | None = None,
             device: str | None = None, resume: ResumePoint | None = None,
             threads: tuple[int, ...] | None = None,
             dead: frozenset = frozenset()) -> RunSummary:
    """Run ``plan`` in one process, write the run record under ``out``, return the summary.
    ``resume``: go on from the checkpoints under ``out`` at that point (``--resume``);
    ``threads``: each worker's torch CPU threads, as a run's record has them (``--replay``:
    a worker on a host of its own ran with more than one sharing a host), for the workers
    that run in rounds (the per-worker simulator); ``dead``: (dst, src, round, kind) of the
    messages the run's workers did without, their senders lost with their hosts (``--replay``
    of a run that lost a host: ``scenario.hostloss``).

    Every worker runs on ``device`` (default: the first visible GPU under ``run.device``, else
    the CPU); they take turns, so one device is shared without contention. The links are the
    plan's model of them (none when unshaped: then the clock predicts nothing).
    """
    cfg = plan.cfg
    before = torch.get_num_threads()
    # as each emulator process does; batched, one computation at a time uses every core
    torch.set_num_threads((os.cpu_count() or 1) if cfg.sim.batched else threads_per_worker(cfg))
    run = SIMULATORS[type(plan.drive)]
    device = device or simulator_device(cfg.run.device)
    try:
        if resume is not None or run is _simulate:  # checkpoints are refused for the others
            return _simulate(plan, Path(out), progress, device, resume, threads, dead)
        return run(plan, Path(out), progress, device)
    finally:
        torch.set_num_threads(before)


def _simulate(plan: RunPlan, out: Path, progress, device: str,
              resume: ResumePoint | None = None,
              threads: tuple[int, ...] | None = None,
              dead: frozenset = frozenset()) -> RunSummary:
    cfg, t_start = plan.cfg, time.perf_counter()
    link_model, world = plan.link_model, plan.world
    slots = cpu_slots(cfg)
    checkpoints = Checkpoints(out) if cfg.run.checkpoint_every else None
    watch = CheckpointWatch(cfg.run.checkpoint_every, range(cfg.workers),
                            world.alive if world is not None else None)
    offset_s = resume.time_s if resume is not None else 0.0   # the run's clock goes on
    with RunRecord(Path(out), cfg, resume.round if resume is not None else None) as rec:
        rec.faults(world)
        feed = event_feed(world, rec, progress, shaper="simulate: link model by round and time")

        def emit(row: dict) -> None:  # the clock hands over each round once its time is settled
            if _died_before(world, row):
                return
            row = MetricRow.from_round(row | {"time_s": row["time_s"] + offset_s})
            if feed is not None:
                feed.row(row)
            rec.metric(row)
            if (keep_from := watch.row(row.worker, row.round)) is not None:
                checkpoints.prune(keep_from)   # every worker has two later rounds on disk
            if progress is not None:
                progress(row)

        timed = _TimedWorld(world) if world is not None and world.fixer is not None else None
        hub = Hub(cfg.workers, link_model, slots=slots, emit=emit,
                  background=plan.algo.reduces_in_background(cfg.algo),
                  timed_self=timed_self(plan), timed_world=timed,
                  threads=None if cfg.sim.batched else threads, dead=dead)
        if timed is not None:
            timed.hub = hub
        gate = batched_gate(plan, hub, device)
        lives = [_Life(plan, r, _transport(cfg, hub, r), device, gate, checkpoints, resume)
                 for r in range(cfg.workers)]
        threads = [threading.Thread(target=_worker_loop, name=f"sim-worker-{life.rank}",
                                    args=(life, hub), daemon=True)
                   for life in lives]
        for th in threads:
            th.start()
        try:
            for th in threads:
                th.join()
        except KeyboardInterrupt:
            hub.abort(KeyboardInterrupt())  # the workers stop at their next message
            _join_for(threads, STOP_GRACE_S)
            rec.summary(RunSummary.ended("stopped", "interrupted (Ctrl-C)", mode="simulate"))
            raise
        if hub.error is not None:
            for row in hub.clock.unsettled_rows():  # metrics up to the failure are kept
                rec.metric(MetricRow.from_round(row))
            rec.summary(_failure(hub.error))
            raise hub.error
        workers = [life.worker for life in lives if life.worker is not None]
        summary = finish(plan, workers, time.perf_counter() - t_start,
                         sent=sum(_sent(life.transport) for life in lives),
                         raw=sum(_sent(life.transport, "raw_bytes_sent") for life in lives))
        rec.write_json("links.json", {"shaper": "simulate",
                                      "links": _links(lives, hub.clock.link_busy_s),
                                      **_tcp_model_record(hub.clock.link_model)})
        predicted = predicts_wall(cfg, link_model)
        if world is not None and world.losses:   # a replay does without what its run did
            summary = summary.replace(drops=drops_summary(with_dead_sends(plan, {
                life.rank: {DEAD_PEER: n} if (n := len(life.transport.dead_peer_losses)) else {}
                for life in lives if life.worker is not None}, DEAD_PEER)))
        summary = summary.replace(
            membership=None if world is None else membership_summary(world), mode="simulate",
            predicted_wall_s=hub.clock.now_s + offset_s if predicted else None,
            cpu_slots=slots if predicted else None, resumed=_resumed(resume))
        rec.summary(summary)
    return summary


# how each drive (``training.drivers``) is simulated: rounds by worker threads in turn on the
# virtual clock; pairwise gossip on one event queue, since its pairings follow the clock
SIMULATORS = {Rounds: _simulate, Pairwise: simulate_async}


@dataclass(frozen=True)
class ReplaySource:
    """What ``simulate --replay`` takes from a run record: its config, the rounds its events
    at a time landed on, its random faults as drawn (faults.json; None without) and each
    worker's torch CPU threads (workers.json; None where the record does not say)."""

    cfg: Config
    fixings: list[Fixing]
    faults: FaultTimeline | None
    threads: tuple[int, ...] | None
    losses: tuple[HostLoss, ...] = ()   # hosts lost without warning (``scenario.hostloss``)
    dead: frozenset = frozenset()       # the messages done without then: (dst, src, round, kind)
    backs: tuple[HostBack, ...] = ()    # lost hosts that came back

    def play(self, world) -> None:
        """Play the run's fixings, then its hosts lost and back as node 0 decided them, in
        the order it did (by time; a loss before a return at the same time)."""
        world.replay(self.fixings)
        for x in in_decided_order(self.losses, self.backs):
            world.lose(x) if isinstance(x, HostLoss) else world.back(x)


def _died_before(world, row: dict) -> bool:
    """A row of a worker lost with its host, of a round it died in or after and before it
    came back (the replay of a run that lost a host computes those rounds, for the messages
    it sent before it died, but the run has no row of them)."""
    return world is not None and world.dead_in(row["worker"], row["round"])


def _recorded_dead(folder: Path) -> frozenset:
    """(dst, src, round, kind) of every message a worker of the run did without, its sender
    lost with its host: its rows' ``dead_peer`` (metrics.jsonl)."""
    out = set()
    try:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return frozenset()
    for line in lines:
        row = json.loads(line) if line.strip() else {}
        for src, round_idx, kind in row.get("dead_peer") or ():
            out.add((int(row["worker"]), int(src), int(round_idx), str(kind)))
    return frozenset(out)


def _recorded_threads(folder: Path, workers: int) -> tuple[int, ...] | None:
    """Each worker's threads from workers.json: None unless every worker has a count."""
    try:
        rows = json.loads((folder / "workers.json").read_text())
        counts = {int(r["rank"]): r.get("threads") for r in rows}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    threads = tuple(counts.get(rank) for rank in range(workers))
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in threads):
        return None
    return threads


def replay_source(run_dir: str) -> ReplaySource:
    """A run record's ``ReplaySource``; a ConfigError when it has nothing to replay."""
    folder = Path(run_dir)
    try:
        summary = json.loads((folder / "summary.json").read_text())
        cfg = resolve(folder / "config.toml")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--replay {run_dir}: not a readable run record ({exc})") from None
    try:
        faults = read_recorded(folder)
    except ScenarioError as err:
        raise ConfigError(f"--replay {run_dir}: {err}") from None
    fixings = (summary.get("membership") or {}).get("fixings")
    try:
        membership = summary.get("membership") or {}
        losses = tuple(HostLoss.from_json(x).check(cfg.workers, cfg.run.rounds) for x in
                       membership.get("host_losses") or ())
        backs = tuple(HostBack.from_json(x) for x in membership.get("host_backs") or ())
        dead = _recorded_dead(folder) if losses else frozenset()
    except (HostLossError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"--replay {run_dir}: a host loss is malformed ({exc})") from None
    if fixings is None and faults is None:
        raise ConfigError(f"--replay {run_dir}: its record has no fixings (no leave, join or "
                          "partition at a time; simulate its config.toml instead)")
    try:
        return ReplaySource(cfg, [Fixing.from_json(f) for f in fixings or ()], faults,
                            _recorded_threads(folder, cfg.workers), losses, dead, backs)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"--replay {run_dir}: a fixing is malformed ({exc})") from None


def _resumed(resume: ResumePoint | None) -> dict | None:
    """The summary's ``resumed`` block."""
    if resume is None:
        return None
    return {"round": resume.round, "time_s": resume.time_s, "refused": list(resume.skipped)}


def _tcp_model_record(link_model) -> dict:
    """Where messages were timed by their links' TCP (``netplan.TcpLinkModel``): per directed
    link, what their times were made of (serialisation, the window and slow start,
    retransmission, summed over the messages) and the restarts after idle; else nothing."""
    record = getattr(link_model, "record", None)
    return {"tcp_model": record()} if record is not None else {}


class _TimedWorld:
    """The simulator's side of ``fixing.RoundFixer``: the virtual clock's alarms fix a
    scenario's leaves, joins and partitions at a time, at rounds, in the shared ``World``, and
    wake the workers parked until a join (``virtual_clock``)."""

    def __init__(self, world):
        self.world, self.fixer, self.hub = world, world.fixer, None

    def next_alarm_s(self) -> float | None:
        alarms = self.fixer.alarms_s
        return alarms[0] if alarms else None

    def alarm(self, now_s: float) -> None:
        self.world.fix(self.fixer.due(now_s))
        for rank in range(self.world.workers):   # each looks again whether its join came
            self.hub.clock.unpark(rank)
        self.hub.cond.notify_all()

    def started(self, rank: int, round_idx: int) -> None:
        self.fixer.started(round_idx)

    def released(self) -> None:
        self.hub.cond.notify_all()


def timed_self(plan: RunPlan) -> dict:
    """{rank: (its SelfTimeline, the speed its thread computes at)} for the virtual clock."""
    if plan.world is None:
        return {}
    models = plan.compute.models
    return {r: (tl, models[r].speed) for r in range(plan.cfg.workers)
            if (tl := plan.world.timed_self(r)) is not None}


def batched_gate(plan: RunPlan, hub: Hub, device: str) -> BatchedInner | None:
    """The gate that batches every worker's inner phase (``sim.batched``), else None; its
    template model gives the structure only (``functional_call`` swaps in each row)."""
    if not plan.cfg.sim.batched:
        return None
    template, _ = build_model(plan.cfg.model, plan.cfg.seed, device)
    return BatchedInner(hub, template, plan.cfg.algo.inner, plan.cfg.workers)


def predicts_wall(cfg: Config, link_model: LinkModel | None) -> bool:
    """Whether the virtual clock's end is a prediction of ``run``'s wall-clock: with modelled
    links, or with nominal step times (unshaped transfers are then taken as instant). Batched
    steps measured on this machine are not: batching makes each worker's share faster than
    its own process would compute."""
    if cfg.sim.batched and cfg.compute.step_time_s == 0:
        return False
    return link_model is not None or cfg.compute.step_time_s > 0


def cpu_slots(cfg: Config) -> float:
    """How many workers the emulator can run at full speed at once on this machine.

    The simulator measures each worker's compute alone, with the emulator's thread count; the
    virtual clock shares these slots among the workers computing at the same virtual time, as
    the kernel shares the cores among the emulator's busy processes.
    """
    return slots_for(os.cpu_count() or 1, threads_per_worker(cfg))


def _failure(exc: BaseException) -> RunSummary:
    """The summary of a simulation that ``exc`` ended: diverged, or failed."""
    if isinstance(exc, Diverged):
        return RunSummary.ended("diverged", str(exc), diverged_at=exc.where, mode="simulate")
    return RunSummary.ended("failed", str(exc), mode="simulate")


def _transport(cfg: Config, hub: Hub, rank: int):
    """Worker ``rank``'s in-memory transport, failing where ``cfg.fault`` says.

    An injected exit ends the worker's thread (a thread cannot exit alone); a hang parks it
    until the hub's stall check sees that nobody can move and aborts the run.
    """
    plan = plan_from_config(cfg)

    def exit_(code: int) -> None:
        raise InjectedFault(f"{plan.describe()}: worker {rank} exited with code {code}")

    def hang() -> None:
        hub.hang(rank, plan.round)

    return with_fault(hub.transport(rank), plan, rank, exit_, hang)


class _Life:
    """One worker id over the run, the host of its rounds (``training.rounds.Host``): its
    transport, and the Worker while it is alive (a departed worker's state is gone; one that
    joins again starts afresh, as a new process would)."""

    def __init__(self, plan: RunPlan, rank: int, transport, device, gate=None,
                 checkpoints: Checkpoints | None = None, resume: ResumePoint | None = None):
        self.run_plan, self.cfg, self.rank, self.transport = plan, plan.cfg, rank, transport
        self.device, self.world, self.gate = device, plan.world, gate
        # a new worker (absent until its first join) has no state before it: one whose join
        # never comes is not among the workers the run ends with
        newcomers = self.world.scenario.newcomers if self.world and self.world.scenario else ()
        self.driver = RoundDriver(self, None if rank in newcomers else self.new_worker(),
                                  self.world, rank, plan.cfg.run.rounds, checkpoints)
        self.first = 0   # the first round it trains: after a resumed run's checkpoint
        if resume is not None:
            self.driver.worker.restore(checkpoints.load(rank, resume.round))
            self.first = resume.round + 1

    @property
    def worker(self) -> Worker | None:
        return self.driver.worker

    def new_worker(self) -> Worker:
        return Worker(self.run_plan, self.rank, self.transport, self.device, pace=False,
                      batched=self.gate)

    # -- the round protocol's steps on the virtual clock

    def stop_requested(self) -> bool:
        return False   # an abort reaches the thread at its next message (``Hub.abort``)

    def await_fixings(self, t: int) -> bool:
        """Parked, without holding up the clock, until an alarm fixes more events."""
        return self.transport.park()

    def round_fixings(self, t: int) -> bool:
        """Wait until the virtual clock reaches this worker's start of round t (the events due
        by then fixed at their rounds)."""
        self.transport.start_round(t)
        return True

    def leave(self, t: int) -> None:
        check_departure(self.cfg, self.rank, t)

    def joiner(self, t: int) -> Worker:
        return self.new_worker()

    def rejoined(self, t: int, round_idx: int, refused: tuple[str, ...]) -> None:
        for line in refused:   # a damaged file passed over for the one before it
            print(f"worker {self.rank}: refused {line}", file=sys.stderr)

    def due(self, plan: RoundPlan | None, t: int) -> RoundPlan | None:
        return plan   # the virtual clock applies speed and pause events at a time itself

    def begin(self, t: int) -> None:
        pass

    def compute_done(self, seconds: float, nominal: bool = False) -> None:
        self.transport.advance(seconds, nominal)

    def evaluating(self, t: int) -> None:
        pass

    def report(self, t: int, stats) -> None:
        self.transport.end_round(stats.as_dict())


def check_departure(cfg: Config, rank: int, t: int) -> None:
    """A scenario's departure ends the run when ``run.on_worker_loss = fail``."""
    if cfg.run.on_worker_loss == "fail":
        raise WorkerLost(f"worker {rank} left at round {t} (scenario) and "
                         "run.on_worker_loss = 'fail'")


class WorkerLost(RuntimeError):
    """A worker left and the configuration says the run cannot go on without it."""


def _join_for(threads: list[threading.Thread], grace_s: float) -> None:
    """Wait up to ``grace_s`` in all for the workers to stop: a worker thread still inside a
    torch kernel when the interpreter exits has its C++ state torn down under it, and the
    process then aborts (SIGABRT, "terminate called") instead of exiting with its own code."""
    deadline = time.monotonic() + grace_s
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))


def _worker_loop(life: _Life, hub: Hub) -> None:
    try:
        with hub.cond:  # holding the turn lock while computing; waits inside recv release it
            hub.take_turn(life.rank)
            if not life.driver.run(life.first):
                # released: absent to the end, its join never came. A worker parked at its
                # own leave round has not dropped its state yet; drop it now, as run's
                # released process sends no final report, so that its last model is not
                # counted among the living workers'
                life.driver.worker = None
            life.transport.finish()
    except BaseException as exc:  # noqa: BLE001 - any failure must stop every other worker
        hub.abort(exc)


def _sent(tp, key: str = "bytes_sent") -> int:
    return int(sum(tp.counters()[key].values()))


def _links(lives: list[_Life], busy_s: dict | None = None) -> list[LinkRow]:
    """Bytes on every directed link that carried traffic, and before compression, and the
    seconds the clock had it busy (``busy_s``, where links are modelled)."""
    rows = []
    busy_s = busy_s or {}
    for life in lives:
        counters = life.transport.counters()
        rows += [LinkRow.moved(life.rank, p, b, counters["raw_bytes_sent"].get(p, b),
                               busy_s.get((life.rank, p)))
                 for p, b in sorted(counters["bytes_sent"].items()) if b]
    return rows


def finish(plan: RunPlan, workers: list[Worker], wall_s: float, sent: int | None = None,
           raw: int | None = None) -> RunSummary:
    """Evaluate each worker and the average model; the numbers every run record ends with.
    ``workers``: those alive at the end; ``sent``, ``raw``: every worker's bytes on the wire
    and before compression (default: theirs)."""
    if sent is None:
        sent = sum(_sent(w.transport) for w in workers)
        raw = sum(_sent(w.transport, "raw_bytes_sent") for w in workers)
    last = plan.cfg.run.rounds - 1
    return final_summary(plan, [w.theta for w in workers], [w.evaluate(last) for w in workers],
                         workers[0].eval_set, wall_s, sent,
                         overruns=[w.overruns for w in workers], raw_bytes_sent=raw)
