"""Rendezvous and node liveness of a multi-node run, over torch.distributed's ``TCPStore``.

The store is the one torchrun itself uses (we host it on node 0, or join torchrun's agent
store), so there is no home-made rendezvous server. It is unauthenticated: nothing secret goes
through it (the run's keys come from the shared secret, ``cluster.load_secret``), and every
value read from it is parsed into a typed, checked ``NodeInfo`` or ``NodeStatus``. What a
stranger with access to the store port could do is stop the run or delay its start; parameters
and metrics travel only over the authenticated planes.

Keys (under the role's prefix): ``node/<k>`` (NodeInfo, JSON), ``status/<k>`` (NodeStatus,
JSON: a beat counter and the exit codes of dead local workers), ``end`` (how the run ended,
written by node 0), ``left/<k>`` (node k saw the end and is leaving); for checkpoints,
``holdings/<k>`` (Holdings: which rounds node k's workers have whole on its disk, sent when a
run resumes), ``resume`` (ResumeOrder: the round node 0 chose from them) and ``prune``
(PruneOrder: below which round every node may remove its files), all versioned; for a lost
host that comes back, ``running`` (node 0 started the run: a node agent that finds it is
coming back), ``back/<k>`` (the returning agent's NodeInfo) and ``back/<k>/holdings/<pid>`` (its
Holdings), ``back/<k>/<pid>`` (BackOrder: node 0's answer to that process).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import timedelta

from gasloc_emu import config as C
from gasloc_emu.cluster.roles import ClusterError, NodeRole
from gasloc_emu.training.checkpoint import Refusal

# Settings that may differ between hosts: where the record goes, how progress is shown, and
# how the host's own cores and GPUs are used.
NODE_LOCAL = ("run.out_dir", "run.dashboard", "run.threads_per_worker", "run.device")
JOIN_TIMEOUT_S = 300.0


class RendezvousError(ClusterError):
    """The nodes could not agree on a run (a config mismatch, a node that never came)."""


@dataclass(frozen=True)
class NodeInfo:
    """What one node agent publishes before any worker starts."""

    node: int
    host: str                       # host name, for the record and for messages
    addr: str                       # the address its workers' data planes bind
    workers: int                    # how many workers it runs
    devices: tuple[str, ...]        # one per local worker, as the worker names it
    labels: tuple[str, ...]         # one per local worker, for the dashboard ("cuda:0 (gpu 3)")
    config_hash: str
    config: dict                    # the resolved config (node-local settings dropped)
    version: str                    # gasloc-emu's version on that host
    tc_missing: str                 # why tc cannot shape its interfaces ("" = it can)
    port_base: int                  # first of its workers' data-plane ports (tc: per link)
    ctl_addr: str = ""              # node 0 only: the control plane's ROUTER (tcp://)
    hb_addr: str = ""               # node 0 only: the control plane's heartbeat PULL (tcp://)
    pid: int = 0
    resuming: int = 0               # 1: started with --resume (every node must be, or none)
    threads: int = 0                # torch CPU threads of each of its workers (the record's)

    def __post_init__(self) -> None:
        if self.resuming not in (0, 1):
            raise RendezvousError(f"node {self.node}: resuming = {self.resuming!r}; expected 0 "
                                  "or 1")
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "labels", tuple(self.labels))
        for name in ("devices", "labels"):
            items = getattr(self, name)
            if len(items) != self.workers or not all(isinstance(v, str) for v in items):
                raise RendezvousError(f"node {self.node}: {self.workers} workers but {name} "
                                      f"{list(items)!r}; expected one string per worker")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeInfo:
        return _typed(cls, text, "node info")


@dataclass(frozen=True)
class NodeStatus:
    """A node's liveness: ``beat`` grows while it runs; ``dead`` = {rank: exit code} of its
    workers whose current process ended early; ``lives`` = {rank: n}, the n-th process of that
    rank (0: the first; a scenario's successor after a leave is the next)."""

    node: int
    beat: int
    dead: dict = field(default_factory=dict)
    lives: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "beat": self.beat,
                           "dead": {str(k): v for k, v in self.dead.items()},
                           "lives": {str(k): v for k, v in self.lives.items()}})

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeStatus:
        st = _typed(cls, text, "node status")
        return cls(st.node, st.beat, _rank_ints(st.dead, "dead", "integer exit code"),
                   _rank_ints(st.lives, "lives", "process count >= 0"))


