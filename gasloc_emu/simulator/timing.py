"""``simulate --timing-only``: the same run's timeline without training.

``simulate`` trains every worker and reports what each did to the virtual clock
(``virtual_clock``). What a worker of a round-based algorithm does in time does not depend on
the values it trains when its steps have a nominal time (``compute.step_time_s`` > 0) and its
messages have a size known before the run (every codec's frames: ``Codec.nbytes``): each
round is a compute of the compute model's time (``training.compute.InnerPhase``, counted as
the simulator's worker counts it), then the messages the algorithm's outer step sends and
receives (its ``exchange``, in program order), each of the size the wire schema gives it
(``transport.schema.WireSchema``), then the round's row. This module writes those steps for
every worker and hands them to the same ``VirtualClock`` (as its ``source``), with the same link
model (the plan's, the TCP-aware one included), cores and scenario timelines, so the times are
``simulate``'s to the float, with no model, thread or tensor.

What it does not model is refused before the run, one line naming the setting (``refusal``).
Its record is ``simulate``'s files with no loss in them: metrics rows with ``train_loss`` null,
no eval losses, and the summary's ``losses`` = ``'none (timing only)'``.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import time
from array import array
from functools import lru_cache
from pathlib import Path

from gasloc_emu.config import ConfigError
from gasloc_emu.plan import RunPlan
from gasloc_emu.report.records import RunRecord
from gasloc_emu.report.schema import LinkRow, MetricRow, RunSummary
from gasloc_emu.report.summary import run_summary
from gasloc_emu.simulator.virtual_clock import Compute, Done, Mark, Recv, Send, VirtualClock
from gasloc_emu.training import compute as compute_mod
from gasloc_emu.training.drivers import Rounds
from gasloc_emu.training.model import count_parameters, shape_from_config
from gasloc_emu.training.recipe import schedule_for
from gasloc_emu.training.worker import build_algorithm
from gasloc_emu.transport.schema import RING_PHASES, WireSchema, chunk_sizes, ring_chunk

LOSSES = "none (timing only)"   # the summary's ``losses``
_ITEMSIZE = {"float32": 4, "uint8": 1}
# A worker's round of more messages than this is handed to the clock this many messages at a
# time (``_Stream``): a ring All-Reduce's 2 (N - 1) sends and as many receives per worker,
# made for every worker at the round's start, were most of the replay's memory (N^2 steps)
CHUNK_MESSAGES = 256


def refusal(plan: RunPlan) -> str | None:
    """Why ``--timing-only`` cannot time this run as ``simulate`` would (one line naming the
    setting and what is allowed), or None."""
    cfg = plan.cfg
    if not isinstance(plan.drive, Rounds):
        return (f"algo.name = {cfg.algo.name} has no rounds; --timing-only times round-based "
                "algorithms (gasloc, diloco, dsgd, local-gossip)")
    if cfg.compute.step_time_s <= 0:
        return ("compute.step_time_s = 0 (steps measured while training); --timing-only needs "
                "a nominal step time: --step-time-s T with T > 0")
    if cfg.fault.worker >= 0:
        return (f"fault.worker = {cfg.fault.worker}: an injected failure is a training run's; "
                "--timing-only takes fault.worker = -1")
    if cfg.run.checkpoint_every:
        return (f"run.checkpoint_every = {cfg.run.checkpoint_every}: --timing-only has no state "
                "to checkpoint; set it to 0")
    world = plan.world
    if world is not None and (world.reshapes or world.fixer is not None):
        return ("run.scenario: leaves, joins and partitions are not timed by --timing-only; "
                "it takes link, speed and pause events (by round or at a time) and link traces")
    if plan.algo.reduces_in_background(cfg.algo):
        return (f"algo.overlap = {cfg.algo.overlap} with {cfg.algo.name}: its background "
                "All-Reduce is not timed by --timing-only; set algo.overlap = 0")
    if _instance(plan, 0).exchange(0, cfg.run.rounds == 1, plan.codec) is None:
        return (f"algo.name = {cfg.algo.name} does not declare its messages (``exchange``); "
                "--timing-only times gasloc, diloco, dsgd and local-gossip")
    return None


def check(plan: RunPlan) -> None:
    """Raise a ConfigError (exit 2) when ``refusal`` has a reason."""
    reason = refusal(plan)
    if reason is not None:
        raise ConfigError(f"simulate --timing-only: {reason}")


class _Size:
    """Bytes of each message on the wire and before compression, as each receiver's wire
    schema has them (built for the receivers that get one, when they do).

    A ring All-Reduce's message (``rs<s>``, ``ag<s>``) from a worker to the next one on the
    ring in rank order (the schema's ring: timing-only runs have no leaves, joins or
    partitions) is, by ``WireSchema.wire_of``, a function of its phase and its chunk's length
    (one of two: ``chunk_sizes``): its sizes are kept by (phase, length), asked of the
    receiver's schema the first time, and that schema is not kept. Kept by (sender, receiver,
    kind) with every receiver's schema, as other kinds are, they grew as N^2 (the ring's
    4 N (N - 1) messages a round, each receiver's schema a table of the 2 (N - 1) ring
    kinds)."""

    def __init__(self, plan: RunPlan, numel: int):
        self.plan, self.numel, self.schemas = plan, numel, {}
        self.cache: dict[tuple, tuple[int, int]] = {}
        # the kinds whose size is the same on every link (asked once, not per message)
        self.fixed = {*plan.algo.wire_kinds(numel, plan.algorithm.params), "z"}

        # the sizes of those kinds, by kind, as found (``_Program.round`` reads it first)
        self.by_kind: dict[str, tuple[int, int]] = {}
        workers = plan.cfg.workers
        self.workers = workers
        # the ring's kinds, as the schema names them: {kind: (phase, step)}
        self.ring = {f"{phase}{s}": (phase, s) for phase in RING_PHASES
                     for s in range(workers - 1)}
        self.chunks = chunk_sizes(numel, workers)
        self.ring_cache: dict[tuple[str, int], tuple[int, int]] = {}

    def of(self, src: int, dst: int, round_idx: int, kind: str) -> tuple[int, int]:
        fixed = kind in self.fixed
        if not fixed:
            step = self.ring.get(kind)
            if step is not None and dst == (src + 1) % self.workers:
                ring_key = (step[0], self.chunks[ring_chunk(*step, src, self.workers)])
                sizes = self.ring_cache.get(ring_key)
                if sizes is None:
                    sizes = self.ring_cache[ring_key] = self._wire(src, dst, round_idx, kind,
                                                                   keep=False)
                return sizes
        key = (kind,) if fixed else (src, dst, kind)
        sizes = self.cache.get(key)
        if sizes is None:
            sizes = self.cache[key] = self._wire(src, dst, round_idx, kind)
            if fixed:
                self.by_kind[kind] = sizes
        return sizes

    def _wire(self, src: int, dst: int, round_idx: int, kind: str,
              keep: bool = True) -> tuple[int, int]:
        plan = self.plan
        schema = self.schemas.get(dst)
        if schema is None:
            schema = WireSchema(
                dst, plan.cfg.workers, self.numel,
                extra=plan.algo.wire_kinds(self.numel, plan.algorithm.params),
                codec=plan.codec, compressed=plan.algo.compressed_kinds)
            if keep:
                self.schemas[dst] = schema
        wire = schema.wire_of(src, kind, round_idx)
        if wire is None:
            raise RuntimeError(f"worker {src} sends {kind!r} of round {round_idx} to worker "
                               f"{dst}, which its wire schema does not allow")
        values = math.prod(wire.shape)
        return values * _ITEMSIZE[wire.dtype], 4 * (wire.values or values)


class _Ranks:
    """A stand-in transport for an algorithm instance that only says which messages it would
    send (``exchange``) and to whom (``peers``)."""

    def __init__(self, world_size: int):
        self.world_size = world_size


def _instance(plan: RunPlan, rank: int):
    """Worker ``rank``'s algorithm, built as ``training.Worker`` builds it, never begun."""
    return build_algorithm(plan, rank, _Ranks(plan.cfg.workers))


