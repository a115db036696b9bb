"""The entry point of one emulator worker process:
``python -m gasloc_emu.emulator.worker_process DIR RANK``.

It reads the resolved config and its ``LaunchSpec`` from the run directory, then follows the
run's protocol in three named steps (``WorkerProcess.serve``):

- connect: build the corpus and the data-plane transport, report its address (ready), wait for
  the launcher's start with every peer's address;
- train: the rounds, one metrics row to the launcher after each;
- report: evaluate, send the final parameters, wait for the launcher's exit.

It dies with the launcher (PR_SET_PDEATHSIG) and stops when told to, when a peer is lost, or on
any error, which it reports before exiting non-zero.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gasloc_emu.emulator.launch_spec import LEAVE_FLUSH_S, LaunchSpec
from gasloc_emu.netplan import dilate_state
from gasloc_emu.report.schema import MetricRow
from gasloc_emu.transport import orders

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the launcher dies, even by kill -9."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the heartbeat timeout still catches it
        return
    if os.getppid() == 1:  # the launcher died before prctl took effect
        os._exit(1)


class Heartbeat(threading.Thread):
    """Sends {round, step, state, peer} to the launcher every ``period_s`` from its own socket."""

    def __init__(self, ctx, addr: str, rank: int, period_s: float, probe, security=None):
        super().__init__(name="heartbeat", daemon=True)
        import zmq

        from gasloc_emu.transport import auth
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 4)
        if security is not None:  # the launcher's PULL authenticates every worker (ZAP)
            auth.make_client(self.sock, security, auth.user_id(rank), auth.LAUNCHER)
        self.sock.connect(addr)
        self.rank, self.period_s, self.probe = rank, period_s, probe
        self.halt = threading.Event()

    def run(self) -> None:
        import zmq

        from gasloc_emu.transport.control import Heartbeat, pack
        while not self.halt.wait(self.period_s):
            # zmq.Again: the launcher is busy; the next beat carries the same news
            with contextlib.suppress(zmq.Again):
                beat = Heartbeat(worker=self.rank, **self.probe())
                self.sock.send(pack(beat.to_wire()), zmq.NOBLOCK)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=2)
        self.sock.close()


@dataclass
class WorkerState:
    """What the heartbeat thread reports: the training thread writes it, the beat reads it."""

    round: int = -1
    step: int = 0
    phase: str = "starting"  # starting, joining, computing, communicating, evaluating, done
    transport: object = None  # the ZmqTransport once built: who we wait for, bytes per peer
    speed: float | None = None  # the compute model's speed of this worker, once training
    round_steps: int | None = None  # inner steps of the last finished round
    busy_s: float = 0.0  # compute + communication seconds of the finished rounds
    waited_s: float = 0.0  # of which waiting for peers

    def finished_round(self, stats) -> None:
        """Take in a finished round's ``RoundStats``: its steps and where its time went."""
        self.step, self.round_steps = stats.step, stats.steps
        self.busy_s += stats.compute_s + stats.comm_s
        self.waited_s += stats.wait_s

    def wait_share(self) -> float | None:
        """The share of the finished rounds' time spent waiting for peers; None before one."""
        return min(1.0, self.waited_s / self.busy_s) if self.busy_s > 0 else None

    def status(self) -> dict:
        tp = self.transport
        peer = tp.waiting_for if tp is not None else None
        phase = self.phase
        if phase == "communicating":
            phase = "waiting" if peer is not None else "sending"
        sent = dict(tp.bytes_sent) if tp is not None else {}  # cumulative, per peer: link meters
        # what the links delivered to this worker, by source (cumulative): the link meters
        arrived = {src: n for src, n in enumerate(list(tp.mailbox.delivered)) if n} \
            if tp is not None else {}
        # cumulative drops for the live display; the total is summed from this one copy of the
        # reasons, so the two agree even while the training thread drops another message
        reasons = dict(tp.counters().get("drop_reasons", {})) if tp is not None else {}
        return {"round": self.round, "step": self.step, "state": phase, "peer": peer,
                "sent": sent, "arrived": arrived, "dropped": sum(reasons.values()),
                "drop_reasons": reasons,
                "speed": self.speed, "round_steps": self.round_steps,
                "wait_share": self.wait_share()}