def _rank_ints(raw: dict, name: str, what: str) -> dict[int, int]:
    ok = all(isinstance(k, str) and k.isdecimal() and type(v) is int for k, v in raw.items())
    if not ok or (name == "lives" and any(v < 0 for v in raw.values())):
        raise RendezvousError(f"node status has a bad {name!r} map: {raw!r}; expected "
                              f"worker rank -> {what}")
    return {int(k): v for k, v in raw.items()}


@dataclass(frozen=True)
class Successor:
    """Node 0's order to a node: start rank ``rank``'s process number ``life`` (a planned
    departure's successor), on the address its predecessor bound, from round ``start``."""

    rank: int
    life: int
    addr: str
    start: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Successor:
        return _typed(cls, text, "successor order")


CHECKPOINTS_VERSION = 1   # of Holdings, ResumeOrder and PruneOrder in the store
MAX_WHY_CHARS = 1000      # a refusal's line, as a host reports it


@dataclass(frozen=True)
class Holdings:
    """A node's checkpoints, checked on its own disk before a resumed run starts: ``held`` =
    {rank: rounds of which its file is whole} for each of its workers, ``refused`` = the files
    that failed their check (``training.checkpoint.Refusal``). Node 0 trusts a rank's rounds
    only from the node that runs it (``checked``)."""

    version: int
    node: int
    held: dict[int, tuple[int, ...]]
    refused: tuple[Refusal, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "node": self.node,
                           "held": {str(k): list(v) for k, v in self.held.items()},
                           "refused": [asdict(x) for x in self.refused]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Holdings:
        raw = _json_object(text, "checkpoint holdings", {"version", "node", "held", "refused"})
        _check_version(raw, "checkpoint holdings")
        node, held, refused = raw["node"], raw["held"], raw["refused"]
        ok = _nonneg(node) and isinstance(held, dict) and isinstance(refused, list) and all(
            isinstance(k, str) and k.isdecimal() and isinstance(v, list)
            and all(_nonneg(r) for r in v) for k, v in held.items()) and all(
            isinstance(x, dict) and set(x) == {"rank", "round", "why"} and _nonneg(x["rank"])
            and _nonneg(x["round"]) and isinstance(x["why"], str) for x in refused)
        if not ok:
            raise RendezvousError(f"checkpoint holdings in the store are malformed: "
                                  f"{str(raw)[:200]}")
        return cls(CHECKPOINTS_VERSION, node,
                   {int(k): tuple(sorted(set(v))) for k, v in held.items()},
                   tuple(Refusal(x["rank"], x["round"], x["why"][:MAX_WHY_CHARS])
                         for x in refused))

    def checked(self, node: int, ranks: range, rounds: int) -> Holdings:
        """These holdings, when they are ``node``'s, of exactly its ``ranks``, and of rounds
        the run has; else a RendezvousError naming what is wrong."""
        bad = [r for v in self.held.values() for r in v if r >= rounds] + \
              [x.round for x in self.refused if x.round >= rounds]
        if self.node != node or set(self.held) != set(ranks) or bad or \
                any(x.rank not in ranks for x in self.refused):
            raise RendezvousError(f"node {node}'s checkpoint holdings do not fit the run "
                                  f"(workers {list(ranks)}, rounds < {rounds}): node "
                                  f"{self.node}, workers {sorted(self.held)}, rounds {bad}")
        return self


@dataclass(frozen=True)
class ResumeOrder:
    """Node 0's choice for a resumed run: every worker restores its checkpoint of ``round``."""

    version: int
    round: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ResumeOrder:
        return _versioned(cls, text, "resume order")


@dataclass(frozen=True)
class PruneOrder:
    """Node 0 to every node: checkpoints of rounds before ``keep_from`` may go (every worker
    has whole files of two later rounds: ``CheckpointWatch``)."""

    version: int
    keep_from: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PruneOrder:
        return _versioned(cls, text, "prune order")


@dataclass(frozen=True)
class BackOrder:
    """Node 0's answer to node ``node``'s agent (process ``pid``) started again after node 0
    lost it: ``refused`` says why it is not taken back (one line), else its workers start
    from round ``start``, rank r as process number ``lives[r]`` on address ``addrs[r]`` (its
    predecessor's, which its peers know)."""

    version: int
    node: int
    pid: int
    start: int
    lives: dict[int, int]
    addrs: dict[int, str]
    refused: str = ""

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "node": self.node, "pid": self.pid,
                           "start": self.start, "refused": self.refused,
                           "lives": {str(k): v for k, v in self.lives.items()},
                           "addrs": {str(k): v for k, v in self.addrs.items()}}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> BackOrder:
        raw = _json_object(text, "back order", {f.name for f in fields(cls)})
        _check_version(raw, "back order")
        lives, addrs = raw["lives"], raw["addrs"]
        ok = all(_nonneg(raw[k]) for k in ("node", "pid", "start")) and \
            isinstance(raw["refused"], str) and isinstance(lives, dict) and \
            isinstance(addrs, dict) and set(lives) == set(addrs) and all(
                isinstance(k, str) and k.isdecimal() and _nonneg(v) for k, v in lives.items()) \
            and all(isinstance(v, str) and v.startswith("tcp://") for v in addrs.values())
        if not ok:
            raise RendezvousError(f"the back order in the store is malformed: {str(raw)[:200]}")
        return cls(CHECKPOINTS_VERSION, raw["node"], raw["pid"], raw["start"],
                   {int(k): v for k, v in lives.items()}, {int(k): v for k, v in addrs.items()},
                   raw["refused"][:MAX_WHY_CHARS])


