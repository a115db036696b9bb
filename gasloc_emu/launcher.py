"""Spawn one process per worker, pin devices, supervise, stop, collect the run record.

The launcher owns the control plane (ipc:// sockets in the run directory). It never touches the
data plane: workers bind the addresses it hands out and talk to each other directly.
Failure handling: a worker that exits early, reports an error, or is silent for
``run.heartbeat_timeout_s`` stops the run; every worker is stopped, then killed after a grace
period; the metrics written so far stay, and summary.json records the failure.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from . import exitcodes, records
from .config import Config
from .devices import DeviceAssignment, threads_per_worker, worker_devices
from .launch_spec import LaunchSpec
from .model import count_parameters
from .netplan import open_network, used_pairs
from .pairing import Pairer
from .plan import RunPlan
from .summary import drops_summary, final_summary
from .transport import auth, control
from .world import event_feed, link_changes, membership_summary, observed_link_changes

Log = Callable[[str], None]  # one line for the user (stderr in the CLI)

_READY_TIMEOUT_S = 300.0  # building a gpt2-sized model and corpus can take a while
_EXIT_GRACE_S = 10.0
_PEER_TIMEOUT_FLOOR_S = 600.0


def peer_timeout_s(cfg: Config, network) -> float:
    """How long a worker waits for one peer message before it fails the run itself.

    Liveness is the supervisor's job: a worker that dies or goes silent for
    ``run.heartbeat_timeout_s`` stops the run, and that stop also ends every peer's wait. So
    this is only the backstop for a peer that is alive but stuck, and it must outlast every
    legitimate wait: the peer's local steps, and one whole parameter message over the slowest
    configured link (gpt2 over 5 Mbit/s takes minutes).
    """
    rates = [network.configured_mbit(a, b) for a in range(cfg.workers)
             for b in range(cfg.workers) if a != b]
    rates = [r for r in rates if r]
    bits = count_parameters(cfg.model) * 32  # float32 parameters, the whole model in one message
    transfer_s = bits / (min(rates) * 1e6) if rates else 0.0
    return max(_PEER_TIMEOUT_FLOOR_S, 4 * cfg.run.heartbeat_timeout_s, 4 * transfer_s)


class RunFailed(RuntimeError):
    """A worker died, reported an error or went silent."""


class Interrupted(RuntimeError):
    """Ctrl-C or SIGTERM on the launcher."""


class RunDiverged(RunFailed):
    """A worker saw non-finite parameters or losses; ``where`` = {"worker", "round"}."""

    def __init__(self, message: str, where: dict):
        super().__init__(message)
        self.where = where


@dataclass
class WorkerSlot:
    rank: int
    proc: subprocess.Popen
    device: DeviceAssignment
    last_seen: float
    round: int = -1
    ready: dict | None = None
    final: dict | None = None
    theta: object = None
    status: dict = field(default_factory=dict)
    overruns: int = 0  # paced inner steps that took longer than their nominal time
    gone: bool = False  # left for good, as its scenario says: no final, no supervision


class Supervisor:
    """Runs one emulator job from spawn to summary."""

    def __init__(self, plan: RunPlan, run_dir: Path, rec: records.RunRecord, network,
                 devices: list[DeviceAssignment], progress=None, *,
                 security: auth.Security | None = None,
                 endpoints: tuple[str, str] | None = None):
        """``security``: the run's keys (default: fresh ones, one host); ``endpoints``: where
        the control plane binds (default: ipc:// sockets in the run folder; tcp:// with port 0
        for a multi-node run, read back after binding)."""
        cfg = plan.cfg
        self.plan, self.cfg, self.dir, self.rec, self.network = plan, cfg, run_dir, rec, network
        self.devices, self.progress = devices, progress
        self.ctx = zmq.Context()
        # fresh keys per run; only the workers' Popen environments get them (_spawn)
        self.security = security or auth.Security(auth.RunCredentials.new(cfg.workers),
                                                  auth.resolve_mode(cfg.run.security))
        # answers the control plane's handshakes; stops when ctx.term() is called (close)
        self.zap = auth.ZapHandler(self.ctx, self.security.creds)
        ctl_addr, hb_addr = endpoints or control.ctl_paths(run_dir)
        self.router, self.ctl_addr = self._bind(zmq.ROUTER, ctl_addr)
        self.pull, self.hb_addr = self._bind(zmq.PULL, hb_addr)
        self.slots: list[WorkerSlot] = []
        self.t0 = 0.0
        self.link_meter = LinkMeter()
        # what every worker's messages must agree with: ranks, rounds, the model's size
        self.expect = control.Expect(cfg.workers, cfg.run.rounds, count_parameters(cfg.model))
        self.control_drops: dict[str, int] = {}  # by reason: summary.json's control_drops
        self.world = plan.world  # the scenario's rounds (None without one)
        self.feed = None  # its events, into events.jsonl and onto the display
        self.links_round = 0   # the scenario's link changes of rounds < this are applied
        self.timed_upto_s = -1.0   # and its changes by time up to here (the run's clock)
        # {worker, round, recv_links} of each row, when links change: what summary.json's
        # link_changes observe (one per worker and round, so bounded by the run's length)
        self.link_rows: list[dict] = []
        # asynchronous gossip: who exchanges with whom, decided here as each worker gets ready
        self.pairer = async_pairer(plan)
        # leaves, joins and partitions at a time: the workers absent until a join not fixed
        # yet, and the round each asked at (answered once it is fixed, ``_fix_due``)
        self.join_waiters: dict[int, int] = {}

    def _bind(self, kind: int, addr: str):
        """The socket and the address it got (a tcp:// port 0 becomes the port chosen)."""
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        auth.make_server(sock, self.security, auth.LAUNCHER)
        sock.bind(addr)
        return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)

    # -- lifecycle
    def run(self) -> dict:
        """The run's protocol, as the workers see it: spawn, start, finish, exit."""
        self.feed = event_feed(self.world, self.rec, self.progress,
                               shaper=_applied_by(self.network.shaper))
        self.launch_spec().write(self.dir)
        self.slots = self._spawn_all()
        self._await(lambda s: s.ready is not None, _READY_TIMEOUT_S, "start")
        self._start()
        self._await(lambda s: s.final is not None, None, "finish")
        wall_s = time.time() - self.t0
        for s in self.slots:
            self._tell(s.rank, {"type": "exit"})
        self._reap(_EXIT_GRACE_S)
        return self._summary(wall_s)

    def launch_spec(self) -> LaunchSpec:
        return LaunchSpec(
            ctl_addr=self.ctl_addr, heartbeat_addr=self.hb_addr,
            devices=tuple(d.device for d in self.devices),
            bind_addrs=tuple(self.network.bind_address(r) for r in range(self.cfg.workers)),
            shaping=self.network.shaping_spec(), threads=threads_per_worker(self.cfg),
            heartbeat_s=0.5, peer_timeout_s=peer_timeout_s(self.cfg, self.network),
            start_timeout_s=_READY_TIMEOUT_S + 60, exit_timeout_s=3600.0, link_ports=False)

    def _start(self) -> None:
        """Every worker is ready: hand out the peers' addresses and the run's clock origin."""
        self._change_links(0)   # round 0's, before anything is sent
        self.t0 = time.time()
        peers = {str(s.rank): s.ready["addr"] for s in self.slots}
        for s in self.slots:
            self._tell(s.rank, {"type": "start", "peers": peers, "t0": self.t0})
        self.rec.write_json("workers.json", [self._worker_row(s) for s in self.slots])

    def _worker_row(self, s: WorkerSlot) -> dict:
        return {"rank": s.rank, "pid": s.proc.pid, "device": s.device.device,
                "gpu": s.device.gpu, "addr": s.ready["addr"]}

    def _spawn_all(self) -> list[WorkerSlot]:
        return [self._spawn(rank, dev) for rank, dev in enumerate(self.devices)]

    def _spawn(self, rank: int, device: DeviceAssignment) -> WorkerSlot:
        proc = spawn_worker(self.dir, rank, device, self.network, self.security)
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
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pull, zmq.POLLIN)
        events = dict(poller.poll(int(timeout_s * 1000)))
        while self.pull in events and self.pull.poll(0):
            frame = self.pull.recv(copy=False)
            self._on_heartbeat(control.unpack(frame.bytes), sender=auth.peer_user(frame))
        while self.router in events and self.router.poll(0):
            self._on_control(self.router.recv_multipart(copy=False))
        self._change_links_by_time()
        self._fix_due()
        rows = self.link_meter.rows(self.network.configured_mbit)
        if rows is not None and self.progress is not None:
            self.progress({"kind": "links", "links": rows})

    # -- control messages: parsed into control's typed messages; anything else is dropped and
    # counted by reason in ``control_drops``, never raised out of the serve loop. The one
    # exception is a worker's own final message the launcher cannot use: that worker sends
    # nothing more, so the run fails (RunFailed, named) instead of waiting for it forever.

    def _drop(self, reason: str) -> None:
        self.control_drops[reason] = self.control_drops.get(reason, 0) + 1
        if self.progress is not None:
            self.progress({"kind": "control_drops", "drops": dict(self.control_drops)})

    def _on_heartbeat(self, msg: dict, sender: str = "") -> None:
        """A heartbeat from the PULL socket; ``sender``: the user id its connection was
        authenticated as (``auth.peer_user`` of the frame), "" where the caller has none."""
        try:
            hb = control.parse(msg, self.expect)
        except control.ControlError as exc:
            return self._drop(exc.reason)
        if not isinstance(hb, control.Heartbeat):
            return self._drop("channel")  # replies belong on the ROUTER
        if sender and sender != auth.user_id(hb.worker):
            return self._drop("spoofed")
        slot = self._slot(hb.worker)  # a checked rank: None only before every worker spawned
        if slot is None:
            return self._drop("early")
        slot.last_seen, slot.status = time.monotonic(), msg
        self.link_meter.update(slot.rank, hb.sent)
        if self.progress is not None:
            self.progress({"kind": "status", "worker": slot.rank, "device": self._label(slot),
                           "state": hb.state, "peer": hb.peer, "round": hb.round,
                           "step": hb.step, "dropped": hb.dropped,
                           "drop_reasons": hb.drop_reasons, "speed": hb.speed,
                           "round_steps": hb.round_steps, "wait_share": hb.wait_share})

    def _on_control(self, frames) -> None:
        """A message on the ROUTER: its identity frame names the sending worker's socket, and
        the body's User-Id who authenticated that connection (none on unauthenticated ones)."""
        slot = self._sender_slot(frames[0].bytes)
        if slot is None or len(frames) < 2:
            return self._drop("sender" if slot is None else "frames")
        user = auth.peer_user(frames[1])
        if user and user != auth.user_id(slot.rank):
            return self._drop("spoofed")  # authenticated as one worker, routed as another
        try:
            msg = control.decode(frames[1].bytes, self.expect)
            handler = self._CONTROL_HANDLERS.get(type(msg))
            if handler is None:
                return self._drop("channel")  # heartbeats belong on the PULL socket
            if msg.worker != slot.rank:
                return self._drop("spoofed")
            slot.last_seen = time.monotonic()
            handler(self, slot, msg, frames[2:])
        except control.ControlError as exc:
            self._drop(exc.reason)
            if exc.reason.startswith("final."):  # its sender will send no other: fail, not hang
                raise RunFailed(f"worker {slot.rank} sent final parameters the launcher "
                                f"cannot use ({exc})") from None

    def _sender_slot(self, ident: bytes) -> WorkerSlot | None:
        """The worker whose DEALER identity (b"w<rank>") this is, or None."""
        return next((s for s in self.slots if ident == _identity(s.rank)), None)

    def _on_ready(self, slot: WorkerSlot, msg: control.Ready, extra) -> None:
        slot.ready = {"addr": msg.addr, "device": msg.device}
        if self.t0:  # a departed worker's new process: the run is under way, it joins it
            peers = {str(s.rank): s.ready["addr"] for s in self.slots if s.ready is not None}
            self._tell(slot.rank, {"type": "start", "peers": peers, "t0": self.t0})

    def _on_metric(self, slot: WorkerSlot, msg: control.Metric, extra) -> None:
        slot.round = msg.row["round"]
        slot.overruns += msg.row.get("overruns", 0)
        self._change_links(msg.row["round"] + 1)
        self._keep_link_row(msg.row)
        if self.feed is not None:
            self.feed.row(msg.row)
        self.rec.metric(msg.row)
        if self.progress is not None:
            self.progress(msg.row)

    def _keep_link_row(self, row: dict) -> None:
        """Keep what ``link_changes`` needs of a (checked) row, in a run whose links change."""
        if self.world is None or self.world.links is None or "recv_links" not in row:
            return
        self.link_rows.append({k: row[k] for k in ("worker", "round", "recv_links")})

    def _change_links(self, upto: int) -> None:
        """The network's link changes of rounds <= ``upto``, once each, when the first worker
        reports round ``upto`` - 1 (tc: messages of that round still in flight may see them;
        the userspace shaper's workers apply their own at their round starts)."""
        links = self.world.links if self.world is not None else None
        if links is None:
            return
        now_s = time.time() - self.t0 if self.t0 else 0.0
        while self.links_round <= min(upto, self.cfg.run.rounds - 1):
            t = self.links_round
            self.network.change_links({link: links.at(*link, t, now_s)
                                       for link in links.changes.get(t, {})})
            self.links_round += 1

    def _change_links_by_time(self) -> None:
        """The time-triggered link changes whose time has come on the run's clock (tc changes
        the classes then; under the userspace shaper the workers apply their own). A link a
        partition holds cut stays cut: its restore brings the value in force then."""
        timed = self.world.links.timed if self.world and self.world.links else None
        if timed is None or not self.t0:
            return
        now_s = time.time() - self.t0
        cut = self.world.links.cut(max(self.links_round - 1, 0))
        changes = {link: timed.in_force(*link, now_s)
                   for ev in timed.due(self.timed_upto_s, now_s) for link in ev.links
                   if link not in cut}
        self.timed_upto_s = now_s
        if changes:
            self.network.change_links(changes)

    # -- leaves, joins and partitions at a time (``fixing.RoundFixer`` on the run's clock)

    def _on_round(self, slot: WorkerSlot, msg: control.RoundStart, extra) -> None:
        """A worker starts a round (or waits for its join): fix what is due first, so that no
        round it starts misses a fixing, then answer with every fixing so far."""
        fixer = self.world.fixer if self.world is not None else None
        if fixer is None:
            return self._drop("round.scenario")  # only events at a time need the question
        self._fix_due()
        if msg.waiting and self.world.awaits_join(slot.rank, msg.round):
            self.join_waiters[slot.rank] = msg.round
            return None
        if not msg.waiting:
            fixer.started(msg.round)
        self._tell_fixings(slot.rank)
        return None

    def _fix_due(self) -> None:
        """Fix the events whose time has come; answer the workers whose join that fixes; the
        network's link changes are played again from the first round fixed (a partition's)."""
        fixer = self.world.fixer if self.world is not None else None
        if fixer is None or not self.t0:
            return
        new = fixer.due(time.time() - self.t0)
        if new:
            self.world.fix(new)
            self.links_round = min(self.links_round, min(f.round for f in new))
            for rank, t in list(self.join_waiters.items()):
                if not self.world.awaits_join(rank, t):
                    del self.join_waiters[rank]
                    self._tell_fixings(rank)
        self._release_waiters()

    def _release_waiters(self) -> None:
        """Once every other worker is done, a join that has not come never will."""
        rest = [s for s in self.slots if s.rank not in self.join_waiters]
        if self.join_waiters and all(s.final is not None or s.gone for s in rest):
            for rank in self.join_waiters:
                self._tell_fixings(rank, released=True)
                self.slots[rank].gone = True
            self.join_waiters.clear()

    def _tell_fixings(self, rank: int, released: bool = False) -> None:
        self._tell(rank, {"type": "fixings", "released": released,
                          "fixings": [f.to_json() for f in self.world.fixings]})

    def _on_final(self, slot: WorkerSlot, msg: control.Final, extra) -> None:
        if len(extra) != 1:
            raise control.ControlError("final.frame", f"{len(extra)} parameter frames, not 1")
        slot.theta = control.frame_tensor(extra[0], msg.dtype, msg.numel)
        slot.final = {"eval_loss": msg.eval_loss, "counters": msg.counters}

    def _on_error(self, slot: WorkerSlot, msg: control.Error, extra) -> None:
        text = f"worker {slot.rank} failed {self._when(slot)}: {msg.error}"
        if msg.diverged_at is not None:
            raise RunDiverged(text, msg.diverged_at)
        raise RunFailed(text)

    def _on_avail(self, slot: WorkerSlot, msg: control.Avail, extra) -> None:
        if self.pairer is None:
            return self._drop("avail.algo")  # only asynchronous gossip asks for peers
        try:
            pairings = self.pairer.finished(msg.worker) if msg.finished else \
                self.pairer.ready(msg.worker, msg.step)
        except ValueError:
            return self._drop("avail.state")  # ready twice, out of step, or after its last
        for p in pairings:
            self._tell(p.worker, {"type": "pair"} | p.to_json())

    # the allow-list of what the ROUTER acts on: a message's class picks its handler
    _CONTROL_HANDLERS = {control.Ready: _on_ready, control.Metric: _on_metric,
                         control.Final: _on_final, control.Error: _on_error,
                         control.Avail: _on_avail, control.RoundStart: _on_round}

    def _check_health(self, done) -> None:
        now = time.monotonic()
        self._check_nodes(now)
        for s in self.slots:
            if s.gone:
                continue
            code = s.proc.poll() if s.proc is not None else None  # None: on another node
            if code is not None and not done(s) and s.final is None:
                leave = self._planned_leave(s)
                if leave is None:
                    self._died(s, code)
                self._departed(s, leave)
                continue
            # before it is ready a worker may be importing torch on a busy machine: the ready
            # timeout covers that; once it trains, silence means trouble
            silent = now - s.last_seen > self.cfg.run.heartbeat_timeout_s
            if silent and s.ready is not None and s.final is None:
                raise self._silent(s, now - s.last_seen)

    def _planned_leave(self, s: WorkerSlot) -> int | None:
        """The round at which the scenario makes this worker leave, when its death is that
        departure and the run carries on without it (``run.on_worker_loss``); else None."""
        if self.world is None or self.cfg.run.on_worker_loss == "fail":
            return None
        leaves = [c["round"] for c in self.world.left_and_joined()
                  if c["type"] == "leave" and c["worker"] == s.rank and c["round"] > s.round]
        return min(leaves) if leaves else None

    def _departed(self, s: WorkerSlot, leave: int) -> None:
        """A planned departure: forget the process; when it joins again, start its successor
        now, on the same address (it waits for its join round and its donor's parameters)."""
        self._serve(0.2)  # its last metrics may still be in flight
        joins = [c["round"] for c in self.world.left_and_joined()
                 if c["type"] == "join" and c["worker"] == s.rank and c["round"] > leave]
        # a join at a time not fixed yet: the successor waits for it (``_on_round``)
        waits = not joins and self.world.awaits_join(s.rank, leave)
        if not joins and not waits:
            s.gone = True
            return
        addr = s.ready["addr"]
        s.proc = spawn_worker(self.dir, s.rank, s.device, self.network, self.security,
                              rejoin=(addr, min(joins) if joins else leave))
        s.ready, s.final, s.last_seen = None, None, time.monotonic()

    def _silent(self, s: WorkerSlot, seconds: float) -> RunFailed:
        return RunFailed(f"worker {s.rank} silent for {seconds:.0f} s {self._when(s)}")

    def _died(self, s: WorkerSlot, code: int, where: str = "") -> None:
        self._serve(0.2)  # its last words (an error message) may still be in flight
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        log = where or str(self.dir / "workers" / f"worker{s.rank}.log")
        raise RunFailed(f"worker {s.rank} died ({how}) {self._when(s)}; log: {log}")

    def _label(self, slot: WorkerSlot) -> str:
        return slot.device.label

    def _check_nodes(self, now: float) -> None:
        """The other nodes' liveness (multi-node runs); one host has none to check."""

    def _when(self, slot: WorkerSlot) -> str:
        """Where a worker was when it failed: rows come at the end of a round, so the round in
        progress is the one after the last row (or the final evaluation after the last round)."""
        if slot.ready is None or not self.t0:
            return "before training"
        if slot.round + 1 >= self.cfg.run.rounds:
            return "after its last round"
        return f"in round {slot.round + 1}"

    def _tell(self, rank: int, msg: dict) -> None:
        with contextlib.suppress(zmq.ZMQError):  # that worker is gone; supervision notices
            self.router.send_multipart([f"w{rank}".encode(), control.pack(msg)], zmq.NOBLOCK)

    def _slot(self, worker) -> WorkerSlot | None:
        if isinstance(worker, int) and 0 <= worker < len(self.slots):
            return self.slots[worker]
        return None

    # -- stopping
    def stop_all(self) -> None:
        """Ask every worker to stop, then kill whatever is left after a short grace."""
        for s in self.slots:
            self._tell(s.rank, {"type": "stop"})
        self._reap(3.0)

    def _reap(self, grace_s: float) -> None:
        reap([s.proc for s in self.slots if s.proc is not None], grace_s)

    def close(self) -> None:
        if self.ctx.closed:
            return
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                _kill_group(s.proc)
        self.router.close()
        self.pull.close()
        self.ctx.term()
        remove_socket_files(a for a in (self.ctl_addr, self.hb_addr) if a.startswith("ipc://"))

    # -- results
    def _summary(self, wall_s: float) -> dict:
        """The record's numbers, from the workers' checked final messages; every message a
        worker dropped is in ``drops`` (by reason and worker), every control message the
        launcher dropped in ``control_drops``."""
        alive = [s for s in self.slots if not s.gone]  # the workers there at the end
        sent = sum(sum(s.final["counters"]["bytes_sent"].values()) for s in alive)
        out = final_summary(self.plan, [s.theta for s in alive],
                            [s.final["eval_loss"] for s in alive],
                            self.plan.corpus.eval_batches(), wall_s, sent,
                            overruns=[s.overruns for s in alive])
        out["dropped_messages"] = sum(s.final["counters"]["dropped"] for s in alive)
        out["drops"] = drops_summary({s.rank: s.final["counters"]["drop_reasons"]
                                      for s in alive})
        out["control_drops"] = self.control_drops_total()
        if self.world is not None:
            out["membership"] = membership_summary(self.world)
        if self.pairer is not None:
            out["asynchronous"] = self.pairer.record() | self.plan.algo.pairing_constants(
                self.cfg.algo, self.plan.topology)
        if self.world is not None and self.world.links is not None:
            out["link_changes"] = observed_link_changes(link_changes(self.world.links),
                                                        self.link_rows)
        return out

    def drops_so_far(self) -> dict:
        """``drops`` and ``control_drops`` of a run that ended early: each worker's last word
        (its final counters, else its last heartbeat)."""
        reasons = {s.rank: (s.final["counters"] if s.final is not None else s.status)
                   .get("drop_reasons", {}) for s in self.slots}
        return {"drops": drops_summary(reasons), "control_drops": self.control_drops_total()}

    def control_drops_total(self) -> dict[str, int]:
        """Control messages dropped by reason, with the connections ZAP refused (``zap.*``)."""
        total = dict(self.control_drops)
        for reason, n in self.zap.refusals().items():  # reasons come as "zap.<why>"
            total[reason] = total.get(reason, 0) + n
        return dict(sorted(total.items()))

    def link_bytes(self) -> list[dict]:
        """Bytes moved on every directed link that carried traffic, from the workers' counters
        (checked when their final message arrived: int ranks, int bytes)."""
        rows = []
        for s in self.slots:
            sent = s.final["counters"]["bytes_sent"] if s.final is not None else {}
            rows += [{"src": s.rank, "dst": p, "bytes": b} for p, b in sent.items() if b]
        return sorted(rows, key=lambda r: (r["src"], r["dst"]))


