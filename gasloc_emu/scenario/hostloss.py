"""A host lost without warning (its node agent and its workers killed): node 0's decision, and
what it means for the others' rounds and messages.

Pure rules, no sockets and no clock of their own: node 0 decides (``cluster.multinode``), each
worker plays the decision (``World.lose``), and ``simulate --replay`` plays it again from the
record.

The rules (docs/ALGORITHM.md, "A host lost without warning"):

- Node 0 declares a host lost when its node agent's beats have stopped for
  ``run.heartbeat_timeout_s`` (and ``run.on_worker_loss = continue``); a worker process
  killed by a signal while its host lives (its agent, or the one-host launcher, sees it exit)
  is lost the same way, alone (``cause = worker``). Its workers leave at round
  ``L`` = the round an event at a time of those workers would be fixed at then
  (``fixing.RoundFixer``: at least one after the highest any worker has started, after their
  own changes before it): no worker has started round L, and each asks before it
  starts one, so every survivor plays the departure at the same round, as a scenario's leave
  (Metropolis–Hastings weights over the survivors from round L, DiLoCo's ring re-formed).
- Between the last round a lost worker reported (``last_rows``) and L it is still a member, but
  it died during the first of those rounds, so its messages from then on never come (and one
  it had handed to its socket before dying may not have left either). A survivor that waits
  for a message of a lost worker when the decision reaches it, or later, stops waiting: the
  message is *lost with a dead peer*, counted (reason ``dead_peer``,
  ``transport.base.DEAD_PEER``), and its term of the gossip sum is the receiver's own value
  (its weight moves to the self-weight, as if the receiver had sent the message to itself).
  Each survivor reports exactly which messages it did without (the row's ``dead_peer``),
  because one sent just before the death may have reached some receivers and not others:
  the replay takes those, and nothing else, as lost.
- Messages to a lost worker in those rounds are lost with it; they are counted by the same
  reason from the rounds' exchanges (``sent_to_dead``), the same in the run and in its replay.
- DiLoCo's ring cannot do without a chunk the way gossip does without a term: the chunk stands
  as NaN, the ring goes on, and a survivor whose mean holds it does not commit the round
  (``algorithms.diloco``, as torchft discards a failed step); in round L the survivors merge
  their states, then all-reduce over the ring of the living.
- A lost host may come back: its node agent started again on it (the same command) asks node
  0 to take it back, and node 0 decides a ``HostBack``: its workers join at round ``J`` = the
  round an event reached then is fixed at (the same rule, so no worker has started J), each
  from its own checkpoint where the run writes them and its host still holds the file the
  join needs, else from a living neighbour's current parameters, as a scenario's join
  (``JoinEvent``). Between the loss's round and J they are absent; from J they are members
  again, and a survivor waits for their messages as for anyone's.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

HOSTLOSS_VERSION = 1
# a loss's cause -> the reason its leaves give in the record
CAUSES = {"host": "host lost", "worker": "worker lost"}


class HostLossError(ValueError):
    """A host loss that does not fit the run (from the wire or a record)."""


@dataclass(frozen=True)
class HostLoss:
    """Node ``node`` (``host``) was lost at ``at_s`` on the run's clock; its workers ``ranks``
    leave at round ``round``; ``last_rows`` = {rank: the last round it reported} (-1: none).
    ``cause``: ``host`` (its node agent went silent with them) or ``worker`` (one worker
    process killed while its host lives: the same rules, for that worker alone)."""

    node: int
    host: str
    ranks: tuple[int, ...]
    round: int
    at_s: float
    last_rows: dict[int, int]
    version: int = HOSTLOSS_VERSION
    cause: str = "host"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(sorted(self.ranks)))
        if self.version != HOSTLOSS_VERSION:
            raise HostLossError(f"host loss of version {self.version!r}; this gasloc-emu reads "
                                f"{HOSTLOSS_VERSION}")
        if not _nonneg(self.node) or not self.ranks or not all(_nonneg(r) for r in self.ranks):
            raise HostLossError(f"host loss of node {self.node!r}, workers {list(self.ranks)!r}:"
                                " expected a node >= 0 and at least one worker rank >= 0")
        if not _nonneg(self.round) or type(self.at_s) not in (int, float) or self.at_s < 0:
            raise HostLossError(f"host loss at round {self.round!r}, {self.at_s!r} s: expected "
                                "a round >= 0 and a time >= 0")
        if set(self.last_rows) != set(self.ranks) or not all(
                type(v) is int and -1 <= v < self.round for v in self.last_rows.values()):
            raise HostLossError(f"host loss: last_rows {self.last_rows!r} must give each of "
                                f"workers {list(self.ranks)} a round in [-1, {self.round})")
        if not isinstance(self.host, str):
            raise HostLossError(f"host loss: host {self.host!r} is not text")
        if self.cause not in CAUSES or (self.cause == "worker" and len(self.ranks) != 1):
            raise HostLossError(f"host loss of workers {list(self.ranks)} with cause "
                                f"{self.cause!r}: expected one of {list(CAUSES)} (a worker "
                                "cause loses one worker)")

    @property
    def reason(self) -> str:
        """What its leaves say in the record (events.jsonl)."""
        return CAUSES[self.cause]

    def check(self, workers: int, rounds: int) -> HostLoss:
        """This loss, when its ranks are the run's; else a HostLossError naming what is not.
        (Its round may be past the run's last: it then never fires.)"""
        bad = [r for r in self.ranks if r >= workers]
        if bad:
            raise HostLossError(f"host loss of workers {bad}: the run has {workers}")
        return self

    def to_json(self) -> dict:
        return {"version": self.version, "node": self.node, "host": self.host,
                "ranks": list(self.ranks), "round": self.round, "at_s": self.at_s,
                "last_rows": {str(k): v for k, v in sorted(self.last_rows.items())}} | (
                    {"cause": self.cause} if self.cause != "host" else {})

    @classmethod
    def from_json(cls, obj) -> HostLoss:
        keys = {"version", "node", "host", "ranks", "round", "at_s", "last_rows"}
        if not isinstance(obj, dict) or set(obj) - {"cause"} != keys:
            raise HostLossError(f"not a host loss: {str(obj)[:200]}")
        rows = obj["last_rows"]
        if not isinstance(obj["ranks"], list) or not isinstance(rows, dict) or not all(
                isinstance(k, str) and k.isdecimal() for k in rows):
            raise HostLossError(f"not a host loss: {str(obj)[:200]}")
        return cls(obj["node"], obj["host"], tuple(obj["ranks"]), obj["round"], obj["at_s"],
                   {int(k): v for k, v in rows.items()}, obj["version"],
                   obj.get("cause", "host"))

    def dead_from(self, rank: int) -> int | None:
        """The first round ``rank`` never finished (it died during it: what was sent to it
        from then on is lost with it); None when it is not one of this loss's workers."""
        return self.last_rows[rank] + 1 if rank in self.last_rows else None


@dataclass(frozen=True)
class HostBack:
    """Node ``node`` (``host``), lost earlier, came back at ``at_s`` on the run's clock: its
    workers ``ranks`` join at round ``round``, each from its own checkpoint when
    ``from_checkpoint`` (else from a living neighbour's parameters)."""

    node: int
    host: str
    ranks: tuple[int, ...]
    round: int
    at_s: float
    from_checkpoint: bool = False
    version: int = HOSTLOSS_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(sorted(self.ranks)))
        if self.version != HOSTLOSS_VERSION:
            raise HostLossError(f"host back of version {self.version!r}; this gasloc-emu reads "
                                f"{HOSTLOSS_VERSION}")
        if not _nonneg(self.node) or not self.ranks or not all(_nonneg(r) for r in self.ranks) \
                or len(set(self.ranks)) != len(self.ranks):
            raise HostLossError(f"host back of node {self.node!r}, workers {list(self.ranks)!r}:"
                                " expected a node >= 0 and distinct worker ranks >= 0")
        if not _nonneg(self.round) or type(self.at_s) not in (int, float) or self.at_s < 0:
            raise HostLossError(f"host back at round {self.round!r}, {self.at_s!r} s: expected "
                                "a round >= 0 and a time >= 0")
        if not isinstance(self.host, str) or type(self.from_checkpoint) is not bool:
            raise HostLossError(f"host back: host {self.host!r} must be text and "
                                f"from_checkpoint {self.from_checkpoint!r} true or false")

    def check(self, workers: int, losses: list[HostLoss],
              backs: list[HostBack]) -> HostBack:
        """This return, when each of its ranks is the run's and lost (a loss of it before
        ``round``, with no return since); else a HostLossError naming what is not."""
        bad = [r for r in self.ranks if r >= workers]
        if bad:
            raise HostLossError(f"host back of workers {bad}: the run has {workers}")
        for r in self.ranks:
            lost = [x.round for x in losses if r in x.ranks]
            back = [x.round for x in backs if r in x.ranks]
            if not lost or max(lost) >= self.round or (back and max(back) > max(lost)):
                raise HostLossError(f"host back of worker {r} at round {self.round}: it is not "
                                    f"lost then (lost at rounds {lost}, back at {back})")
        return self

    def to_json(self) -> dict:
        return {"version": self.version, "node": self.node, "host": self.host,
                "ranks": list(self.ranks), "round": self.round, "at_s": self.at_s,
                "from_checkpoint": self.from_checkpoint}

    @classmethod
    def from_json(cls, obj) -> HostBack:
        keys = {"version", "node", "host", "ranks", "round", "at_s", "from_checkpoint"}
        if not isinstance(obj, dict) or set(obj) != keys or not isinstance(obj["ranks"], list):
            raise HostLossError(f"not a host back: {str(obj)[:200]}")
        return cls(obj["node"], obj["host"], tuple(obj["ranks"]), obj["round"], obj["at_s"],
                   obj["from_checkpoint"], obj["version"])