def _nonneg(v) -> bool:
    return type(v) is int and v >= 0


def _json_object(text: str | bytes, what: str, keys: set[str]) -> dict:
    try:
        raw = json.loads(text)
    except ValueError:
        raise RendezvousError(f"{what} in the store is not JSON") from None
    if not isinstance(raw, dict) or set(raw) != keys:
        raise RendezvousError(f"{what} in the store has the wrong fields")
    return raw


def _check_version(raw: dict, what: str) -> None:
    if raw["version"] != CHECKPOINTS_VERSION:
        raise RendezvousError(f"{what} of version {raw['version']!r}; this gasloc-emu reads "
                              f"{CHECKPOINTS_VERSION}")


def _versioned(cls, text: str | bytes, what: str):
    """One of the orders above: every field an integer >= 0, of this version."""
    raw = _json_object(text, what, {f.name for f in fields(cls)})
    _check_version(raw, what)
    bad = [k for k, v in raw.items() if not _nonneg(v)]
    if bad:
        raise RendezvousError(f"{what}: {bad[0]} = {raw[bad[0]]!r} is not an integer >= 0")
    return cls(**raw)


_TYPES = {"int": int, "str": str, "dict": dict, "tuple[str, ...]": list}


def _typed(cls, text: str | bytes, what: str):
    """A dataclass from the store's JSON, every field present and of its type."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise RendezvousError(f"{what} in the store is not JSON") from None
    names = {f.name: f for f in fields(cls)}
    required = {f.name for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING}
    if not isinstance(raw, dict) or not set(names) >= set(raw) or not set(raw) >= required:
        raise RendezvousError(f"{what} in the store has the wrong fields")
    for key, value in raw.items():
        want = _TYPES[str(names[key].type)]
        if isinstance(value, bool) or not isinstance(value, want):
            raise RendezvousError(f"{what}: {key} = {value!r} is not a {names[key].type}")
    return cls(**raw)


# ---------------------------------------------------------------- config agreement

def shared_config(cfg: C.Config) -> dict:
    """The config every node must agree on: all of it but the node-local settings."""
    tree = C.to_dict(cfg)
    for key in NODE_LOCAL:
        section, name = key.split(".")
        tree[section].pop(name, None)
    return tree


def config_hash(cfg: C.Config) -> str:
    return hashlib.sha256(json.dumps(shared_config(cfg), sort_keys=True).encode()).hexdigest()


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config trees."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}")
    return out


def check_agreement(infos: list[NodeInfo]) -> None:
    """Every node has node 0's config and version; else one line naming what differs."""
    ref = infos[0]
    for info in infos[1:]:
        if info.resuming != ref.resuming:
            how = {0: "starts afresh", 1: "resumes (--resume)"}
            raise RendezvousError(f"node {info.node} ({info.host}) {how[info.resuming]}, node 0 "
                                  f"({ref.host}) {how[ref.resuming]}; give --resume on every "
                                  "node or on none")
        if info.version != ref.version:
            raise RendezvousError(f"node {info.node} ({info.host}) runs gasloc-emu "
                                  f"{info.version}, node 0 ({ref.host}) {ref.version}")
        if info.config_hash != ref.config_hash:
            keys = config_diff(ref.config, info.config)
            shown = ", ".join(f"{k} = {_lookup(ref.config, k)!r} on node 0, "
                              f"{_lookup(info.config, k)!r} on node {info.node}"
                              for k in keys[:3])
            more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
            raise RendezvousError(f"node {info.node} ({info.host}) has a different config: "
                                  f"{shown or 'hash differs'}{more}; start every node with the "
                                  "same settings")


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