@lru_cache(maxsize=4096)
def _phase(model: compute_mod.ComputeModel, fixed_steps: int) -> tuple[int, float]:
    """(steps, compute seconds) of one inner phase, counted as the simulator's worker counts
    it (an ``InnerPhase`` without pacing: nominal steps take their nominal time)."""
    phase = compute_mod.InnerPhase(model, fixed_steps, lambda: 0.0, None)
    while phase.another():
        phase.step_done()
    return phase.steps, phase.elapsed_s()


class _KindIds(dict):
    """{kind: its number} for every kind the workers' messages have, numbered as first seen;
    ``names[number]`` is the kind, one string for all the workers (each worker's
    ``exchange`` makes its own)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __missing__(self, kind: str) -> int:
        number = self[kind] = len(self.names)
        self.names.append(kind)
        return number


class _Stream:
    """The messages of one worker's round not handed to the clock yet, packed: per message
    its peer, round and kind's number in arrays and whether it sends in a byte (13 bytes,
    where the algorithm's list of ``Message`` tuples and their kinds' strings take some
    100), and the round's row, whose byte counts are filled in as the messages go."""

    __slots__ = ("peers", "rounds", "kinds", "sends", "names", "count", "pos", "row")

    def __init__(self, messages: list, ids: _KindIds, row: dict):
        peers, rounds, kinds, sends = zip(*messages, strict=True)
        self.peers, self.rounds = array("i", peers), array("i", rounds)
        self.kinds, self.names = array("i", map(ids.__getitem__, kinds)), ids.names
        self.sends = bytes(map(bool, sends))
        self.count, self.pos, self.row = len(messages), 0, row

    def next(self, count: int):
        """The next ``count`` messages (fewer at the end) as (peer, round, kind, sends)."""
        lo = self.pos
        hi = self.pos = min(lo + count, self.count)
        return zip(self.peers[lo:hi], self.rounds[lo:hi],
                   map(self.names.__getitem__, self.kinds[lo:hi]), self.sends[lo:hi],
                   strict=True)

    def done(self) -> bool:
        return self.pos == self.count


