"""One run across hosts: a node agent per host, node 0 supervising and keeping the one record.

The protocol, as every node sees it (``launch_cluster``):

1. rendezvous: join the store (``rendezvous``), publish this node's ``NodeInfo`` (address,
   devices, worker count, config hash; node 0 also its control-plane endpoints), gather every
   node's, and refuse a config or version mismatch on every node with one line;
2. start: each node starts its block of workers (``cluster.blocks``). Every worker, wherever it
   runs, talks to node 0's control plane over tcp:// (authenticated with keys derived from the
   shared secret; CURVE, i.e. encrypted too, unless ``run.security`` says plain), and to its
   peers over the data plane. Node 0's supervisor therefore sees all workers as on one host;
3. liveness: every node beats in the store every half second and reports its workers that
   died (with which process of the rank it was). Node 0 fails the run when a node is silent for
   ``run.heartbeat_timeout_s`` or reports a dead worker, naming the node, its host and its
   workers, unless ``run.on_worker_loss = continue`` and the node is silent: then it is lost
   and the run goes on without its workers (``scenario.hostloss``; ``_lose_node``), or unless
   the death is a scenario's leave: then, when the worker joins again, node 0
   puts a ``Successor`` order in the store and the worker's node starts it (same address, the
   join round), as one host's launcher does. A node whose node 0 is silent (or whose store is
   gone) kills its workers and exits failed;
4. end: node 0 writes how the run ended into the store and waits (briefly) until every node has
   read it; the other nodes let their workers exit, kill what is left, and exit with the run's
   code. Only node 0 writes a run record; the other nodes keep their workers' logs locally.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from gasloc_emu import exitcodes
from gasloc_emu.cluster.rendezvous import (
    CHECKPOINTS_VERSION,
    JOIN_TIMEOUT_S,
    BackOrder,
    Holdings,
    NodeInfo,
    PruneOrder,
    Rendezvous,
    ResumeOrder,
    Successor,
    check_agreement,
    config_hash,
    open_store,
    shared_config,
)
from gasloc_emu.cluster.roles import (
    ClusterError,
    NodeRole,
    blocks,
    check_split,
    default_share,
    host_name,
    load_secret,
    route_address,
)
from gasloc_emu.config import Config, to_toml
from gasloc_emu.emulator.errors import RunFailed
from gasloc_emu.emulator.launch_spec import LaunchSpec
from gasloc_emu.emulator.launcher import LaunchResult, SigTerm, outcome, supervise
from gasloc_emu.emulator.network import HostNetwork
from gasloc_emu.emulator.processes import WorkerSlot, reap, spawn_worker
from gasloc_emu.emulator.supervisor import (
    EXIT_GRACE_S,
    READY_TIMEOUT_S,
    Supervisor,
    peer_timeout_s,
)
from gasloc_emu.emulator.zygote import Zygote
from gasloc_emu.netplan import multi_host_decision
from gasloc_emu.plan import RunPlan, handed
from gasloc_emu.report import records
from gasloc_emu.training.checkpoint import (
    CheckpointError,
    Checkpoints,
    Refusal,
    ResumePoint,
    common_point,
)
from gasloc_emu.training.devices import DeviceAssignment, visible_gpus, worker_devices
from gasloc_emu.transport import auth

Log = Callable[[str], None]
BEAT_S = 0.5          # how often a node beats in the store and looks at the others
LEAVE_WAIT_S = 10.0   # how long node 0 keeps the store up for the others to read the end
_EXIT_CODES = {"ok": exitcodes.OK, "failed": exitcodes.RUN_FAILED,
               "diverged": exitcodes.DIVERGED, "stopped": exitcodes.INTERRUPTED}


def security_for(cfg: Config, secret: bytes) -> auth.Security:
    """Keys from the shared secret; ``auto`` is CURVE across hosts (the data crosses a LAN)."""
    mode = auth.resolve_mode("curve" if cfg.run.security == "auto" else cfg.run.security)
    return auth.Security(auth.RunCredentials(secret, cfg.workers), mode)


def local_worker_count(cfg: Config, role: NodeRole) -> int:
    if role.nproc_per_node:
        return role.nproc_per_node
    gpus = 0 if cfg.run.device == "cpu" else len(visible_gpus(
        os.environ.get("CUDA_VISIBLE_DEVICES"), _gpu_count(cfg.run.device)))
    return default_share(cfg.workers, role.nnodes, role.node_rank, gpus)


def _version() -> str:
    """The installed gasloc-emu's version: hosts running different code must not mix."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gasloc-emu")
    except PackageNotFoundError:
        return "unknown"