def async_pairer(plan: RunPlan) -> Pairer | None:
    """The pairer of asynchronous pairwise gossip (an algorithm without rounds), over the
    graph's edges; None otherwise."""
    if plan.algo.has_rounds:
        return None
    cfg = plan.cfg
    return Pairer(cfg.workers, plan.topology.possible_edges, cfg.seed)


def _applied_by(shaper: str) -> str:
    """Who applies a scenario's link changes under this shaper (events.jsonl's applied_by)."""
    return {"tc": "tc: the launcher, when the first worker reports the round before",
            "userspace": "userspace: each worker at its round start",
            "none": "none: a partition's cuts are the algorithms' absent edges"
            }.get(shaper, shaper)


def spawn_worker(run_dir: Path, rank: int, device: DeviceAssignment, network,
                 security: auth.Security, rejoin: tuple[str, int] | None = None
                 ) -> subprocess.Popen:
    """Start worker ``rank`` (``python -m gasloc_emu.worker_process RUN_DIR RANK``) with its
    device pinned and the run's keys in its environment only; its output goes to
    ``workers/worker<rank>.log`` (appended to by a successor: ``rejoin`` = (the address it
    binds, the round it joins at))."""
    logs = Path(run_dir) / "workers"
    logs.mkdir(exist_ok=True)
    extra = [rejoin[0], str(rejoin[1])] if rejoin else []
    argv = network.wrap(rank, [sys.executable, "-m", "gasloc_emu.worker_process",
                               str(run_dir), str(rank), *extra])
    env = os.environ | device.env | {"PYTHONUNBUFFERED": "1"} | security.env()
    with open(logs / f"worker{rank}.log", "ab" if rejoin else "wb") as log:
        # own session: Ctrl-C reaches only the launcher, which stops the workers cleanly
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def reap(procs: list[subprocess.Popen], grace_s: float) -> None:
    """Wait up to ``grace_s`` for every process to exit, then kill what is left."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc)


def _identity(rank: int) -> bytes:
    """The ROUTER identity of worker ``rank``'s DEALER (``control.WorkerControl``)."""
    return auth.user_id(rank).encode()