class _Program:
    """One worker's steps for the clock, a round at a time (the clock's ``source``); a round
    of more than ``CHUNK_MESSAGES`` messages goes in pieces (``_Stream``): its compute, then
    that many messages at each call, the last piece ending with the round's row. The clock
    asks for more only when a lane is ready with no step left, and takes the steps in the
    same order, so the pieces are timed as the whole round would be."""

    # thousands of programs, each read every round: slots keep each one's state in one block
    __slots__ = ("plan", "rank", "sizes", "counted", "algo", "model", "fixed", "rounds", "t",
                 "step", "tokens_per_step", "schedule", "links", "_phase", "kind_ids",
                 "stream")

    def __init__(self, plan: RunPlan, rank: int, sizes: _Size, tokens_per_step: int,
                 counted: dict, kind_ids: _KindIds | None = None):
        cfg = plan.cfg
        self.plan, self.rank, self.sizes, self.counted = plan, rank, sizes, counted
        self.kind_ids = _KindIds() if kind_ids is None else kind_ids
        self.stream: _Stream | None = None   # the round in pieces, while it is handed over
        self.algo = _instance(plan, rank)
        self.model = plan.compute.models[rank]
        self.fixed = plan.compute.fixed_steps[rank]
        self.rounds, self.t, self.step = cfg.run.rounds, 0, 0
        self.tokens_per_step = tokens_per_step
        steps = plan.steps
        self.schedule = schedule_for(cfg.algo.inner, None if steps is None
                                     else steps[rank] * cfg.run.rounds)
        self.links: dict[int, list[int]] = {}   # counted[(rank, peer)] by peer
        self._phase = None    # (model, steps, compute seconds, its Compute) of the last round

    def __call__(self, lane: int) -> list | None:
        if self.stream is not None:
            return self.more()
        t = self.t
        if t > self.rounds:
            return None
        self.t += 1
        return [Done()] if t == self.rounds else self.round(t)

    def phase(self) -> tuple[int, float, Compute]:
        """(steps, compute seconds, the Compute step) of this round's inner phase: the last
        round's while the model is the same (a frozen step is the same step every round)."""
        model = self.model
        if self._phase is None or self._phase[0] is not model:
            steps, compute_s = _phase(model, self.fixed)
            self._phase = (model, steps, compute_s, Compute(compute_s, model.nominal))
        return self._phase[1:]

    def round(self, t: int) -> list:
        ops = []
        world = self.plan.world
        if world is not None:   # a scenario's speed and pause by round (``Worker.begin_round``)
            rp = world.plan(self.rank, t)
            if rp.speed is not None:
                self.model = dataclasses.replace(self.model, speed=rp.speed)
            if rp.pause_s > 0:
                ops.append(Compute(rp.pause_s, dedicated=True, idle=True))
        steps, compute_s, compute = self.phase()
        self.step += steps
        ops.append(compute)
        messages = self.algo.exchange(t, t == self.rounds - 1, self.plan.codec)   # a list
        row = {"worker": self.rank, "round": t, "step": self.step, "train_loss": None,
               "compute_s": compute_s, "comm_s": 0.0, "wait_s": 0.0, "bytes_sent": 0,
               "bytes_recv": 0, "peers": self.algo.peers(t), "steps": steps,
               "speed": self.model.speed, "overruns": 0, "overrun_ratio": 0.0,
               "tokens": steps * self.tokens_per_step}
        if self.schedule is not None:
            row["lr"] = self.schedule.lr_at(max(0, self.step - 1))
        if len(messages) > CHUNK_MESSAGES:
            self.stream = _Stream(messages, self.kind_ids, row)
            return ops
        self.steps_of(messages, ops, row)
        ops.append(Mark(row))
        return ops

    def more(self) -> list:
        """The next piece of a round in pieces (``_Stream``), the last with the round's row."""
        stream, ops = self.stream, []
        self.steps_of(stream.next(CHUNK_MESSAGES), ops, stream.row)
        if stream.done():
            ops.append(Mark(stream.row))
            self.stream = None
        return ops

    def steps_of(self, messages, ops: list, row: dict) -> None:
        """Append the clock's step of each message ((peer, round, kind, sends), in program
        order) to ``ops``, count what it sends on its links and add the bytes it sends and
        receives to the round's ``row``."""
        sent = received = 0
        rank, append = self.rank, ops.append
        by_kind, size_of = self.sizes.by_kind, self.sizes.of
        for peer, r, kind, sends in messages:
            if sends:
                nbytes, raw = by_kind.get(kind) or size_of(rank, peer, r, kind)
                append(Send((peer, rank, r, kind), nbytes))
                sent += nbytes
                link = self.links.get(peer) or self._link(peer)
                link[0] += nbytes
                link[1] += raw
            else:
                received += (by_kind.get(kind) or size_of(peer, rank, r, kind))[0]
                append(Recv((rank, peer, r, kind)))
        row["bytes_sent"] += sent
        row["bytes_recv"] += received

    def _link(self, peer: int) -> list[int]:
        """[bytes, raw bytes] sent to ``peer`` so far, in the shared table (made at the
        first message)."""
        link = self.links[peer] = self.counted.setdefault((self.rank, peer), [0, 0])
        return link