def in_decided_order(losses, backs) -> list[HostLoss | HostBack]:
    """Hosts lost and back in the order node 0 decided them: by time, a loss before a return
    at the same time (what a worker that starts mid-run, and a replay, play them in)."""
    return [x for _, _, x in sorted([(x.at_s, 0, x) for x in losses]
                                    + [(x.at_s, 1, x) for x in backs], key=lambda d: d[:2])]


def dead_in(rank: int, t: int, losses: list[HostLoss], backs: list[HostBack]) -> bool:
    """Whether ``rank`` is dead in round t: it died during a round <= t (a loss's
    ``dead_from``) and came back at no round in (that loss's round, t]."""
    for loss in losses:
        start = loss.dead_from(rank)
        if start is None or t < start:
            continue
        if not any(rank in b.ranks and loss.round < b.round <= t for b in backs):
            return True
    return False


def lost_spans(losses: list[HostLoss],
               backs: list[HostBack]) -> dict[int, list[tuple[HostLoss, float]]]:
    """{rank: [(a loss of it, the round of its first return after it, inf for none)]}."""
    out: dict[int, list[tuple[HostLoss, float]]] = {}
    for loss in losses:
        for r in loss.ranks:
            ends = [b.round for b in backs if r in b.ranks and b.round > loss.round]
            out.setdefault(r, []).append((loss, min(ends, default=math.inf)))
    return out


def still_lost(losses: list[HostLoss], backs: list[HostBack]) -> frozenset[int]:
    """The workers lost with their hosts that have not come back since."""
    return frozenset(r for r, spans in lost_spans(losses, backs).items()
                     if any(end == math.inf for _, end in spans))


def _nonneg(v) -> bool:
    return type(v) is int and v >= 0


def sent_to_dead(loss: HostLoss, rounds: int, sends: Callable[[int, int, int], int],
                 alive: Callable) -> dict[int, int]:
    """{survivor: its messages to the lost workers in the rounds they were members but dead
    (from ``dead_from`` to the loss's round, within the run's ``rounds``)}: lost with them.
    ``sends(rank, peer, t)``: how many messages ``rank`` sends ``peer`` in round t (gossip:
    one to each neighbour; a ring: 2(n - 1) to the next worker); ``alive(t)``: the members of
    round t. Survivors that sent none are left out."""
    lost, out = set(loss.ranks), {}
    for k in loss.ranks:
        for t in range(loss.dead_from(k), min(loss.round, rounds)):
            for s in sorted(alive(t) - lost):
                if n := sends(s, k, t):
                    out[s] = out.get(s, 0) + n
    return out