class LinkMeter:
    """Per-link throughput from the workers' cumulative byte counters (sent in heartbeats)."""

    def __init__(self, period_s: float = 1.0):
        self.period_s = period_s
        self.now: dict[tuple[int, int], int] = {}
        self.prev: dict[tuple[int, int], int] = {}
        self.t_prev = time.monotonic()

    def update(self, src: int, sent: dict[int, int]) -> None:
        """``sent``: a checked heartbeat's bytes per peer (int ranks, int counts)."""
        for dst, nbytes in sent.items():
            self.now[(src, dst)] = nbytes

    def rows(self, configured) -> list[dict] | None:
        """Rows for the dashboard at most once per period, else None."""
        t = time.monotonic()
        dt = t - self.t_prev
        if dt < self.period_s or not self.now:
            return None
        rows = [{"src": s, "dst": d, "bytes": b, "configured_mbit": configured(s, d),
                 "mbit_now": (b - self.prev.get((s, d), 0)) * 8 / dt / 1e6}
                for (s, d), b in sorted(self.now.items())]
        self.prev, self.t_prev = dict(self.now), t
        return rows


def remove_socket_files(addrs) -> None:
    """Remove the ipc:// socket files of a run, and their folder when it is a temporary one
    (``control.ctl_paths`` puts long run paths' sockets under /tmp/gasloc-<pid>-<hash>)."""
    for addr in addrs:
        path = Path(addr.removeprefix("ipc://"))
        path.unlink(missing_ok=True)
        if path.parent.name.startswith("gasloc-") and path.parent.parent == Path("/tmp"):
            shutil.rmtree(path.parent, ignore_errors=True)