def timing_clock(plan: RunPlan, emit=None) -> tuple[VirtualClock, dict]:
    """The clock of ``plan`` with every worker's program as its source, and the table it fills
    of bytes per directed link ({(src, dst): [bytes, raw bytes]}); ``clock.run()`` plays it."""
    from gasloc_emu.simulator.simulate import cpu_slots, timed_self
    cfg = plan.cfg
    numel = count_parameters(cfg.model)
    sizes, counted = _Size(plan, numel), {}
    tokens = (cfg.algo.inner.micro_batches * cfg.data.batch_size
              * shape_from_config(cfg.model).block_size)
    kind_ids = _KindIds()
    programs = [_Program(plan, r, sizes, tokens, counted, kind_ids)
                for r in range(cfg.workers)]
    clock = VirtualClock(cfg.workers, plan.link_model, cpu_slots(cfg), emit,
                         timed_self=timed_self(plan),
                         source=lambda lane: programs[lane](lane))
    return clock, counted


def play(clock: VirtualClock) -> None:
    """``clock.run()`` with Python's cyclic garbage collector paused: the replay allocates
    millions of small objects that hold no cycles (steps, rows, keys), and each of the
    collector's full passes walks the whole heap, which grows with N (at 4096 workers the
    passes took a third of the replay's CPU time); it is switched back on, as it was, however the
    replay ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        clock.run()
    finally:
        if enabled:
            gc.enable()


def simulate_timing(plan: RunPlan, out: str | Path, progress=None) -> RunSummary:
    """Time ``plan`` without training (the module docstring) and write its record under
    ``out``; refused settings raise a ConfigError before anything is written."""
    check(plan)
    from gasloc_emu.scenario.observed import event_feed, membership_summary
    from gasloc_emu.simulator.simulate import _tcp_model_record, cpu_slots, predicts_wall
    cfg, t_start = plan.cfg, time.perf_counter()
    world = plan.world
    with RunRecord(Path(out), cfg) as rec:
        rec.faults(world)
        feed = event_feed(world, rec, progress, shaper="simulate: link model by round and time")

        def emit(row: dict) -> None:
            row = MetricRow.from_round(row)
            if feed is not None:
                feed.row(row)
            rec.metric(row)
            if progress is not None:
                progress(row)

        clock, counted = timing_clock(plan, emit)
        play(clock)
        if not clock.finished():
            raise RuntimeError("the timing simulation stalled: a worker waits for a message "
                               "no worker sends")
        sent = sum(b for b, _ in counted.values())
        raw = sum(r for _, r in counted.values())
        busy = clock.link_busy_s
        links = [LinkRow.moved(src, dst, b, r, busy.get((src, dst)))
                 for (src, dst), (b, r) in sorted(counted.items()) if b]
        rec.write_json("links.json", {"shaper": "simulate", "links": links,
                                      **_tcp_model_record(clock.link_model)})
        predicted = predicts_wall(cfg, plan.link_model)
        summary = run_summary(plan, time.perf_counter() - t_start, sent,
                              overruns=[0] * cfg.workers,
                              raw_bytes_sent=raw)
        summary = summary.replace(
            membership=None if world is None else membership_summary(world), mode="simulate",
            predicted_wall_s=clock.now_s if predicted else None,
            cpu_slots=cpu_slots(cfg) if predicted else None, losses=LOSSES)
        rec.summary(summary)
    return summary
