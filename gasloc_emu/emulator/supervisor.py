"""The launcher's side of a running job: one `Supervisor` holds the control plane, watches every
worker (heartbeats, deaths, silence), answers their requests, and ends with the run's summary.
"""
from __future__ import annotations

import collections
import socket
import time
from pathlib import Path

from gasloc_emu.config import Config
from gasloc_emu.emulator.conductor import Conductor
from gasloc_emu.emulator.control_plane import ControlPlane
from gasloc_emu.emulator.desk import ControlDesk
from gasloc_emu.emulator.errors import RunFailed
from gasloc_emu.emulator.inbound import (
    where_in_run,
)
from gasloc_emu.emulator.launch_spec import LEAVE_FLUSH_S, LaunchSpec
from gasloc_emu.emulator.processes import (
    WorkerSlot,
    kill_group,
    reap,
    remove_socket_files,
    spawn_worker,
)
from gasloc_emu.emulator.tally import Goodput, drops_so_far, killed_counters, run_summary
from gasloc_emu.emulator.zygote import Zygote
from gasloc_emu.plan import RunPlan, handed
from gasloc_emu.report import records
from gasloc_emu.report.lanes import LaneTally
from gasloc_emu.report.schema import RunSummary
from gasloc_emu.scenario.events import ScenarioError
from gasloc_emu.scenario.hostloss import HostBack
from gasloc_emu.scenario.observed import event_feed
from gasloc_emu.training.checkpoint import Checkpoints, CheckpointWatch, ResumePoint
from gasloc_emu.training.devices import DeviceAssignment, threads_per_worker
from gasloc_emu.training.model import count_parameters
from gasloc_emu.training.pairing import Pairer
from gasloc_emu.transport import auth, control, orders
from netem.hoststat import cpu_shares, cpu_times

READY_TIMEOUT_S = 300.0  # building a gpt2-sized model and corpus can take a while

EXIT_GRACE_S = 10.0
FIDELITY_EVERY_S = 1.0   # the dashboard's verdict: one stats round-trip to the line a second

_PEER_TIMEOUT_FLOOR_S = 600.0


def peer_timeout_s(cfg: Config, network, time_scale: float = 1.0) -> float:
    """How long a worker waits for one peer message before it fails the run itself.

    Liveness is the supervisor's job: a worker that dies or goes silent for
    ``run.heartbeat_timeout_s`` stops the run, and that stop also ends every peer's wait. So
    this is only the backstop for a peer that is alive but stuck, and it must outlast every
    legitimate wait: the peer's local steps, and one whole parameter message over the slowest
    configured link (gpt2 over 5 Mbit/s takes minutes). Under time dilation the floor and
    the heartbeats' share are K times longer (a worker's steps are), and the transfer is timed
    at the played (dilated) rates the network reports.
    """
    rates = [network.configured_mbit(a, b) for a in range(cfg.workers)
             for b in range(cfg.workers) if a != b]
    rates = [r for r in rates if r]
    bits = count_parameters(cfg.model) * 32  # float32 parameters, the whole model in one message
    transfer_s = bits / (min(rates) * 1e6) if rates else 0.0
    return max(_PEER_TIMEOUT_FLOOR_S * time_scale, 4 * cfg.run.heartbeat_timeout_s * time_scale,
               4 * transfer_s)