# ---------------------------------------------------------------- the store

def open_store(role: NodeRole, timeout_s: float = JOIN_TIMEOUT_S):
    """Node 0 hosts a TCPStore at the master address (unless torchrun's agent hosts one);
    every other node joins it. A PrefixStore keeps our keys apart."""
    import torch.distributed as dist  # only multi-node runs load torch.distributed
    host = role.is_master and not role.use_agent_store
    try:
        store = dist.TCPStore(role.master_addr, role.master_port, None, host,
                              timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as exc:  # TCPStore raises DistNetworkError (RuntimeError)
        what = "host the store on" if host else "reach the store at"
        raise RendezvousError(f"node {role.node_rank} could not {what} "
                              f"{role.master_addr}:{role.master_port}: "
                              f"{str(exc).splitlines()[0]}") from None
    return dist.PrefixStore(role.store_prefix, store)


class Rendezvous:
    """One node's use of the store: publish, gather, beat, watch, end."""

    def __init__(self, store, role: NodeRole):
        self.store, self.role = store, role
        self.beats = 0
        self.seen: dict[int, tuple[int, float]] = {}  # node -> (last beat, when it changed)

    def publish(self, info: NodeInfo) -> None:
        self.store.set(f"node/{info.node}", info.to_json())

    def gather(self, timeout_s: float = JOIN_TIMEOUT_S) -> list[NodeInfo]:
        """Every node's info, in node order, once all have published (at most ``timeout_s``)."""
        keys = [f"node/{k}" for k in range(self.role.nnodes)]
        deadline = time.monotonic() + timeout_s
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                missing = [k for k in range(self.role.nnodes)
                           if not self.store.check([f"node/{k}"])]
                raise RendezvousError(f"nodes {missing} did not join within {timeout_s:g} s")
            time.sleep(0.1)
        infos = [NodeInfo.from_json(self.store.get(k)) for k in keys]
        for k, info in enumerate(infos):
            if info.node != k:
                raise RendezvousError(f"the store's node/{k} says it is node {info.node}")
        check_agreement(infos)
        return infos

    def beat(self, dead: dict[int, int], lives: dict[int, int] | None = None) -> None:
        """This node is alive; ``dead``: exit codes of its workers that ended early; ``lives``:
        which process of each rank that is (``NodeStatus``)."""
        self.beats += 1
        self.store.set(f"status/{self.role.node_rank}",
                       NodeStatus(self.role.node_rank, self.beats, dead, lives or {}).to_json())

    def order_successor(self, order: Successor) -> None:
        """Node 0: the node of ``order.rank`` is to start its next process."""
        self.store.set(f"successor/{order.rank}/{order.life}", order.to_json())

    def successor(self, rank: int, life: int) -> Successor | None:
        """The order for ``rank``'s process number ``life``, once node 0 has given it."""
        key = f"successor/{rank}/{life}"
        if not self.store.check([key]):
            return None
        order = Successor.from_json(self.store.get(key))
        if (order.rank, order.life) != (rank, life):
            raise RendezvousError(f"the store's {key} is an order for {order.rank}/{order.life}")
        return order

    def publish_holdings(self, holdings: Holdings) -> None:
        self.store.set(f"holdings/{holdings.node}", holdings.to_json())

    def gather_holdings(self, timeout_s: float = JOIN_TIMEOUT_S) -> list[Holdings]:
        """Node 0: every other node's ``Holdings``, once all have published them."""
        keys = [f"holdings/{k}" for k in range(1, self.role.nnodes)]
        deadline = time.monotonic() + timeout_s
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                missing = [k for k in range(1, self.role.nnodes)
                           if not self.store.check([f"holdings/{k}"])]
                raise RendezvousError(f"nodes {missing} did not say which checkpoints they "
                                      f"hold within {timeout_s:g} s")
            time.sleep(0.1)
        return [Holdings.from_json(self.store.get(k)) for k in keys]

    def order_resume(self, order: ResumeOrder) -> None:
        self.store.set("resume", order.to_json())

    def resume_order(self, timeout_s: float = JOIN_TIMEOUT_S) -> ResumeOrder:
        """The round node 0 chose for every worker; a RendezvousError when node 0 ended the
        run instead (it found no round every worker holds) or said nothing in time."""
        return ResumeOrder.from_json(self._await_order(
            "resume", timeout_s,
            lambda end: f"node 0 chose no round to resume from: {end.get('error')}",
            f"node 0 chose no round to resume from within {timeout_s:g} s"))

    def _await_order(self, key: str, timeout_s: float, if_ended, if_late: str) -> bytes:
        """What node 0 puts at ``key``, once it is there; a RendezvousError saying
        ``if_ended(end)`` when node 0 ends the run first, ``if_late`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.store.check([key]):
            end = self.ended()
            if end is not None:
                raise RendezvousError(if_ended(end))
            if time.monotonic() > deadline:
                raise RendezvousError(if_late)
            time.sleep(0.1)
        return self.store.get(key)

    # -- a lost host that comes back
    def mark_running(self) -> None:
        """Node 0: the run has started; a node agent that joins from now on is coming back."""
        self.store.set("running", "1")

    def running(self) -> bool:
        return self.store.check(["running"])

    def published(self) -> list[NodeInfo]:
        """Every node's info as published at the start (a run under way has them all)."""
        infos = [NodeInfo.from_json(self.store.get(f"node/{k}"))
                 for k in range(self.role.nnodes)]
        if [i.node for i in infos] != list(range(self.role.nnodes)):
            raise RendezvousError("the store's node infos are not numbered 0 ..")
        return infos

    def ask_back(self, info: NodeInfo, holdings: Holdings) -> None:
        """This node's agent, started again after node 0 lost it, asks to be taken back,
        saying which checkpoints its host holds (its workers may come back from them)."""
        self.store.set(f"back/{info.node}/holdings/{info.pid}", holdings.to_json())
        self.store.set(f"back/{info.node}", info.to_json())

    def back_holdings(self, node: int, pid: int) -> Holdings:
        """Node 0: the checkpoints the returning agent ``pid`` of ``node`` said it holds."""
        return Holdings.from_json(self.store.get(f"back/{node}/holdings/{pid}"))

    def back_request(self, node: int) -> NodeInfo | None:
        """Node 0: the latest request of ``node``'s agent to come back, or None."""
        key = f"back/{node}"
        if not self.store.check([key]):
            return None
        info = NodeInfo.from_json(self.store.get(key))
        if info.node != node:
            raise RendezvousError(f"the store's {key} says it is node {info.node}")
        return info

    def answer_back(self, order: BackOrder) -> None:
        self.store.set(f"back/{order.node}/{order.pid}", order.to_json())

    def back_order(self, node: int, pid: int, timeout_s: float) -> BackOrder:
        """Node 0's answer to this agent's request (``ask_back``); a RendezvousError when the
        run ended first or none came in ``timeout_s``."""
        key = f"back/{node}/{pid}"
        order = BackOrder.from_json(self._await_order(
            key, timeout_s,
            lambda end: f"the run ended ({end.get('status')}) before node 0 took node {node} "
                        "back",
            f"node 0 did not take node {node} back within {timeout_s:g} s (it waits for the "
            "node to be silent for run.heartbeat_timeout_s first)"))
        if (order.node, order.pid) != (node, pid):
            raise RendezvousError(f"the store's {key} answers node {order.node} process "
                                  f"{order.pid}")
        return order

    def order_prune(self, order: PruneOrder) -> None:
        self.store.set("prune", order.to_json())

    def prune_order(self) -> PruneOrder | None:
        if not self.store.check(["prune"]):
            return None
        return PruneOrder.from_json(self.store.get("prune"))

    def status(self, node: int) -> NodeStatus | None:
        key = f"status/{node}"
        if not self.store.check([key]):
            return None
        return NodeStatus.from_json(self.store.get(key))

    def silent_s(self, node: int, now: float) -> float:
        """Seconds since ``node``'s beat last changed (0 the first time it is looked at)."""
        st = self.status(node)
        beat = st.beat if st is not None else -1
        last = self.seen.get(node)
        if last is None or last[0] != beat:
            self.seen[node] = (beat, now)
            return 0.0
        return now - last[1]

    def end(self, status: str, error: str | None) -> None:
        self.store.set("end", json.dumps({"status": status, "error": error}))

    def ended(self) -> dict | None:
        if not self.store.check(["end"]):
            return None
        try:
            raw = json.loads(self.store.get("end"))
        except ValueError:
            raw = None
        if not isinstance(raw, dict) or not isinstance(raw.get("status"), str):
            raise RendezvousError("the store's end record is malformed")
        return raw

    def leave(self) -> None:
        self.store.set(f"left/{self.role.node_rank}", "1")

    def wait_left(self, timeout_s: float, silent_after_s: float = 2.0) -> list[int]:
        """Node 0 keeps the store up until every node has seen the end; who never said so.

        A node whose beats stopped more than ``silent_after_s`` ago (as far as ``silent_s``
        has watched it) cannot read anything: it is not waited for."""
        deadline = now = time.monotonic()
        deadline += timeout_s
        pending = [k for k in range(1, self.role.nnodes)
                   if self.silent_s(k, now) <= silent_after_s]
        while True:  # looks at least once, and once more after the deadline
            pending = [k for k in pending if not self.store.check([f"left/{k}"])]
            if not pending or time.monotonic() >= deadline:
                return pending
            time.sleep(0.05)