def remove_stale_socket_dirs(tmp: Path = Path("/tmp")) -> list[Path]:
    """Socket folders left by launchers that were killed (their pid is gone); returns them."""
    stale = []
    for d in tmp.glob("gasloc-*-*"):
        pid = d.name.split("-")[1]
        if d.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
            stale.append(d)
    return stale


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


class _SigTerm:
    """Turn SIGTERM into an exception in the main thread, so cleanup runs as for Ctrl-C."""

    def __enter__(self):
        self.prev = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise Interrupted("SIGTERM")

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self.prev)


@dataclass
class LaunchResult:
    """What ``launch`` hands back to the command layer, which prints it."""

    code: int                       # one of gasloc_emu.exitcodes
    summary: dict = field(default_factory=dict)
    record: Path | None = None      # the run folder (None for a dry run)
    dry_run_text: str | None = None  # the network commands a dry run would execute

    @property
    def error(self) -> str | None:
        return self.summary.get("error")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def launch(plan: RunPlan, path: Path | None, *, dry_run: bool = False,
           progress_factory=None, log: Log = _stderr) -> LaunchResult:
    """``gasloc-emu run`` of a ``RunPlan``: build the network, run the workers, keep the
    record in ``path`` (made by ``records.new_run_dir``; unused for a dry run).

    Whatever goes wrong once the record exists (a worker, the launcher itself, Ctrl-C, a full
    disk) ends with a summary.json that has a status and the error, where the disk allows.
    """
    with ExitStack() as stack:
        cfg = plan.cfg
        network = stack.enter_context(open_network(cfg, plan.link_plan, plan.world, dry_run))
        if dry_run:
            return LaunchResult(exitcodes.OK, dry_run_text=network.dry_run_text())
        remove_stale_socket_dirs()
        rec = stack.enter_context(records.RunRecord(path, cfg))
        try:
            code, summary = _launch(plan, path, rec, network, stack, progress_factory, log)
        except BaseException as exc:  # noqa: BLE001 - whatever it was, the record says so
            code, summary = _outcome(exc)
            _last_words(rec, summary | {"mode": "run"} | network.describe_summary())
    return LaunchResult(code, summary, path)