class Supervisor:
    """Runs one emulator job from spawn to summary."""

    def __init__(self, plan: RunPlan, run_dir: Path, rec: records.RunRecord, network,
                 devices: list[DeviceAssignment], progress=None, *,
                 security: auth.Security | None = None,
                 endpoints: tuple[str, str] | None = None, zygote: Zygote | None = None,
                 resume: ResumePoint | None = None):
        """``security``: the run's keys (default: fresh ones, one host); ``endpoints``: where
        the control plane binds (default: ipc:// sockets in the run folder; tcp:// with port 0
        for a multi-node run, read back after binding); ``zygote``: one the caller started
        (default: started here); ``resume``: the checkpoints' round every worker goes on
        from (``--resume``)."""
        cfg = plan.cfg
        self.plan, self.cfg, self.dir, self.rec, self.network = plan, cfg, run_dir, rec, network
        self.resume = resume
        # which round every worker has a checkpoint of, from their rows: older files go
        self.checkpoints = CheckpointWatch(cfg.run.checkpoint_every, range(cfg.workers),
                                           plan.world.alive if plan.world is not None else None)
        self.devices, self.progress = devices, progress
        self._fidelity_asked = float("-inf")   # when the line was last asked (monotonic)
        # fresh keys per run; only the workers' Popen environments get them (_spawn)
        self.security = security or auth.Security(auth.RunCredentials.new(cfg.workers),
                                                  auth.resolve_mode(cfg.run.security))
        self.plane = ControlPlane(self.security, *(endpoints or control.ctl_paths(run_dir)))
        self.ctl_addr, self.hb_addr = self.plane.ctl_addr, self.plane.hb_addr
        self.slots: list[WorkerSlot] = []
        self.addrs: dict[int, str] = {}   # each rank's data-plane address, once it was ready
        self.t0 = 0.0
        self.cpu_at_t0: dict | None = None   # the host's CPU time by kind when training began
        self.link_meter = LinkMeter()
        self.goodput = Goodput()  # what each link delivered while training (links.json)
        # what every worker's messages must agree with: ranks, rounds, the model's size
        self.expect = control.Expect(cfg.workers, cfg.run.rounds, count_parameters(cfg.model),
                                     plan.drive.exchange_requests(plan.algo, cfg.algo,
                                                                      cfg.run.rounds))
        self.desk = ControlDesk(self)  # what each control message does
        self.feed = None  # the scenario's events, into events.jsonl and onto the display
        # its link changes and its events at a time, played on the run's clock
        self.scenario = Conductor(plan.world, network, cfg.run.rounds, self._clock,
                                  lambda rank, msg: self._tell(rank, msg), plan.time_scale)
        # asynchronous gossip: who exchanges with whom, decided here as each worker gets ready
        self.pairer = async_pairer(plan)
        self.lanes = LaneTally(cfg.workers) if self.pairer is not None else None
        # workers forked from a process that imported torch already; started now, it
        # imports while the launcher sets up
        self.zygote = (zygote or Zygote()).start()
        self.zygote.hand_plan(handed(plan))   # every worker gets this plan, none derives it

    @property
    def silence_s(self) -> float:
        """How long a training worker (or a node) may be silent before that means trouble:
        run.heartbeat_timeout_s of emulated time, K times that on the wall, as a worker that
        waits for a departed peer idles it (``RoundPlan.detect_s``, emulated)."""
        return self.cfg.run.heartbeat_timeout_s * self.plan.time_scale

    def _clock(self) -> float | None:
        """Seconds since the run's start; None before it."""
        return time.time() - self.t0 if self.t0 else None

    # -- lifecycle
    def run(self) -> RunSummary:
        """The run's protocol, as the workers see it: spawn, start, finish, exit."""
        self.feed = event_feed(self.scenario.world, self.rec, self.progress,
                               shaper=self.network.kind.changes_applied_by)
        self.launch_spec().write(self.dir)
        self.slots = self._spawn_all()
        self._await(lambda s: s.ready is not None, READY_TIMEOUT_S, "start")
        self._start()
        self._await(lambda s: s.final is not None, None, "finish")
        wall_s = time.time() - self.t0
        self._await_departed(EXIT_GRACE_S)
        for s in self.slots:
            self._tell(s.rank, orders.Exit().to_wire())
        self._reap(EXIT_GRACE_S)
        return self._summary(wall_s)

    def launch_spec(self) -> LaunchSpec:
        return LaunchSpec(
            ctl_addr=self.ctl_addr, heartbeat_addr=self.hb_addr,
            devices=tuple(d.device for d in self.devices),
            bind_addrs=tuple(self.network.bind_address(r) for r in range(self.cfg.workers)),
            shaping=self.network.shaping_spec(), threads=threads_per_worker(self.cfg),
            heartbeat_s=0.5,
            peer_timeout_s=peer_timeout_s(self.cfg, self.network, self.plan.time_scale),
            start_timeout_s=READY_TIMEOUT_S + 60, exit_timeout_s=3600.0, link_ports=False,
            resume_round=self.resume.round if self.resume is not None else -1)

    def _start(self) -> None:
        """Every worker is ready: hand out the peers' addresses and the run's clock origin."""
        self.scenario.change_links(0)   # round 0's, before anything is sent
        # a resumed run's clock goes on from its checkpoint's time
        self.t0 = time.time() - (self.resume.time_s if self.resume is not None else 0.0)
        self.cpu_at_t0 = cpu_times()
        for s in self.slots:
            self._tell_start(s.rank)
        self.rec.write_json("workers.json", [self._worker_row(s) for s in self.slots])

    def _tell_start(self, rank: int) -> None:
        """The peers' addresses (every worker ready so far) and the run's clock origin; a
        worker that starts once the run is under way gets every host loss and return decided
        so far first, to play before its first round."""
        if self.t0:
            for order in self.scenario.decisions():
                self._tell(rank, order.to_wire())
        # a rank's address is its for the whole run (a successor binds its predecessor's), so
        # one whose new process is not ready yet (a host back: several at once) is known too
        self.addrs |= {s.rank: s.ready["addr"] for s in self.slots if s.ready is not None}
        peers = dict(self.addrs)
        self._tell(rank, orders.Start(peers, self.t0).to_wire())

    def checkpointed(self, row) -> None:
        """A worker's row: once every worker has checkpoints of two later rounds, the older
        files go (this host's folder; the workers wrote them before their rows)."""
        keep_from = self.checkpoints.row(row.worker, row.round)
        if keep_from is not None:
            self._prune(keep_from)

    def _prune(self, keep_from: int) -> None:
        Checkpoints(self.dir).prune(keep_from)

    def _worker_row(self, s: WorkerSlot) -> dict:
        return {"rank": s.rank, "pid": s.proc.pid, "device": s.device.device,
                "gpu": s.device.gpu, "addr": s.ready["addr"],
                "threads": threads_per_worker(self.cfg)}

    def _spawn_all(self) -> list[WorkerSlot]:
        return [self._spawn(rank, dev) for rank, dev in enumerate(self.devices)]

    def _spawn(self, rank: int, device: DeviceAssignment) -> WorkerSlot:
        proc = spawn_worker(self.dir, rank, device, self.network, self.security,
                            zygote=self.zygote)
        return WorkerSlot(rank, proc, device, time.monotonic())

    def _await(self, done, timeout_s: float | None, what: str) -> None:
        """Serve control traffic until ``done(slot)`` for every worker, failing fast on trouble."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not all(done(s) or s.gone for s in self.slots):
            self._serve(0.1)
            self._check_health(done)
            if deadline is not None and time.monotonic() > deadline:
                late = [s.rank for s in self.slots if not done(s)]
                raise RunFailed(f"workers {late} did not get ready to {what} in {timeout_s:.0f} s")

    def _serve(self, timeout_s: float) -> None:
        due_s = self.scenario.next_due_s()  # an event at a time is not waited past
        if due_s is not None:
            timeout_s = min(timeout_s, due_s)
        beats, messages = self.plane.poll(timeout_s)
        for frame in beats:
            self.desk.on_heartbeat(control.unpack(frame.bytes), sender=auth.peer_user(frame))
        for frames in messages:
            self.desk.on_control(frames)
        self.scenario.change_links_by_time()
        self.scenario.fix_due(self.slots)
        rows = self.link_meter.rows(self.network.configured_mbit)
        if rows is not None and self.progress is not None:
            tcp = self.network.tcp_now()
            for row in rows:
                row.update(tcp.get((row["src"], row["dst"]), {}))
            self.progress({"kind": "links", "links": self.goodput.add_to(rows)})
        self._show_fidelity()

    def _show_fidelity(self) -> None:
        """The verdict as it stands, for the dashboard: asked of the packet line at most once
        a second (each ask is a control round-trip to the line process)."""
        ask = getattr(self.network, "fidelity_now", None)
        now = time.monotonic()
        if self.progress is None or ask is None or now - self._fidelity_asked < FIDELITY_EVERY_S:
            return
        self._fidelity_asked = now
        verdict = ask()
        if verdict is not None:
            self.progress({"kind": "fidelity", "fidelity": verdict.to_json(),
                           "headline": verdict.headline()})

    def _check_health(self, done) -> None:
        now = time.monotonic()
        self._check_nodes(now)
        for s in self.slots:
            if s.gone:
                continue
            code = s.proc.poll() if s.proc is not None else None  # None: on another node
            if code is not None and not done(s) and s.final is None:
                leave = self._planned_leave(s)
                if leave is None and self._survives_death(code):
                    self._lose_worker(s, code)
                    continue
                if leave is None:
                    self._died(s, code)
                self._departed(s, leave)
                continue
            # before it is ready a worker may be importing torch on a busy machine: the ready
            # timeout covers that (a successor's too); once it trains, silence means trouble
            if s.ready is None and self.t0 and now - s.last_seen > READY_TIMEOUT_S:
                raise RunFailed(f"worker {s.rank}'s new process did not get ready in "
                                f"{READY_TIMEOUT_S:.0f} s")
            silent = now - s.last_seen > self.silence_s
            if silent and s.ready is not None and s.final is None and not self._lost(s) \
                    and not self._exit_reported_soon(s, now):
                raise self._silent(s, now - s.last_seen)

    def _planned_leave(self, s: WorkerSlot) -> int | None:
        """The round at which the scenario makes this worker leave, when its death is that
        departure and the run carries on without it (``run.on_worker_loss``); else None."""
        if self.cfg.run.on_worker_loss == "fail":
            return None
        return self.scenario.planned_leave(s.rank, s.round)

    def _departed(self, s: WorkerSlot, leave: int) -> None:
        """A planned departure: forget the process; when it joins again, start its successor
        now, on the same address (it waits for its join round and its donor's parameters)."""
        self._serve(0.2)  # its last metrics may still be in flight
        s.departures += 1   # its counters come in its Departed
        s.heartbeat, s.rows_dead_peer = None, 0
        # a join at a time not fixed yet: the successor waits for it (``Conductor.on_round``)
        start = self.scenario.rejoin_round(s.rank, leave)
        if start is None:
            s.gone = True
            return
        self._start_successor(s, start)
        s.ready, s.final, s.last_seen = None, None, time.monotonic()

    def _await_departed(self, timeout_s: float) -> None:
        """Serve until every process that left as the scenario says has sent its counters
        (``Departed``: sent as it goes, it can come after the run's last final message on a
        busy host); the record's bytes sum them. A RunFailed naming the workers when some did
        not come in ``timeout_s``: the record would be short."""
        deadline = time.monotonic() + timeout_s
        while (late := [s.rank for s in self.slots if len(s.departed) < s.departures]):
            if time.monotonic() > deadline:
                raise RunFailed(f"the counters of the processes of workers {late} that left "
                                f"never came ({timeout_s:.0f} s); the record's bytes would be "
                                "short")
            self._serve(0.1)

    def _start_successor(self, s: WorkerSlot, start: int) -> None:
        """The departed worker's successor, on its address, from round ``start``."""
        s.proc = spawn_worker(self.dir, s.rank, s.device, self.network, self.security,
                              rejoin=(s.ready["addr"], start), zygote=self.zygote)

    def _silent(self, s: WorkerSlot, seconds: float) -> RunFailed:
        return RunFailed(f"worker {s.rank} silent for {seconds:.0f} s {self._when(s)}")

    # -- workers lost without warning (``scenario.hostloss``)
    def _goes_on(self) -> bool:
        """Whether the run goes on without workers lost without warning: ``run.on_worker_loss
        = continue`` (the world is armed) and the run has started."""
        world = self.plan.world
        return world is not None and world.armed and self.t0 > 0

    def _survives_death(self, code: int) -> bool:
        """Whether a worker process that died unplanned with ``code`` is lost and the run
        goes on: killed by a signal (kill -9, the kernel's OOM killer) in a run that goes on;
        an error exit stays a failure naming the worker."""
        return code < 0 and self._goes_on()

    def _lose_worker(self, s: WorkerSlot, code: int) -> None:
        """Worker ``s``'s process was killed while its host lives: lost as a host of that one
        worker would be (``_lose``)."""
        self._serve(0.2)   # its last row may still be in flight
        node, host = self._host_of(s.rank)
        self._lose(node, host, [s.rank], f"worker {s.rank} (signal {-code})", "worker")

    def _host_of(self, rank: int) -> tuple[int, str]:
        """(node, host name) of worker ``rank``: this one host."""
        return 0, socket.gethostname()

    def _lose(self, node: int, host: str, ranks: list[int], what: str,
              cause: str = "host") -> None:
        """Workers ``ranks`` are gone without warning (``what`` names them for the record's
        failures): they leave at the round an event reached now would be fixed at, every
        survivor is told at once (before any later answer), and the record says so
        (events.jsonl's leaves, the summary's ``membership.host_losses``). With no worker left,
        or an algorithm that cannot do without them, the run fails naming them."""
        left = [s for s in self.slots if not s.gone and s.rank not in ranks]
        if not left:
            raise RunFailed(f"{what} lost, and no worker is left on any other node")
        why = self.plan.algo.host_loss_refusal(self.cfg)
        if why is not None:
            raise RunFailed(f"{what} lost; the run cannot go on without them: "
                            f"{self.plan.algo.name}: {why}")
        try:
            loss = self.scenario.lose_host(node, host, ranks,
                                           {r: self.slots[r].round for r in ranks}, cause)
        except ScenarioError as exc:   # the scenario's leaves fixed already take the rest
            raise RunFailed(f"{what} lost, and no worker would be left: {exc}") from None
        for r in ranks:   # its counters died with it: what its heartbeats and rows said
            s = self.slots[r]
            s.killed.append(killed_counters(s.heartbeat, s.rows_dead_peer))
            s.gone, s.heartbeat, s.rows_dead_peer = True, None, 0
        for s in left:
            self._tell_decision(s, orders.Lost(loss.to_json()))
        if self.progress is not None:
            self.progress({"kind": "event", "text": f"{what} lost: workers {ranks} leave at "
                                                    f"round {loss.round}"})

    def _back(self, node: int, host: str, ranks: list[int],
              from_checkpoint: bool = False) -> tuple[HostBack, dict[int, str]]:
        """Workers ``ranks``, lost with their host, come back (its node agent started again):
        they join at the round an event reached now would be fixed at, every living worker is
        told at once, and their new processes get every decision with their start. The
        caller has checked that they are lost and that the run still has that round. The
        decision, and the address each new process binds (its predecessor's)."""
        # each rank's address from the start (its process may have died before it got ready:
        # a scenario's restart ordered on a host already dead)
        addrs = {r: self.addrs[r] for r in ranks}
        back = self.scenario.back_host(node, host, ranks, from_checkpoint)
        for s in self.slots:
            if not s.gone and s.rank not in ranks:
                self._tell_decision(s, orders.Back(back.to_json()))
        now = time.monotonic()
        for r in ranks:   # its first row is of the join round: a later loss counts from there
            s = self.slots[r]
            s.gone, s.ready, s.final, s.last_seen = False, None, None, now
            s.round = back.round - 1
        if self.progress is not None:
            self.progress({"kind": "event", "text": f"node {node} ({host}) back: workers "
                                                    f"{ranks} join at round {back.round}"})
        return back, addrs

    def _tell_decision(self, s: WorkerSlot, order) -> None:
        """A loss or return, to a living worker's process that is ready: one starting now
        (a successor, its Ready not in yet) gets every decision in order with its start
        (``_tell_start``); told this one first, it would play it before those it lacks."""
        if s.ready is not None:
            self._tell(s.rank, order.to_wire())

    def _died(self, s: WorkerSlot, code: int, where: str = "") -> None:
        self._serve(0.2)  # its last words (an error message) may still be in flight
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        log = where or str(self.dir / "workers" / f"worker{s.rank}.log")
        raise RunFailed(f"worker {s.rank} died ({how}) {self._when(s)}; log: {log}")

    def _label(self, slot: WorkerSlot) -> str:
        return slot.device.label

    def _check_nodes(self, now: float) -> None:
        """The other nodes' liveness (multi-node runs); one host has none to check."""

    def _lost(self, s: WorkerSlot) -> bool:
        """Whether a silent worker is lost with its host and the run goes on without it
        (multi-node runs, ``scenario.hostloss``); one host loses none."""
        return False

    def _exit_reported_soon(self, s: WorkerSlot, now: float) -> bool:
        """Whether a silent worker is one that leaves at its next round as the scenario says:
        it stops its heartbeats, flushes its last messages for at most ``LEAVE_FLUSH_S`` (at
        once to peers lost with their hosts) and dies without a word, so its exit is still to
        be seen that long past the heartbeat timeout."""
        return self._planned_leave(s) == s.round + 1 and \
            now - s.last_seen <= self.silence_s + LEAVE_FLUSH_S * self.plan.time_scale

    def _when(self, slot: WorkerSlot) -> str:
        return where_in_run(slot.ready is not None, bool(self.t0), slot.round,
                            self.cfg.run.rounds)

    def _tell(self, rank: int, msg: dict) -> None:
        """Send worker ``rank`` a message's wire form (``orders``: ``to_wire``)."""
        self.plane.tell(rank, msg)

    def _slot(self, worker) -> WorkerSlot | None:
        if isinstance(worker, int) and 0 <= worker < len(self.slots):
            return self.slots[worker]
        return None

    # -- stopping
    def stop_all(self) -> None:
        """Ask every worker to stop, then kill whatever is left after a short grace."""
        for s in self.slots:
            self._tell(s.rank, orders.Stop().to_wire())
        self._reap(3.0)

    def _reap(self, grace_s: float) -> None:
        reap([s.proc for s in self.slots if s.proc is not None], grace_s)

    def close(self) -> None:
        if self.plane.closed:
            return
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                kill_group(s.proc)
        self.plane.close()
        if self.zygote is not None:
            self.zygote.close()
        remove_socket_files(a for a in (self.ctl_addr, self.hb_addr) if a.startswith("ipc://"))

    # -- results
    def _summary(self, wall_s: float) -> RunSummary:
        """The record's numbers (``tally``), every control message the launcher dropped in
        ``control_drops``, what else took the host's CPUs meanwhile (a hypervisor's steal
        slows shaped links), and the pairings and scenario blocks."""
        asynchronous = None if self.pairer is None else (
            self.pairer.record() | self.lanes.record()
            | self.plan.algo.pairing_constants(self.cfg.algo, self.plan.topology))
        resumed = None if self.resume is None else {
            "round": self.resume.round, "time_s": self.resume.time_s,
            "refused": list(self.resume.skipped)}
        # under time dilation the record reports emulated time: wall-clock seconds / K
        k = self.plan.time_scale
        return run_summary(self.plan, self.slots, wall_s / k).replace(
            time_scale=k, control_drops=self.control_drops_total(), resumed=resumed,
            host_cpu=cpu_shares(self.cpu_at_t0, cpu_times()), asynchronous=asynchronous,
            **self.scenario.summary())

    def drops_so_far(self) -> dict:
        """``drops`` and ``control_drops`` of a run that ended early."""
        return {"drops": drops_so_far(self.plan, self.slots),
                "control_drops": self.control_drops_total()}

    def control_drops_total(self) -> dict[str, int]:
        """Control messages dropped by reason, with the connections ZAP refused (``zap.*``)."""
        total = dict(self.desk.control_drops)
        for reason, n in self.plane.refusals().items():
            total[reason] = total.get(reason, 0) + n
        return dict(sorted(total.items()))


def async_pairer(plan: RunPlan) -> Pairer | None:
    """The pairer of asynchronous pairwise gossip (an algorithm without rounds), over the
    graph's edges; None otherwise."""
    return plan.drive.pairer(plan.cfg.workers, plan.topology, plan.cfg.seed)


class LinkMeter:
    """Per-link throughput from the workers' cumulative byte counters (sent in heartbeats):
    what each receiver says its link delivered (``arrived``), so a message counts when it has
    crossed the link, not when its sender queued it; the sender's count where a receiver's is
    not known yet (workers without it). The rate is taken over the last ``window_s``: bytes
    arrive a whole message at a time, so a short window reads two messages that end in it
    as a rate the link never had."""

    def __init__(self, period_s: float = 1.0, window_s: float = 3.0):
        self.period_s, self.window_s = period_s, window_s
        self.now: dict[tuple[int, int], int] = {}
        self.t_prev = time.monotonic()
        self.history: collections.deque = collections.deque([(self.t_prev, {})])
        self.moved: dict[tuple[int, int], int] = {}   # bytes sent, for the "moved" column
        self.measured: set[tuple[int, int]] = set()   # links a receiver reports on

    def update(self, rank: int, sent: dict[int, int],
               arrived: dict[int, int] | None = None) -> None:
        """A checked heartbeat of worker ``rank``: bytes sent per peer, and bytes that arrived
        per source (int ranks, int counts)."""
        for dst, nbytes in sent.items():
            self.moved[(rank, dst)] = nbytes
            if (rank, dst) not in self.measured:
                self.now[(rank, dst)] = nbytes
        for src, nbytes in (arrived or {}).items():
            self.measured.add((src, rank))
            self.now[(src, rank)] = nbytes

    def rows(self, configured) -> list[dict] | None:
        """Rows for the dashboard at most once per period, else None."""
        t = time.monotonic()
        if t - self.t_prev < self.period_s or not self.now:
            return None
        while len(self.history) > 1 and t - self.history[1][0] >= self.window_s:
            self.history.popleft()   # the oldest snapshot still at least a window back
        t_old, old = self.history[0]
        dt = t - t_old
        rows = [{"src": s, "dst": d, "bytes": self.moved.get((s, d), b),
                 "configured_mbit": configured(s, d),
                 "mbit_now": max(0, b - old.get((s, d), 0)) * 8 / dt / 1e6}
                for (s, d), b in sorted(self.now.items())]
        self.history.append((t, dict(self.now)))
        self.t_prev = t
        return rows