def main(argv: list[str], plan: bytes | None = None) -> int:
    """``plan``: the run plan its launcher handed the zygote this worker was forked from
    (``plan.handed``); None for a worker started on its own, which derives it from the
    record's config."""
    die_with_parent()
    run_dir, rank = Path(argv[0]), int(argv[1])
    rejoin = Rejoin(argv[2], int(argv[3])) if len(argv) == 4 else None
    spec = LaunchSpec.read(run_dir)
    from gasloc_emu.transport.auth import Security
    security = Security.from_env(spec.workers)  # the run's keys; taken out of os.environ
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
    import torch
    import torch._dynamo  # noqa: F401 - the first optimizer step imports it: before the start
    torch.set_num_threads(spec.threads)
    import zmq

    from gasloc_emu.transport.control import WorkerControl
    ctx = zmq.Context()
    ctl = WorkerControl(ctx, spec.ctl_addr, rank, security=security)
    try:
        return WorkerProcess(run_dir, rank, spec, ctx, ctl, rejoin, plan).serve()
    except BaseException as exc:  # noqa: BLE001 - report every failure to the launcher, then exit
        ctl.send(_error_report(exc, rank))
        return 1
    finally:
        ctl.close()
        ctx.term()


def _control():
    """``transport.control``, whose messages a worker sends: imported once torch may load (it
    imports torch; ``main`` sets OMP_NUM_THREADS first)."""
    from gasloc_emu.transport import control
    return control


def _error_report(exc: BaseException, rank: int):
    """The error message for the launcher; a divergence says where, so the run ends diverged."""
    worker = sys.modules.get("gasloc_emu.training.worker")  # not loaded: it cannot be a Diverged
    diverged = worker is not None and isinstance(exc, worker.Diverged)
    return _control().Error(rank, f"{type(exc).__name__}: {exc}",
                            exc.where if diverged else None)


@dataclass(frozen=True)
class Rejoin:
    """A departed worker's new process: it binds its predecessor's address, so that its peers'
    sockets reconnect by themselves, and takes part from round ``from_round``."""

    addr: str
    from_round: int


