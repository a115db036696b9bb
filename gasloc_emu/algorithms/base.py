"""What every algorithm shares, and the two small bases of its kinds: the interface the worker
calls, the traits the rest of the system reads, and gossip mixing.

An algorithm is one class: its instance is one worker's side of the protocol, and its class
attributes and class methods are everything the runners, the record and the dashboard ask of
it (docs/EXTENDING.md). ``Algorithm`` holds what every kind shares; an algorithm subclasses
one of its kinds:

- ``OuterAlgorithm``: rounds of local steps, then ``outer_step`` (``begin``, ``outer_step``,
  ``finish``, ``peers``, ``handover``); driven by ``training.rounds``;
- ``PairwiseAlgorithm``: asynchronous pairwise exchanges beside the gradient steps
  (``before_step``, ``took_step``, ``send_half``, ``take``, ``mix``; ``slots``); driven by
  ``training.async_worker`` and the simulator's event queue.

Nothing outside ``algorithms/`` looks at an algorithm's name to decide anything, and only
``training.drivers`` reads which kind it is.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from gasloc_emu.comm.channel import Channel
from gasloc_emu.topology import Topology, mh_table
from gasloc_emu.transport.base import PeerLost, RingSum, Transport


@dataclass(frozen=True)
class Supports:
    """What an algorithm runs with besides plain rounds; the runners refuse the rest (exit 2)
    with the algorithm's ``refusal`` text."""

    overlap: bool = False       # algo.overlap = 1: communication lags compute by a round
    scenarios: bool = True      # a scenario file or a link trace (events at rounds or times)
    time_budget: bool = True    # compute.inner_budget_s: H_i from a time budget


@dataclass(frozen=True)
class NoSettings:
    """The settings of an algorithm that has none of its own: ``algo.params`` stays empty."""


class Message(NamedTuple):
    """One message of a worker's outer step as time sees it (``simulate --timing-only``): sent
    to ``peer`` (``sends``) or received from it, of round ``round`` and wire ``kind``.
    Immutable; a named tuple, not a frozen dataclass, because a long timing run makes one per
    message (a tuple is made at a third of the cost)."""

    peer: int
    round: int
    kind: str
    sends: bool


def gossip_messages(topo: Topology, rank: int, round_idx: int, send: bool = True,
                    receive: bool = True) -> list[Message]:
    """``gossip``'s messages in its order: ``gossip_send``'s (``z`` to every neighbour of the
    round), then ``gossip_mix``'s receives, in the same peer order."""
    peers = topo.peers(rank, round_idx)
    return ([Message(j, round_idx, "z", True) for j in peers] if send else []) + \
        ([Message(j, round_idx, "z", False) for j in peers] if receive else [])


@dataclass(frozen=True)
class Context:
    """What one worker's algorithm is built from (``OuterAlgorithm.create``).

    ``topology``: the gossip graph it mixes over (a scenario's living view of it), None when
    the algorithm needs none; ``acfg``: the shared ``algo.*`` settings; ``params``: its own
    settings (an instance of its ``Settings``, validated); ``weight``: what it multiplies its
    pseudo-gradient by before a mean (``compute.pseudo_grad_weight``); ``members(t)``: the
    living workers of round t (None: all); ``heals(t)``: whether a partition ends in round t;
    ``channel``: the worker's compressed communication (``comm.channel``; None: float32 values);
    ``survives_loss``: the run goes on after a host lost without warning (``run.on_worker_loss
    = continue``), so a ring's mean may hold a lost chunk's gap (``transport.base.gap_free``).
    """

    rank: int
    transport: Transport
    topology: Topology | None
    acfg: Any
    params: Any = NoSettings()
    weight: float = 1.0
    members: Callable[[int], Collection[int]] | None = None
    heals: Callable[[int], bool] | None = None
    channel: Channel | None = None
    survives_loss: bool = False