def _launch(plan, path, rec, network, stack, progress_factory, log) -> tuple[int, dict]:
    cfg = plan.cfg
    devices = worker_devices(cfg.run.device, cfg.workers)
    warnings = _probe_links(plan, network, log) if _probes(cfg, network) else []
    prog = None
    if progress_factory is not None:
        prog = stack.enter_context(progress_factory([d.label for d in devices], network.shaper))
        for text in warnings:
            prog({"kind": "warning", "text": text})
    return _supervise(Supervisor(plan, path, rec, network, devices, prog))


def _outcome(exc: BaseException) -> tuple[int, dict]:
    """Exit code and summary fields for a run that ended by ``exc``."""
    if isinstance(exc, (KeyboardInterrupt, Interrupted)):
        why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc)
        return exitcodes.INTERRUPTED, {"status": "stopped", "error": why}
    if isinstance(exc, RunDiverged):
        return exitcodes.DIVERGED, {"status": "diverged", "error": str(exc),
                                    "diverged_at": exc.where}
    if isinstance(exc, (RunFailed, records.RecordError)):
        return exitcodes.RUN_FAILED, {"status": "failed", "error": str(exc)}
    return exitcodes.INTERNAL, {"status": "error",
                                "error": f"internal error: {type(exc).__name__}: {exc}"}