class WorkerProcess:
    """One worker's side of the run protocol: connect, train, report."""

    def __init__(self, run_dir: Path, rank: int, spec: LaunchSpec, ctx, ctl,
                 rejoin: Rejoin | None = None, plan: bytes | None = None):
        from gasloc_emu import config
        self.rank, self.spec, self.ctx, self.ctl, self.rejoin = rank, spec, ctx, ctl, rejoin
        self.handed_plan = plan
        self.run_dir = run_dir
        self.cfg = config.resolve(run_dir / "config.toml")
        self.state = WorkerState()
        self.transport = None
        self.worker = None
        self.world = None
        self.links: LinkApplier | None = None   # a scenario's link changes, on this shaper
        self.timeline = None   # its speed and pause events at a time (world.SelfTimeline)
        self.released = False   # absent to the end: its join at a time never came
        self.decisions_played = 0   # node 0's hosts lost and back, played so far (ctl.decisions)
        self.reported_dead = 0   # dead-peer losses in the rows so far

    def serve(self) -> int:
        self.heartbeat = hb = Heartbeat(self.ctx, self.spec.heartbeat_addr, self.rank,
                                        self.spec.heartbeat_s, self.state.status,
                                        security=self.ctl.security)
        hb.start()
        try:
            start = self.connect()
            if start is None:
                return 0
            self.train(start.t0)
            if not self.ctl.stop_requested and not self.released:
                self.final_report()
            return 0
        finally:
            hb.stop()
            if self.transport is not None:
                self.transport.close()

    def connect(self) -> orders.Start | None:
        """Bind the data plane, say ready, and wait for start; None when told to stop instead."""
        # imported here, not at the top: torch must load after main() sets OMP_NUM_THREADS
        from gasloc_emu.plan import build_plan, received
        from gasloc_emu.scenario.faults import read_recorded
        from gasloc_emu.training.model import count_parameters
        from gasloc_emu.training.worker import Worker, ring_members
        from gasloc_emu.transport.faults import plan_from_config, with_fault
        from gasloc_emu.transport.schema import WireSchema
        from gasloc_emu.transport.zmq_transport import ZmqTransport
        # the launcher's run plan, handed down serialised (its random faults as drawn);
        # derived here only for a worker started on its own, with the faults the launcher
        # recorded, not drawn again
        self.plan = plan = \
            build_plan(self.cfg, faults=read_recorded(self.run_dir)) \
            if self.handed_plan is None else received(self.handed_plan, self.cfg)
        print(f"worker {self.rank}: run plan "
              + ("derived from config.toml" if self.handed_plan is None else
                 f"handed by the launcher ({len(self.handed_plan)} bytes)"), flush=True)
        self.world = world = plan.world
        self.timeline = world.timed_self(self.rank) if world is not None else None
        numel = count_parameters(self.cfg.model)
        schema = WireSchema(self.rank, self.cfg.workers, numel,
                            extra=plan.algo.wire_kinds(numel, plan.algorithm.params),
                            members=ring_members(world, self.rank), codec=plan.codec,
                            compressed=plan.algo.compressed_kinds)
        bind = self.rejoin.addr if self.rejoin else self.spec.bind_addrs[self.rank]
        self.links = LinkApplier.of(self.cfg, plan.link_plan, world, self.rank,
                                    _shaping(self.spec, self.rank), plan.time_scale)
        limits = plan.drive.transport_limits(numel * 4)
        self.transport = tp = ZmqTransport(
            self.rank, self.cfg.workers, bind, ctx=self.ctx, **limits,
            max_numel=schema.max_numel(), schema=schema, recv_timeout_s=self.spec.peer_timeout_s,
            should_stop=self.ctl.poll_stop,
            shaping=self.links.shaper if self.links else _shaping(self.spec, self.rank),
            security=self.ctl.security, link_ports=self.spec.link_ports,
            dead_peers=self._dead_peers)
        self.state.transport = tp
        if self.rejoin is not None:   # what comes for earlier rounds was its predecessor's
            tp.begin_life(self.rejoin.from_round)
        device = self.spec.devices[self.rank]
        self.ctl.send(_control().Ready(self.rank, tp.address, device))
        start = self.ctl.wait_for(orders.Start, self.spec.start_timeout_s)
        if isinstance(start, orders.Stop):
            return None
        tp.connect(start.peers)
        faulty = with_fault(tp, plan_from_config(self.cfg), self.rank, os._exit, self._hang)
        self.worker = Worker(plan, self.rank, faulty, device)
        if self.spec.resume_round >= 0:   # --resume: the state of its checkpoint, exactly
            self.worker.restore(self._checkpoints().load(self.rank, self.spec.resume_round))
        return start

    def _checkpoints(self):
        """This run's checkpoint folder (``training.checkpoint``), or None when it takes
        none."""
        from gasloc_emu.training.checkpoint import Checkpoints
        return Checkpoints(self.run_dir) if self.cfg.run.checkpoint_every else None

    def _hang(self) -> None:
        """An injected hang: no heartbeat, no progress, until the launcher kills this process."""
        self.heartbeat.stop()
        threading.Event().wait()

    def train(self, t0: float) -> None:
        """Every round (``training.rounds``, this process its host), one metrics row for the
        launcher after each; returns early when told to stop."""
        worker, state = self.worker, self.state
        worker.t0 = self.t0 = t0   # link observations are reported on the run's clock
        state.speed = worker.compute.speed
        if self.links is not None:
            self.links.start(t0)
        first = self._first_round()
        if self.rejoin is not None and first is not None:
            self.transport.begin_life(first)   # a join at a time may land later than asked
        rounds = self.cfg.run.rounds
        done = self.plan.drive.train(self, worker, self.world, self.rank, rounds,
                                     first if first is not None else rounds,
                                     self._checkpoints())
        if done and not self.plan.drive.replays_exactly:
            # the launcher's pairer stops asking this worker's partners
            self.ctl.send(_control().Avail(self.rank, 0, finished=True))

    # -- the round protocol's steps as this process does them (``training.rounds.Host``)

    def stop_requested(self) -> bool:
        return self.ctl.poll_stop()

    def await_fixings(self, t: int) -> bool:
        return self._ask_fixings(t, waiting=True)

    def round_fixings(self, t: int) -> bool:
        return self._ask_fixings(t, waiting=False)

    def leave(self, t: int) -> None:
        """A scenario's departure: the process is killed, without a word to its peers. What it
        sent in its last round is flushed first (as a kernel's socket buffers would have gone
        out), so that its peers' last round with it is the same in ``run`` and ``simulate``."""
        self.heartbeat.stop()
        self.ctl.send(_control().Departed(self.rank, self.transport.counters()))
        self.transport.close(linger_s=LEAVE_FLUSH_S)
        self.ctl.sock.close(linger=int(LEAVE_FLUSH_S * 1000))
        flush = threading.Thread(target=self.ctx.term, daemon=True)  # returns once flushed
        flush.start()
        flush.join(timeout=LEAVE_FLUSH_S)
        os.kill(os.getpid(), signal.SIGKILL)

    def joiner(self, t: int):
        """This process is the successor that joins: its worker was built at connect."""
        self.state.phase = "joining"
        return self.worker

    def rejoined(self, t: int, round_idx: int, refused: tuple[str, ...]) -> None:
        for line in refused:   # a damaged file passed over for the one before it
            print(f"worker {self.rank}: refused {line}", flush=True)
        print(f"worker {self.rank}: rejoins at round {t} from its checkpoint of round "
              f"{round_idx}", flush=True)

    def due(self, plan, t: int):
        """The round's plan with this worker's speed and pause events at a time that are due
        (``world.SelfTimeline``): taken at the start of its first round at or after their
        time."""
        timeline = self.timeline
        if timeline is None:
            return plan
        speed, pause_s = timeline.due(self.worker.clock.since_s(self.t0))   # emulated s
        return dataclasses.replace(plan, speed=speed if speed is not None else plan.speed,
                                   pause_s=plan.pause_s + pause_s)

    def begin(self, t: int) -> None:
        if self.links is not None:
            self.links.sending(t)   # before anything of round t is sent
        self.state.round, self.state.phase = t, "computing"

    def compute_done(self, seconds: float, nominal: bool = False) -> None:
        self.state.phase = "communicating"

    def evaluating(self, t: int) -> None:
        self.state.phase = "evaluating"

    def report(self, t: int, stats) -> None:
        """The round's row to the launcher, once this worker's links took what follows it."""
        self.state.speed = self.worker.compute.speed
        self.state.finished_round(stats)
        if self.links is not None:
            self.links.receiving(t + 1)   # after the last receive of round t
        lost = self.transport.dead_peer_losses[self.reported_dead:]
        self.reported_dead += len(lost)
        row = MetricRow.from_round(stats.as_dict(), time_s=self.worker.clock.since_s(self.t0),
                                   dropped=self.transport.counters()["dropped"],
                                   **({"dead_peer": [list(x) for x in lost]} if lost else {}))
        self.ctl.send(_control().Metric(self.rank, row.body()))

    def ask_peer(self, k: int):
        """Ask the launcher for exchange request k's partner and wait for the pairing (None:
        told to stop)."""
        from gasloc_emu.training.pairing import Pairing
        self.state.phase = "communicating"
        self.ctl.send(_control().Avail(self.rank, k, finished=False))
        msg = self.ctl.wait_for(orders.Pair, self.spec.peer_timeout_s)
        if isinstance(msg, orders.Stop):
            return None
        pairing = Pairing(msg.worker, msg.peer, msg.label)
        if pairing.worker != self.rank or pairing.peer == self.rank:
            raise RuntimeError(f"worker {self.rank}: the launcher sent a pairing for "
                               f"{pairing.worker} with {pairing.peer}")
        return pairing

    def report_step(self, stats) -> None:
        self.state.round, self.state.phase = stats.round, "computing"
        self.state.finished_round(stats)
        if self.worker.should_eval(stats.round):
            self.state.phase = "evaluating"
            stats.eval_loss = self.worker.evaluate(stats.round)
        row = MetricRow.from_round(stats.as_dict(), time_s=self.worker.clock.since_s(self.t0),
                                   dropped=self.transport.counters()["dropped"])
        self.ctl.send(_control().Metric(self.rank, row.body()))

    # -- leaves, joins and partitions at a time: the launcher fixes them at rounds
    # (``fixing.RoundFixer``) and tells each worker at its round starts

    def _timed_world(self) -> bool:
        return self.world is not None and self.world.fixer is not None

    def _first_round(self) -> int | None:
        """The round this process starts at: 0, or a successor's join round (with a join at a
        time, once the launcher has fixed it; None: the run ended without it)."""
        if self.rejoin is None:
            return self.spec.resume_round + 1   # 0, or after a resumed run's checkpoint
        if not self._timed_world():
            return self.rejoin.from_round
        if not self._ask_fixings(self.rejoin.from_round, waiting=True):
            return None
        return self.world.join_round(self.rank, self.rejoin.from_round)

    def _ask_fixings(self, t: int, waiting: bool) -> bool:
        """Ask the launcher for every fixing so far and play them; False when it says the run
        ends before this worker's join (``released``) or tells it to stop."""
        from gasloc_emu.scenario.fixing import Fixing
        if waiting:
            self.state.phase = "waiting"
        self.ctl.send(_control().RoundStart(self.rank, t, waiting))
        timeout_s = self.spec.exit_timeout_s if waiting else self.spec.peer_timeout_s
        msg = self.ctl.wait_for(orders.Fixings, timeout_s)
        if isinstance(msg, orders.Stop):
            return False
        self.world.fix([Fixing.from_json(f) for f in msg.fixings])
        self._dead_peers()   # a host loss decided before this answer is played before round t
        self.released = msg.released
        return not self.released

    def _dead_peers(self) -> set[int]:
        """Play node 0's decisions on hosts lost and back that came since the last call
        (``orders.Lost``, ``orders.Back``; checked: one at a round this worker has started
        already would make it mix otherwise than the others, so it ends the worker); the
        peers dead in this worker's round (lost, and not back by then)."""
        from gasloc_emu.scenario.hostloss import HostBack, HostLoss
        while self.decisions_played < len(self.ctl.decisions):
            order = self.ctl.decisions[self.decisions_played]
            self.decisions_played += 1
            lost = isinstance(order, orders.Lost)
            x = HostLoss.from_json(order.loss) if lost else HostBack.from_json(order.back)
            if x.round <= self.state.round:
                raise RuntimeError(f"worker {self.rank}: node 0 decided node {x.node} "
                                   f"{'lost' if lost else 'back'} from round {x.round}, but "
                                   f"this worker has started round {self.state.round}")
            if self.world is None or not (self.world.lose(x) if lost else self.world.back(x)):
                continue
            print(f"worker {self.rank}: node {x.node} {'lost' if lost else 'back'}; workers "
                  f"{list(x.ranks)} {'leave' if lost else 'join'} at round {x.round}",
                  flush=True)
        if self.world is None or not self.world.losses:
            return set()
        t = max(self.state.round, 0)
        return {r for loss in self.world.losses for r in loss.ranks if self.world.dead_in(r, t)}

    def final_report(self) -> None:
        """Evaluate, send the final parameters as one raw frame, and wait to be let go."""
        self.state.phase = "evaluating"
        eval_loss = self.worker.evaluate(self.cfg.run.rounds - 1)
        theta = self.worker.theta.detach().to("cpu")
        final = _control().Final(self.rank, eval_loss, str(theta.dtype).split(".")[-1],
                              theta.numel(), self.transport.counters())
        self.ctl.send(final, _control().tensor_frame(theta))
        self.state.phase = "done"
        self.ctl.wait_for(orders.Exit, self.spec.exit_timeout_s)