class Algorithm:
    """What every kind of algorithm shares: its traits, its construction and its checks; one
    worker's instance never sees sockets, only a ``Transport``. Subclass a kind
    (``OuterAlgorithm``, ``PairwiseAlgorithm``), not this."""

    # -- traits: what the rest of the system asks of the algorithm (class level, no instance)
    name: ClassVar[str] = "base"
    Settings: ClassVar[type] = NoSettings   # its own settings, ``algo.params.KEY`` (a dataclass)
    # how a worker's time is organised (``training.drivers``): set by the kind's base
    driver: ClassVar[str] = ""
    needs_graph: ClassVar[bool] = True      # False: its peers are not a gossip graph's
    shows: ClassVar[tuple[str, ...]] = ()   # outer constants the header and summary show
    default_local_steps: ClassVar[int] = 10  # H when algo.local_steps is 0
    supports: ClassVar[Supports] = Supports()
    # the kinds it sends as a lossy codec's frames through ``channel`` besides the ring's (which
    # ``channel.ring_sum`` compresses): gossip's z here; a plugin that sends only its own kinds
    # names them, or () when it sends everything uncompressed
    compressed_kinds: ClassVar[tuple[str, ...]] = ("z",)
    channel: Channel | None = None  # set by ``build``: compressed communication, or None
    # the attributes holding its state between rounds, which a checkpoint keeps and a resumed
    # worker gets back (``state_dict``); None: not declared, so its runs take no checkpoint
    checkpoint_state: ClassVar[tuple[str, ...] | None] = None
    # the message kinds ``handover`` gives a joiner besides theta: how many messages a donor
    # sends, known before the run (those to a joiner lost with its host are counted lost)
    handover_kinds: ClassVar[tuple[str, ...]] = ()

    def __init__(self, rank: int, transport: Transport, topology: Topology | None):
        self.rank, self.transport, self.topology = rank, transport, topology

    @classmethod
    def create(cls, ctx: Context) -> Algorithm:
        """One worker's instance; algorithms with constants override it."""
        return cls(ctx.rank, ctx.transport, ctx.topology)

    @classmethod
    def build(cls, ctx: Context) -> Algorithm:
        """What the runners call: ``create``, with the context's channel attached (so a plugin's
        ``create`` need not pass it on)."""
        algo = cls.create(ctx)
        algo.channel = ctx.channel
        return algo

    @classmethod
    def check_settings(cls, acfg, params) -> str | None:
        """Why the shared ``algo.*`` settings do not fit this algorithm, or None: an outer lr
        given as '1-momentum' (GASLoC's alone), or overlap where it has no outer step."""
        if isinstance(acfg.outer_lr, str):
            return (f"algo.outer_lr = {acfg.outer_lr!r} is not allowed for {cls.name}; "
                    "expected a number in [0, 10]")
        return cls.overlap_refusal(acfg)

    @classmethod
    def overlap_refusal(cls, acfg) -> str | None:
        """Why ``algo.overlap`` does not fit this algorithm, or None."""
        if acfg.overlap and not cls.supports.overlap:
            return (f"algo.overlap = {acfg.overlap} is not supported: {cls.name} has no outer "
                    "step to overlap")
        return None

    @classmethod
    def refusal(cls, cfg, topo: Topology | None, scenario: bool) -> str | None:
        """Why this run cannot go as configured (one line, exit 2), or None. ``scenario``:
        a scenario file or a link trace is given."""
        if scenario and not cls.supports.scenarios:
            return (f"algo.name = {cls.name} does not take a scenario or a link trace (their "
                    "events happen at rounds)")
        if cfg.compute.inner_budget_s > 0 and not cls.supports.time_budget:
            return (f"compute.inner_budget_s = {cfg.compute.inner_budget_s:g} does not apply "
                    f"to {cls.name}; set it to 0")
        return None

    @classmethod
    def scenario_refusal(cls, cfg, churns: bool) -> str | None:
        """What a scenario that changes membership (``churns``) cannot do with this algorithm's
        settings, or None."""
        return None

    @classmethod
    def host_loss_refusal(cls, cfg) -> str | None:
        """Why this algorithm cannot go on after a host lost without warning (its workers'
        messages of the rounds they died in never come: ``scenario.hostloss``), or None.
        Gossip does without them (``gossip_mix``: the receiver's own value stands in); a
        compressed channel's public copies would go apart."""
        if cfg.comm.codec != "none" and cls.compressed_kinds:
            return (f"comm.codec = {cfg.comm.codec!r}: each edge's public copy needs every "
                    "message, and a lost host's last ones never come")
        return None

    @classmethod
    def constants(cls, acfg, topo: Topology | None) -> dict[str, float]:
        """The outer constants named by ``shows``, as numbers, for the header and summary."""
        return {}

    @classmethod
    def warnings(cls, cfg, topo: Topology | None) -> tuple[str, ...]:
        """Settings that run but are probably not meant (printed before the run)."""
        return ()

    @classmethod
    def wire_kinds(cls, numel: int, params) -> dict[str, tuple[int, ...]]:
        """The message kinds it sends besides gossip's ``z``, the ring's and the join's, with
        their one shape each, for a model of ``numel`` parameters and its settings ``params``:
        the receivers' schema allows exactly these."""
        return {}

    @classmethod
    def weights_by_steps(cls, acfg) -> bool:
        """Whether it weights each worker's pseudo-gradient by its share of the inner steps
        (needs every worker's H_i before the run)."""
        return False

    @classmethod
    def groups_all_reduce(cls) -> bool:
        """Whether a partition splits it into groups that each reduce over all their living
        members (so every living worker must be in one group)."""
        return False

    @classmethod
    def run_label(cls, topology_name: str) -> str:
        """The default run name's algorithm part."""
        return f"{cls.name}-{topology_name}" if cls.needs_graph else cls.name

    def begin(self, theta: torch.Tensor) -> None:
        """Once, with the flat parameter buffer, before the first step (and at a join)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Its state between rounds (``checkpoint_state``), with its channel's, on the CPU."""
        state = {f"algo.{name}": value.detach().to("cpu", copy=True)
                 for name in self.checkpoint_state or ()
                 if (value := getattr(self, name, None)) is not None}
        if self.channel is not None:
            state |= {f"channel.{k}": v for k, v in self.channel.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor], device) -> None:
        """A resumed worker's side of ``state_dict``, after ``begin``."""
        for name in self.checkpoint_state or ():
            value = state.get(f"algo.{name}")
            setattr(self, name, None if value is None else value.to(device, copy=True))
        if self.channel is not None:
            self.channel.load_state_dict({k.removeprefix("channel."): v
                                          for k, v in state.items()
                                          if k.startswith("channel.")})

    def state_bytes(self) -> int:
        """Model-sized buffers this algorithm keeps between steps (for memory reports), its
        channel's copies and residual included."""
        own = sum(t.numel() * t.element_size() for t in self._state() if t is not None)
        return own + (self.channel.state_bytes() if self.channel is not None else 0)

    def _state(self) -> list[torch.Tensor | None]:
        return []