def _gpu_count(want: str) -> int:
    import torch  # the node agent trains nothing itself; torch only to count GPUs
    return torch.cuda.device_count() if want != "cpu" else 0


def _plays_links(plan: RunPlan) -> bool:
    return plan.world is not None and plan.world.plays_links


class Node:
    """What one node knows about the run once it has a role, keys, network and devices."""

    def __init__(self, plan: RunPlan, role: NodeRole, secret: bytes,
                 zygote: Zygote | None = None, resume_dir: Path | None = None):
        """``resume_dir``: this host's folder of the run to go on from (``--resume``): node 0's
        record, another node's ``<record>.node<k>``, each with its workers' checkpoints."""
        cfg = plan.cfg
        self.resume_dir = resume_dir
        self.resume_round = -1   # the round every worker restores, once the nodes agreed
        self.plan, self.cfg, self.role = plan, cfg, role
        self.zygote = zygote or Zygote()   # this node's workers are forked from it
        self.zygote.hand_plan(handed(plan))  # with this node's plan: none derives it again
        self.security = security_for(cfg, secret)
        self.addr = route_address(role.master_addr, role.master_port)
        self.devices = worker_devices(cfg.run.device, local_worker_count(cfg, role))
        self.network = HostNetwork(cfg, plan.link_plan, self.addr, len(self.devices),
                                   _plays_links(plan))
        self.rdv: Rendezvous | None = None
        self.infos: list[NodeInfo] = []

    def info(self, ctl_addr: str = "", hb_addr: str = "") -> NodeInfo:
        return NodeInfo(
            node=self.role.node_rank, host=host_name(), addr=self.addr,
            workers=len(self.devices), devices=tuple(d.device for d in self.devices),
            labels=tuple(d.label for d in self.devices), config_hash=config_hash(self.cfg),
            config=shared_config(self.cfg), version=_version(),
            tc_missing=self.network.tc_missing, port_base=self.network.port_base,
            ctl_addr=ctl_addr, hb_addr=hb_addr, pid=os.getpid(),
            resuming=int(self.resume_dir is not None), threads=self.threads)

    @property
    def threads(self) -> int:
        """Torch CPU threads per worker on this node: the cores over its own workers. The
        record keeps each node's (workers.json), so that ``simulate --replay`` computes each
        worker with its count: sums in the same order, the same losses."""
        return self.cfg.run.threads_per_worker or max(1, (os.cpu_count() or 1)
                                                      // len(self.devices))

    def join(self, info: NodeInfo, local_dir: Path | None = None) -> BackOrder | None:
        """Publish, gather, check: every node's info, or a RendezvousError on every node.
        A node other than 0 that finds the run under way (node 0 lost it, and it was started
        again) asks to come back instead (``local_dir``: where its workers' checkpoints are):
        node 0's order, or a ClusterError with its refusal."""
        self.rdv = Rendezvous(open_store(self.role), self.role)
        back = None
        if not self.role.is_master and self.rdv.running():
            self.infos = self.rdv.published()
            back = self._come_back(info, local_dir)
        else:
            self.rdv.publish(info)
            self.infos = self.rdv.gather()
        check_split([i.workers for i in self.infos], self.cfg.workers)
        self.network.decide({i.node: i.tc_missing for i in self.infos},
                            [(i.addr, i.port_base, i.workers) for i in self.infos],
                            list(self.ranks))
        return back

    def _come_back(self, info: NodeInfo, local_dir: Path | None) -> BackOrder:
        """Ask node 0 to take this node back, saying which checkpoints this host holds: it
        answers once it has found the node lost (silent for run.heartbeat_timeout_s), with
        the round its workers join at."""
        if self.resume_dir is not None:
            raise ClusterError(f"node {info.node}: the run is under way; start it again "
                               "without --resume to come back into it")
        held, refused = Checkpoints(local_dir).holdings(self.ranks) \
            if local_dir is not None and self.cfg.run.checkpoint_every else \
            ({r: () for r in self.ranks}, ())
        self.rdv.ask_back(info, Holdings(CHECKPOINTS_VERSION, info.node, held, refused))
        order = self.rdv.back_order(info.node, info.pid,
                                    JOIN_TIMEOUT_S + self.cfg.run.heartbeat_timeout_s)
        if order.refused:
            raise ClusterError(f"node 0 did not take node {info.node} back: {order.refused}")
        if not order.lives or not set(order.lives) <= set(self.ranks):
            raise ClusterError(f"node 0's back order names workers {sorted(order.lives)}; "
                               f"node {info.node} runs {list(self.ranks)}")
        return order

    @property
    def ranks(self) -> range:
        return blocks([i.workers for i in self.infos])[self.role.node_rank]

    def node_of(self, rank: int) -> NodeInfo:
        for info, block in zip(self.infos, blocks([i.workers for i in self.infos]), strict=True):
            if rank in block:
                return info
        raise ClusterError(f"worker {rank} is on no node")

    def launch_spec(self) -> LaunchSpec:
        """The same contract as on one host; the control plane is node 0's, over tcp://."""
        master = self.infos[0]
        devices = [d for info in self.infos for d in info.devices]
        binds = [self.network.bind_address(r) for r in range(self.cfg.workers)]
        threads = self.threads
        return LaunchSpec(
            ctl_addr=master.ctl_addr, heartbeat_addr=master.hb_addr, devices=tuple(devices),
            bind_addrs=tuple(binds), shaping=self.network.shaping_spec(), threads=threads,
            heartbeat_s=0.5,
            peer_timeout_s=peer_timeout_s(self.cfg, self.network, self.plan.time_scale),
            start_timeout_s=READY_TIMEOUT_S + 60, exit_timeout_s=3600.0,
            link_ports=self.network.link_ports, resume_round=self.resume_round)

    def holdings(self) -> Holdings:
        """Which rounds this host's workers have whole checkpoints of, on its own disk."""
        held, refused = Checkpoints(self.resume_dir).holdings(self.ranks)
        return Holdings(CHECKPOINTS_VERSION, self.role.node_rank, held, refused)

    def choose_resume(self, rows: dict[int, dict[int, float]], log: Log) -> ResumePoint:
        """Node 0: the latest round every worker on every host has a whole checkpoint of and a
        row of in the record (``rows``), from each node's ``Holdings`` (checked on its own
        disk, trusted only for its own workers); told to every node. Each file refused is
        one line naming it and its host; a ClusterError when no round is left."""
        mine = self.holdings()
        counts = [i.workers for i in self.infos]
        others = [h.checked(k + 1, blocks(counts)[k + 1], self.cfg.run.rounds)
                  for k, h in enumerate(self.rdv.gather_holdings())]
        held, refused = {}, []
        for info, h in zip(self.infos, [mine, *others], strict=True):
            held |= h.held
            refused += [Refusal(x.rank, x.round, f"node {info.node} ({info.host}): {x.why}")
                        for x in h.refused]
        for x in refused:
            log(f"refused: {x.why}")
        try:
            point = common_point(held, range(self.cfg.workers), rows, refused)
        except CheckpointError as exc:
            raise ClusterError(f"--resume {self.resume_dir}: {exc}") from None
        self.rdv.order_resume(ResumeOrder(CHECKPOINTS_VERSION, point.round))
        self.resume_round = point.round
        return point

    def follow_resume(self, log: Log) -> None:
        """Another node: say which checkpoints this host holds, then take node 0's round."""
        mine = self.holdings()
        for x in mine.refused:
            log(f"node {self.role.node_rank}: refused: {x.why}")
        self.rdv.publish_holdings(mine)
        order = self.rdv.resume_order()
        if order.round >= self.cfg.run.rounds:
            raise ClusterError(f"node 0 ordered a resume from round {order.round}; the run has "
                               f"{self.cfg.run.rounds}")
        self.resume_round = order.round

    def labels(self) -> list[str]:
        """Every worker's device as the dashboard shows it, with its node: "n1 gpu3"."""
        return [f"n{i.node} {label}" for i in self.infos for label in i.labels]

    def describe(self) -> list[dict]:
        """The record's ``nodes``: host, address, workers, devices and shaper of each node."""
        return [{"node": i.node, "host": i.host, "addr": i.addr,
                 "workers": list(blocks([j.workers for j in self.infos])[i.node]),
                 "devices": list(i.labels), "tc_missing": i.tc_missing,
                 "shaper": self.network.shaper} for i in self.infos]


# ---------------------------------------------------------------- node 0

class ClusterSupervisor(Supervisor):
    """Node 0's supervisor: local workers are processes, the others are seen through the
    control plane (heartbeats, messages) and through their node's beats in the store."""

    def __init__(self, run_dir: Path, rec: records.RunRecord, node: Node):
        any_port = f"tcp://{node.addr}:0"
        super().__init__(node.plan, run_dir, rec, node.network, node.devices,
                         security=node.security, endpoints=(any_port, any_port),
                         zygote=node.zygote)
        self.node = node
        self.next_beat_s = 0.0
        self.lives = [0] * self.cfg.workers  # which process of each rank runs now
        self.lost_nodes: set[int] = set()    # nodes lost without warning, the run going on
        self.answered: set[tuple[int, int]] = set()   # (node, pid) of each back request seen

    def _start(self) -> None:
        super()._start()
        self.node.rdv.mark_running()   # an agent that joins from now on is coming back

    def _start_successor(self, s: WorkerSlot, start: int) -> None:
        """A successor on another host: its node starts it when it reads the order."""
        self.lives[s.rank] += 1
        if s.rank in self.node.ranks:
            super()._start_successor(s, start)
            return
        self.node.rdv.order_successor(Successor(s.rank, self.lives[s.rank], s.ready["addr"],
                                                start))

    def launch_spec(self) -> LaunchSpec:
        return self.node.launch_spec()

    def _prune(self, keep_from: int) -> None:
        """As on one host, and every other node is told from which round its files may go:
        each host keeps the two latest rounds that every worker of every host has."""
        super()._prune(keep_from)
        self.node.rdv.order_prune(PruneOrder(CHECKPOINTS_VERSION, keep_from))

    def _spawn_all(self) -> list[WorkerSlot]:
        local = dict(zip(self.node.ranks, self.devices, strict=True))
        return [self._spawn(r, local[r]) if r in local else self._remote(r)
                for r in range(self.cfg.workers)]

    def _remote(self, rank: int) -> WorkerSlot:
        info = self.node.node_of(rank)
        i = rank - blocks([j.workers for j in self.node.infos])[info.node].start
        gpu = None if info.labels[i] == "cpu" else info.labels[i].removeprefix("gpu")
        return WorkerSlot(rank, None, DeviceAssignment(info.devices[i], gpu), time.monotonic())

    def _label(self, slot: WorkerSlot) -> str:
        return f"n{self.node.node_of(slot.rank).node} {slot.device.label}"

    def _worker_row(self, s: WorkerSlot) -> dict:
        info = self.node.node_of(s.rank)
        return {"rank": s.rank, "node": info.node, "host": info.host,
                "pid": s.proc.pid if s.proc is not None else None,
                "device": s.device.device, "gpu": s.device.gpu, "addr": s.ready["addr"],
                "threads": info.threads or None}

    def _silent(self, s: WorkerSlot, seconds: float) -> RunFailed:
        """A silent worker on a silent node: the node is what failed, so name it."""
        info = self.node.node_of(s.rank)
        if info.node and self.node.rdv.silent_s(info.node, time.monotonic()) > 2 * BEAT_S:
            return self._node_silent(info, seconds)
        return super()._silent(s, seconds)

    def _node_silent(self, info: NodeInfo, seconds: float) -> RunFailed:
        ranks = list(blocks([i.workers for i in self.node.infos])[info.node])
        return RunFailed(f"node {info.node} ({info.host}, workers {ranks}) silent for "
                         f"{seconds:.0f} s")

    def _check_nodes(self, now: float) -> None:
        if now < self.next_beat_s:
            return
        self.next_beat_s = now + BEAT_S
        rdv = self.node.rdv
        rdv.beat({})
        for info in self.node.infos[1:]:
            if info.node not in self.lost_nodes:
                self._check_node(info, rdv, now)
            else:
                self._check_back(info, rdv)

    def _check_node(self, info: NodeInfo, rdv: Rendezvous, now: float) -> None:
        status = rdv.status(info.node)
        for rank, code in sorted(status.dead.items()) if status is not None else ():
            s = self.slots[rank]
            if s.gone or status.lives.get(rank, 0) != self.lives[rank]:
                continue   # a departure already handled: the report is of an earlier process
            leave = self._planned_leave(s) if s.final is None else None
            if leave is None and self._survives_death(code):
                self._lose_worker(s, code)   # its node lives: a lost host of that one worker
                continue
            if leave is None:
                self._died(s, code, f"worker{rank}.log on node {info.node} ({info.host})")
            self._departed(s, leave)
        silent = rdv.silent_s(info.node, now)
        if silent > self.silence_s:
            if not self._goes_on_without(info):
                raise self._node_silent(info, silent)
            self._lose_node(info)

    def _lost(self, s: WorkerSlot) -> bool:
        """A silent worker on a silent node: the node is lost; the run goes on without it
        when ``run.on_worker_loss = continue`` (``_lose_node``)."""
        info = self.node.node_of(s.rank)
        if not info.node or self.node.rdv.silent_s(info.node, time.monotonic()) <= 2 * BEAT_S \
                or not self._goes_on_without(info):
            return False
        self._lose_node(info)
        return True

    def _exit_reported_soon(self, s: WorkerSlot, now: float) -> bool:
        """As on one host, for a worker of another node whose node beats: that node reports
        its exit. Its latest report is read first (node 0 reads the nodes' beats every BEAT_S,
        the silence every pass)."""
        info = self.node.node_of(s.rank)
        if not info.node:
            return super()._exit_reported_soon(s, now)
        if info.node in self.lost_nodes:
            return False
        self._check_node(info, self.node.rdv, now)
        if s.gone or s.ready is None:   # its exit was in the report: handled
            return True
        return self.node.rdv.silent_s(info.node, now) <= 2 * BEAT_S and \
            super()._exit_reported_soon(s, now)

    def _goes_on_without(self, info: NodeInfo) -> bool:
        return self._goes_on() and info.node != 0

    def _host_of(self, rank: int) -> tuple[int, str]:
        info = self.node.node_of(rank)
        return info.node, info.host

    def _lose_node(self, info: NodeInfo) -> None:
        """Node ``info`` is gone, with its workers (``scenario.hostloss``): the supervisor's
        ``_lose`` of those still there."""
        ranks = [r for r in blocks([i.workers for i in self.node.infos])[info.node]
                 if not self.slots[r].gone]
        self.lost_nodes.add(info.node)
        if ranks:   # else its workers had all left as the scenario said: nothing to decide
            self._lose(info.node, info.host, ranks,
                       f"node {info.node} ({info.host}, workers {ranks})")

    # -- a lost node that comes back (``scenario.hostloss``)
    def _check_back(self, info: NodeInfo, rdv: Rendezvous) -> None:
        """Answer a lost node's agent started again, once: take its workers back from the
        round an event reached now is fixed at, or refuse in one line why not."""
        req = rdv.back_request(info.node)
        if req is None or (req.node, req.pid) in self.answered:
            return
        self.answered.add((req.node, req.pid))
        block = blocks([i.workers for i in self.node.infos])[info.node]
        # those that had left as the scenario says, for good, stay gone
        ranks = sorted(set(block) & self.plan.world.lost_now())
        why = self._back_refusal(info, req, ranks)
        if why is not None:
            rdv.answer_back(BackOrder(CHECKPOINTS_VERSION, req.node, req.pid, 0, {}, {}, why))
            if self.progress is not None:
                self.progress({"kind": "event", "text": f"node {info.node} not taken back: "
                                                        f"{why}"})
            return
        held = rdv.back_holdings(req.node, req.pid).checked(info.node, block,
                                                            self.cfg.run.rounds)
        back, addrs = self._back(info.node, req.host, ranks,
                                 self._from_checkpoints(ranks, held))
        for r in ranks:
            self.lives[r] += 1
        rdv.seen.pop(info.node, None)   # its new agent's beats are watched afresh
        self.node.infos[info.node] = req
        self.lost_nodes.discard(info.node)
        rdv.answer_back(BackOrder(CHECKPOINTS_VERSION, req.node, req.pid, back.round,
                                  {r: self.lives[r] for r in ranks}, addrs))

    def _from_checkpoints(self, ranks: list[int], held: Holdings) -> bool:
        """Whether the returning workers restore their own checkpoints: the run writes them,
        the algorithm's state between rounds is each worker's own (not DiLoCo's shared
        momentum), and the host holds, for every one of them, the file of the last
        checkpoint round it wrote before the round they would join at; else each starts from
        a living neighbour's parameters."""
        if not self.cfg.run.checkpoint_every or self.plan.algo.groups_all_reduce():
            return False
        start, world = self.scenario.back_round(ranks), self.plan.world
        wrote = {r: world.restore_rounds(r, start) for r in ranks}
        return all(wrote[r] and wrote[r][-1] in held.held.get(r, ()) for r in ranks)

    def _back_refusal(self, info: NodeInfo, req: NodeInfo, ranks: list[int]) -> str | None:
        """Why node 0 does not take the node of ``req`` back, or None."""
        try:   # as at the start; a resumed run's (--resume) agent comes back without it
            check_agreement([self.node.infos[0],
                             dataclasses.replace(req, resuming=self.node.infos[0].resuming)])
        except ClusterError as exc:
            return str(exc)
        if (req.workers, req.addr) != (info.workers, info.addr):
            return (f"it now runs {req.workers} workers at {req.addr}; the run has "
                    f"{info.workers} at {info.addr} there")
        if not ranks:
            return "none of its workers is lost: those that left as the scenario says stay gone"
        return self.scenario.back_refusal(info.node, ranks)


def _run_master(node: Node, path: Path, progress_factory, log: Log) -> LaunchResult:
    """Host the run: rendezvous, shape this host's links, supervise every worker, keep the
    record, and tell the other nodes how it ended, whatever ended it."""
    with records.RunRecord(path, node.cfg) as rec:
        rec.faults(node.plan.world)
        sup = ClusterSupervisor(path, rec, node)
        try:
            node.join(node.info(sup.ctl_addr, sup.hb_addr))
            if node.resume_dir is not None:
                sup.resume = node.choose_resume(records.rows_by_round(path), log)
                rec.resume_from(sup.resume.round)
                log(f"node 0: every worker goes on after round {sup.resume.round}")
            with node.network:
                log(f"node 0 of {node.role.nnodes}: {node.cfg.workers} workers on "
                    f"{len(node.infos)} hosts ({', '.join(i.host for i in node.infos)}); "
                    f"shaper {node.network.shaper}; record: {path}")
                with _progress(progress_factory, node.labels(), node.network.shaper) as prog:
                    sup.progress = prog
                    code, summary = supervise(sup)
        except BaseException as exc:  # noqa: BLE001 - the record and every node learn why
            sup.close()
            code, summary = _ending(exc)
            summary |= {"mode": "run"}
        summary = _end(node, summary, rec)
    return LaunchResult(code, summary, path)


def _ending(exc: BaseException) -> tuple[int, dict]:
    """Exit code and summary of a node's run that ``exc`` ended; bad settings are bad input."""
    from netem.capabilities import CapabilityError
    from netem.profiles import ProfileError
    if isinstance(exc, (ClusterError, CapabilityError, ProfileError)):
        return exitcodes.BAD_INPUT, {"status": "failed", "error": str(exc)}
    return outcome(exc)


class _NoProgress:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def _progress(factory, labels, shaper):
    return factory(labels, shaper) if factory is not None else _NoProgress()


def _end(node: Node, summary: dict, rec: records.RunRecord) -> dict:
    """Record the nodes, tell every node how the run ended, and wait until they have read it."""
    summary = summary | {"nodes": node.describe(), "launch": node.role.source,
                         "security": node.security.mode}
    if node.rdv is not None:
        try:
            node.rdv.end(summary.get("status", "ok"), summary.get("error"))
            late = node.rdv.wait_left(LEAVE_WAIT_S)
        except RuntimeError as exc:  # torchrun's store went first; the others time out alone
            late = [f"store gone: {str(exc).splitlines()[0]}"]
        if late:
            summary = summary | {"nodes_not_confirmed": late}
    try:
        rec.summary(summary)
    except records.RecordError as exc:
        summary |= {"status": "failed", "error": str(exc)}
    return summary


# ---------------------------------------------------------------- the other nodes

def _run_agent(node: Node, local_dir: Path, log: Log) -> LaunchResult:
    """Start this node's workers, beat, and wait for node 0's end of the run; when the run is
    under way already (node 0 lost this node), ask node 0 to take it back and start its
    workers from the round node 0 says."""
    back = None
    try:
        back = node.join(node.info(), local_dir)
        if node.resume_dir is not None and back is None:
            node.follow_resume(log)
    except BaseException:
        if node.rdv is not None:
            node.rdv.leave()  # node 0 need not wait for us to read its end
        raise
    local_dir.mkdir(parents=True, exist_ok=True)
    (local_dir / "config.toml").write_text(to_toml(node.cfg))
    node.launch_spec().write(local_dir)
    master, ranks = node.infos[0], list(node.ranks)
    if back is not None:   # its killed predecessor could not undo what it changed here
        node.network.clear_leftovers(lambda line: log(f"node {node.role.node_rank}: {line}"))
    with node.network:
        log(f"node {node.role.node_rank} of {node.role.nnodes}: workers {ranks} for the run of "
            f"node 0 ({master.host}), which keeps the record; shaper {node.network.shaper}; "
            f"logs: {local_dir / 'workers'}"
            + (f"; back in the run: its workers join at round {back.start}" if back else ""))
        end = _serve_workers(node, local_dir, master, back)
    status = end.get("status", "error")
    log(f"node {node.role.node_rank}: the run ended {status}"
        + (f": {end['error']}" if end.get("error") else ""))
    return LaunchResult(_EXIT_CODES.get(status, exitcodes.INTERNAL), dict(end), None)


def _serve_workers(node: Node, local_dir: Path, master: NodeInfo,
                   back: BackOrder | None = None) -> dict:
    """This node's workers from start to exit (``back``: each from node 0's round, on its
    predecessor's address, after node 0 lost this node); how node 0 says the run ended."""
    zygote = node.zygote
    devices = dict(zip(node.ranks, node.devices, strict=True))

    def spawn(rank: int, rejoin: tuple[str, int] | None = None):
        return spawn_worker(local_dir, rank, devices[rank], node.network, node.security,
                            rejoin=rejoin, zygote=zygote)

    if back is None:
        procs, lives = {r: spawn(r) for r in node.ranks}, dict.fromkeys(node.ranks, 0)
    else:
        # the workers lost with the host; one that had left as the scenario says stays gone
        procs = {r: spawn(r, (back.addrs[r], back.start)) for r in sorted(back.lives)}
        lives = dict(back.lives)
    try:
        with SigTerm():
            end = _watch(node, procs, lives, master, spawn, Pruner(local_dir, node.rdv))
        reap(list(procs.values()), EXIT_GRACE_S)
        node.rdv.leave()
        return end
    finally:
        reap([p for p in procs.values() if p.poll() is None], 0.0)
        zygote.close()


class Pruner:
    """Another node's checkpoint folder, pruned as node 0 orders (``PruneOrder``): a round
    goes only once every worker of every host has whole files of two later ones."""

    def __init__(self, local_dir: Path, rdv: Rendezvous):
        self.store, self.rdv, self.done = Checkpoints(local_dir), rdv, -1

    def __call__(self) -> None:
        order = self.rdv.prune_order()
        if order is not None and order.keep_from > self.done:
            self.store.prune(order.keep_from)
            self.done = order.keep_from


def _watch(node: Node, procs: dict, lives: dict, master: NodeInfo, spawn,
           prune: Pruner) -> dict:
    """Beat until node 0 says the run ended, starting the successors it orders and pruning
    checkpoints as it says; RunFailed when node 0 is gone or silent. ``lives``: which
    process of each rank runs (node 0's count)."""
    rdv, timeout_s = node.rdv, node.cfg.run.heartbeat_timeout_s
    while True:
        try:
            _successors(rdv, procs, lives, spawn)
            prune()
            dead = {r: p.poll() for r, p in procs.items() if p.poll() not in (None, 0)}
            rdv.beat(dead, lives)
            end = rdv.ended()
            silent = rdv.silent_s(0, time.monotonic())
        except RuntimeError as exc:  # the store is gone with node 0 (DistNetworkError)
            raise RunFailed(f"lost node 0 ({master.host}): {str(exc).splitlines()[0]}") from None
        if end is not None:
            return end
        if silent > timeout_s:
            raise RunFailed(f"node 0 ({master.host}) silent for {silent:.0f} s")
        time.sleep(BEAT_S)


def _successors(rdv: Rendezvous, procs: dict, lives: dict, spawn) -> None:
    """Start the successor node 0 ordered for a worker of this node whose process ended (a
    scenario's leave, then its join: ``Supervisor._departed``)."""
    for rank, proc in procs.items():
        if proc.poll() is None:
            continue
        order = rdv.successor(rank, lives[rank] + 1)
        if order is not None:
            procs[rank] = spawn(rank, (order.addr, order.start))
            lives[rank] = order.life


def agent_dir(cfg: Config, out: str | None, node: int, label: str = "run") -> Path:
    """Where a node other than 0 keeps its workers' logs: next to where node 0's record would
    go, named for the node (``<out>.node<k>``, or a fresh ``<name>-<time>.node<k>``)."""
    base = Path(out) if out else records.fresh_path(cfg, label)
    return base.with_name(f"{base.name}.node{node}")


def launch_cluster(plan: RunPlan, path: Path | None, role: NodeRole, *,
                   secret_file: str | None, out: str | None = None, progress_factory=None,
                   log: Log, env=os.environ, zygote: Zygote | None = None,
                   resume_dir: Path | None = None) -> LaunchResult:
    """``gasloc-emu run`` on one node of a multi-node run; node 0 gets the record's ``path``.
    ``zygote``: this node's workers' zygote, when the caller started it early; ``resume_dir``:
    this host's folder of the run to go on from (node 0: ``path``)."""
    cfg = plan.cfg
    node = Node(plan, role, load_secret(secret_file, env), zygote, resume_dir)
    if role.is_master:
        return _run_master(node, path, progress_factory, log)
    try:
        local = resume_dir or agent_dir(cfg, out, role.node_rank, plan.run_label())
        return _run_agent(node, local, log)
    except BaseException as exc:  # noqa: BLE001 - every ending is one line and an exit code
        code, summary = _ending(exc)
        log(f"error: node {role.node_rank}: {summary['error']}")
        return LaunchResult(code, summary, None)


def describe_role(plan: RunPlan, role: NodeRole) -> str:
    """What ``run --dry-run`` prints on one node of a multi-node run (nothing is started)."""
    cfg = plan.cfg
    decision = multi_host_decision(cfg, plan.link_plan, plays_links=_plays_links(plan))
    store = "torchrun's agent store" if role.use_agent_store else (
        "hosted here" if role.is_master else "hosted by node 0")
    return (f"# node {role.node_rank} of {role.nnodes} (from {role.source}); store "
            f"{role.master_addr}:{role.master_port} ({store})\n"
            f"# shaper: {decision.shaper} ({decision.reason}); security: "
            f"{'curve' if cfg.run.security == 'auto' else cfg.run.security}\n"
            f"# workers here: {role.nproc_per_node or 'GPUs visible, else an even share'}")