class LinkApplier:
    """A scenario's link changes on this worker's userspace shaper (``world.LinkSchedule``).

    Sender side: at the start of round R, before anything of R is sent, every link from this
    worker that a round-triggered event changed takes the values in force for R (``set_link``;
    a cut stamps nothing). Every message of round R is sent after that point and every message
    of R-1 before it, so the sender times each message with its round's values, as the
    simulator does. Links changed by time (scenario events at ``at_s``, a link trace) are set
    just before each message is stamped (the shaper's ``on_stamp``), to the values in force at
    that moment of the run's clock (``time.time() - t0``, emulated: / K), as the simulator
    takes them at the virtual time of the send.

    Under time dilation (``time_scale`` K) the schedule's values and times are the asked
    (emulated) ones: each value goes to the shaper dilated (``dilation.dilate_state``: rate
    / K, latency x K; the caps come from the dilated link plan), each time is compared with
    the run's clock / K.

    Receiver side (``set_rx_link``): in ``userspace`` mode it only bounds the release times a
    sender may stamp, and a sender can enter round R while this worker is still in R-1, so every
    value each incoming link will have (by round or by time) is applied before round 0 (the
    bound keeps the slowest rate and largest latency it is given). In ``delay-only`` mode (tc
    paces, this worker's release queue adds the latency) the new latency of round R is applied
    at the end of round R-1, after its last receive; a message of R that arrives before that
    gets the old latency. A latency changed by time is the one in force when a message arrives
    (the shaper's ``on_release``).
    """

    def __init__(self, schedule, rank: int, shaper, caps, time_scale: float = 1.0):
        self.schedule, self.rank, self.shaper, self.caps = schedule, rank, shaper, caps
        self.k = time_scale
        self.sent_upto = self.recv_upto = -1
        self.round, self.t0 = 0, None   # the round being sent; the run's start (time.time())
        self._timed_set: dict[tuple[int, int], tuple] = {}   # what a timed link was last set to
        if schedule.timed is not None:
            shaper.on_stamp = self._timed_tx
            shaper.on_release = None if shaper.paces else self._timed_rx
        if shaper.paces:
            self.receiving(10**9)
            self._bound_timed()

    @classmethod
    def of(cls, cfg, link_plan, world, rank: int, shaper,
           time_scale: float = 1.0) -> LinkApplier | None:
        """The applier of a run whose scenario (or link trace) changes links, under a userspace
        shaper (tc runs without latency changes need none: the launcher changes the classes)."""
        if shaper is None or world is None or world.links is None:
            return None
        if not world.links.changes and world.links.timed is None:
            return None
        from gasloc_emu.netplan import link_caps
        return cls(world.links, rank, shaper, link_caps(cfg, link_plan), time_scale)

    def start(self, t0: float) -> None:
        """The run's start on the time.time() clock: times of timed changes count from it."""
        self.t0 = t0

    def _due(self, after: int, upto: int) -> list[tuple[int, dict]]:
        return [(r, ch) for r, ch in sorted(self.schedule.changes.items()) if after < r <= upto]

    def sending(self, t: int) -> None:
        """Set every link from this worker that changed since the last call to round t's
        values."""
        self.round = t
        links = {link for _, ch in self._due(self.sent_upto, t) for link in ch
                 if link[0] == self.rank}
        now_s = (time.time() - self.t0) / self.k if self.t0 is not None else 0.0
        for src, dst in sorted(links):
            rate, latency = self.schedule.at(src, dst, t, now_s)
            self._set_link(dst, (src, dst), (rate, latency))
            self._timed_set[(src, dst)] = (rate, latency)
        self.sent_upto = max(self.sent_upto, t)

    def _set_link(self, peer: int, link, state) -> None:
        """The sender's link to ``peer`` at an asked ``state`` (rate, latency), dilated."""
        rate, latency = dilate_state(state[0], state[1], self.k)
        self.shaper.set_link(peer, self._rate(rate, (self.caps(*link)[1],)), latency)

    def _set_rx(self, src: int, link, state) -> None:
        """The receiver's side of ``src``'s link at an asked ``state``, dilated."""
        rate, latency = dilate_state(state[0], state[1], self.k)
        self.shaper.set_rx_link(src, self._rate(rate, self.caps(*link)), latency)

    def _timed_tx(self, peer: int, now: float) -> None:
        """Before a message to ``peer`` is stamped: the link's values in force now."""
        link = (self.rank, peer)
        if self.t0 is None or link not in self.schedule.timed.steps:
            return
        state = self.schedule.at(*link, self.round, (now - self.t0) / self.k)
        if self._timed_set.get(link) != state:
            self._timed_set[link] = state
            self._set_link(peer, link, state)

    def _timed_rx(self, src: int, arrival: float) -> None:
        """delay-only: before a message from ``src`` is released, the latency in force now."""
        link = (src, self.rank)
        if self.t0 is None or link not in self.schedule.timed.steps:
            return
        state = self.schedule.timed.in_force(*link, (arrival - self.t0) / self.k)
        if state is not None and self._timed_set.get(link) != state:
            self._timed_set[link] = state
            self._set_rx(src, link, state)

    def _bound_timed(self) -> None:
        """userspace: every value a timed incoming link will have, into the release bound."""
        timed = self.schedule.timed
        for src, dst in sorted(timed.steps if timed is not None else ()):
            if dst == self.rank:
                for state in timed.values(src, dst):
                    self._set_rx(src, (src, dst), state)

    def receiving(self, t: int) -> None:
        """Give this worker's release side the values of its incoming links up to round t."""
        for _, changes in self._due(self.recv_upto, t):
            for (src, dst), state in sorted(changes.items()):
                if dst == self.rank:
                    self._set_rx(src, (src, dst), state)
        self.recv_upto = max(self.recv_upto, t)

    @staticmethod
    def _rate(rate: float | None, caps) -> float | None:
        """The rate the shaper paces at: the link's, under the profile's caps (0: cut)."""
        if rate == 0.0:
            return 0.0
        rates = [r for r in (rate, *caps) if r is not None]
        return min(rates) if rates else None


def _shaping(spec: LaunchSpec, rank: int):
    """The userspace shaper for this worker, when the launcher chose one."""
    if not spec.shaping:
        return None
    from netem.userspace import shaping_from_spec
    return shaping_from_spec(spec.shaping, rank)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