def _last_words(rec: records.RunRecord, summary: dict) -> str | None:
    """Write the summary if the disk lets us; the reason it did not, else None."""
    try:
        rec.summary(summary)
    except records.RecordError as exc:
        return str(exc)
    return None


def _probes(cfg: Config, network) -> bool:
    """Probe shaped links; not a network that starts unshaped (``ScenarioNetwork``: a link
    event's rate applies later, and an unshaped link has no target to miss)."""
    return cfg.net.probe and network.shaper != "none" and not getattr(network, "unshaped_start",
                                                                      False)


def _probe_links(plan: RunPlan, network, log: Log) -> list[str]:
    """Measure the links training will use; a warning for each that misses its target by >10%."""
    pairs = used_pairs(plan.cfg, plan.topology)
    log(f"probing {len(pairs)} links ...")
    rows = network.probe(pairs)
    warnings = [f"link {r['src']}->{r['dst']} measured {r['measured_mbit']:.2f} Mbit/s, "
                f"{r['measured_latency_ms']} ms; configured {r['configured_mbit']:.2f} Mbit/s, "
                f"{r['configured_latency_ms']} ms" for r in rows if not r["ok"]]
    for text in warnings:
        log(f"warning: {text}")
    return warnings


def _supervise(sup: Supervisor) -> tuple[int, dict]:
    code, summary = exitcodes.OK, {}
    try:
        with _SigTerm():
            summary = sup.run()
    except BaseException as exc:  # noqa: BLE001 - every ending is recorded, then stops the rest
        code, summary = _outcome(exc)
        summary["last_rounds"] = [s.round for s in sup.slots]
        summary |= sup.drops_so_far()
        sup.stop_all()
    finally:
        sup.close()
    summary |= {"mode": "run"} | sup.network.describe_summary()
    problem = _last_words(sup.rec, summary)
    if problem is None:
        problem = _write_links(sup)
    if problem is not None and code == exitcodes.OK:
        code, summary = exitcodes.RUN_FAILED, summary | {"status": "failed", "error": problem}
    return code, summary


def _write_links(sup: Supervisor) -> str | None:
    try:
        sup.rec.write_json("links.json", sup.network.links_record(sup.link_bytes()))
    except records.RecordError as exc:
        return str(exc)
    return None