class OuterAlgorithm(Algorithm):
    """Rounds: local steps, then the outer step (``training.rounds`` drives it).

    The worker calls ``begin(theta)`` once with the flat parameter buffer, then after each inner
    phase ``outer_step(t, theta)``: ``theta`` holds the inner result on entry and the next
    round's starting point on exit (modified in place).
    """

    driver: ClassVar[str] = "rounds"

    def __init__(self, rank: int, transport: Transport, topology: Topology | None):
        super().__init__(rank, transport, topology)
        self.anchor: torch.Tensor | None = None  # theta at the start of the inner phase
        # the last outer step was not taken: its exchange lost a dead peer's part (torchft's
        # failed commit; ``scenario.hostloss``), reported in the round's row
        self.uncommitted = False

    @classmethod
    def reduces_in_background(cls, acfg) -> bool:
        """Whether its All-Reduce runs during the next round's compute (the simulator's clock
        gives it a lane of its own)."""
        return False

    def begin(self, theta: torch.Tensor) -> None:
        self.anchor = theta.detach().clone()

    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        raise NotImplementedError

    def finish(self, theta: torch.Tensor) -> None:
        """After the last round: complete what is still in flight (an overlapped algorithm's
        last exchange) so that ``theta`` is the final model; nothing here."""

    def exchange(self, round_idx: int, last: bool, codec) -> list[Message] | None:
        """The messages ``outer_step(round_idx)`` (and ``finish`` when ``last``) sends and
        receives, in program order, with ``codec`` (``comm.codecs``; None: float32 values);
        None: not declared, so ``simulate --timing-only`` refuses the algorithm."""
        return None

    def peers(self, round_idx: int) -> list[int]:
        """The workers this one exchanges with in round ``round_idx``."""
        return self.topology.peers(self.rank, round_idx) if self.topology else []

    def handover(self) -> dict[str, torch.Tensor]:
        """What a joiner takes over from its donor besides theta, by message kind (those of
        ``handover_kinds``): nothing here (a gossip worker's outer state is its own;
        docs/ALGORITHM.md, "Churn")."""
        return {}

    def take_over(self, state: dict[str, torch.Tensor]) -> None:
        """A joiner's side of ``handover``, after ``begin``."""

    def reduce(self) -> RingSum | None:
        """The ``reduce`` of ``all_reduce_mean``: the channel's compressed ring, or None."""
        return self.channel.ring_sum if self.channel is not None else None

    def _state(self) -> list[torch.Tensor | None]:
        return [self.anchor]


class PairwiseAlgorithm(Algorithm):
    """Asynchronous pairwise exchanges beside the gradient steps, no rounds (``run.rounds``
    counts steps). Its worker loops (``training.async_worker`` in ``run``, the simulator's
    event queue in ``simulate``) keep ``slots`` and call, around each step's update,
    ``before_step(theta, t)`` and ``took_step(theta)``, and for each exchange with the partner
    the launcher's pairer gave, ``send_half``, ``take`` and ``mix`` (times ``t`` in units of
    the worker's gradient-step time)."""

    driver: ClassVar[str] = "pairwise"

    @classmethod
    def slots(cls, acfg):
        """The two lanes' barrier schedule: gradient steps and exchanges per slot (an object
        with ``count(steps)``, ``steps_in(slot, steps)``, ``exchanges``; ``a2cid2.Slots``)."""
        raise NotImplementedError

    @classmethod
    def exchange_requests(cls, acfg, steps: int) -> int:
        """Pairing requests per worker in ``steps`` steps at most (the launcher's bound on what
        a worker may ask)."""
        raise NotImplementedError

    @classmethod
    def pairing_constants(cls, acfg, topo: Topology | None) -> dict[str, float]:
        """Its constants for the record's ``asynchronous`` block."""
        return {}

    def before_step(self, theta: torch.Tensor, t: float) -> None:
        """Before a gradient step's update lands at time ``t``."""
        raise NotImplementedError

    def took_step(self, theta: torch.Tensor) -> None:
        """After the step's update."""
        raise NotImplementedError

    def send_half(self, peer: int, label: int, theta: torch.Tensor, t: float) -> None:
        """This side of exchange ``label`` with ``peer``: what it sends, taken at ``t``."""
        raise NotImplementedError

    def take(self, peer: int, label: int) -> torch.Tensor:
        """What ``peer`` sent for exchange ``label`` (waits for it)."""
        raise NotImplementedError

    def mix(self, theta: torch.Tensor, received: torch.Tensor, t: float) -> None:
        """The exchange's effect on this worker's state at ``t``."""
        raise NotImplementedError


@torch.no_grad()
def lagged_outer_step(theta: torch.Tensor, start: torch.Tensor, mixed: torch.Tensor,
                      y_prev: torch.Tensor, eta: float, gamma: float,
                      weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, z) of an overlapped round (docs/ALGORITHM.md, "Overlap"): the inner result
    ``theta`` started from ``start`` (this worker's z of the round before), and the mix of
    that round's z landed as ``mixed``; y = m + eta w (theta^+ - start), z = y + gamma (y -
    y_prev). ``theta`` is overwritten (with m + w g on the way)."""
    theta.sub_(start)
    if weight != 1.0:
        theta.mul_(weight)
    theta.add_(mixed)                                   # the correction m - z, applied
    y = torch.lerp(mixed, theta, eta)
    return y, torch.lerp(y_prev, y, 1.0 + gamma)


@torch.no_grad()
def gossip(tp: Transport, topo: Topology, rank: int, round_idx: int, z: torch.Tensor,
           out: torch.Tensor, channel: Channel | None = None) -> None:
    """Send ``z`` to this round's neighbours and write sum_j W[i, j] z_j into ``out``; with a
    ``channel``, CHOCO's mix of compressed differences (``comm.channel``).

    ``z`` is handed over to the transport (ownership rule) and must not be ``out``.
    """
    gossip_send(tp, topo, rank, round_idx, z, channel)
    gossip_mix(tp, topo, rank, round_idx, z, out, channel)


def _received(tp: Transport, peer: int, round_idx: int, z: torch.Tensor) -> torch.Tensor:
    """``peer``'s z of the round; this worker's own when it is lost with the peer's host
    (``scenario.hostloss``): the peer's weight then moves to the self-weight, the sum stays an
    average, and the run and its replay agree on which messages were lost."""
    try:
        return tp.recv(peer, round_idx, "z")
    except PeerLost:
        return z


def gossip_send(tp: Transport, topo: Topology, rank: int, round_idx: int,
                z: torch.Tensor, channel: Channel | None = None) -> None:
    """The first half of ``gossip``: ``z`` to every neighbour of round ``round_idx``."""
    for j in topo.peers(rank, round_idx):
        if channel is None:
            tp.send(j, round_idx, "z", z)
        else:
            channel.send(tp, j, round_idx, "z", z)


@torch.no_grad()
def gossip_mix(tp: Transport, topo: Topology, rank: int, round_idx: int, z: torch.Tensor,
               out: torch.Tensor, channel: Channel | None = None) -> None:
    """The second half: receive the neighbours' z of round ``round_idx`` and write
    sum_j W[i, j] z_j into ``out``, self first, then peers in increasing rank, so every
    transport gives the same bits (``z`` is this worker's own, as sent)."""
    peers = topo.peers(rank, round_idx)
    self_w, weights = topo.row(rank, round_idx)
    if channel is not None:
        channel.mix(tp, peers, weights, round_idx, "z", z, out)
        return
    received = {j: _received(tp, j, round_idx, z) for j in peers}
    torch.mul(z, self_w, out=out)
    for j in peers:
        out.add_(received[j].to(out.device, non_blocking=True), alpha=weights[j])


def mixing_table(topo: Topology, round_idx: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round ``round_idx``'s W for every worker at once, the weights ``gossip_mix`` applies row
    by row: (self weight (n, 1), peers (n, K) in increasing rank, weights (n, K)), padded with
    the row's own index and weight 0 (``topology.mh_table``). For a stack of all workers'
    vectors (the consensus surrogate, ``experiments/consensus.py``)."""
    own, peers, weights = mh_table(topo.n, topo.edges(round_idx), topo.alpha)
    return (torch.from_numpy(own).unsqueeze(1), torch.from_numpy(peers),
            torch.from_numpy(weights))
