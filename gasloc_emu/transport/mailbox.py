"""Which received data-plane messages a worker keeps, for how long, and which it drops.

No sockets here: ``zmq_transport`` decodes a message (``framing``) and hands it to ``accept``;
the algorithm's ``recv`` then ``take``s it. Everything is on an injected clock (``now``, the
time.time() clock by default, the one the shaper's stamps use), so the rules are unit-testable.

Round window. The current round is the highest round this worker has sent or asked for
(``note_round``), or the one ``set_round`` gave. Messages of rounds in [current - 1, current +
max_rounds_ahead] are kept until asked for: messages from other peers, or for later rounds, are
normal (a neighbour may be a few rounds ahead). A message is dropped and counted by reason
(``drop_reasons``) when its sender is not a peer ("src"), it is outside the window ("round"),
it duplicates an earlier (src, round, kind) ("duplicate": the first is kept, it may already be
in use), it is left unclaimed when its round falls out of the window ("stale"), or it is over its
sender's bound ("overflow"). Messages that framing refused are counted here too (``refuse``),
under framing's reason.

Release queue. With a userspace shaper a message is held back until ``shaping.release_at(...)``;
``release_due`` moves the due ones into the mailbox, in release order (a message whose round
left the window meanwhile is "stale"), and ``next_release_s`` tells the transport how long it
may sleep. A release time is a claim of the sender's (its ``deliver_at`` stamp), so it is
bounded: later than ``shaping.latest_release_s(...)`` (what the configured link could possibly
need for a message of this size) and the message is dropped as "deliver_at" instead of holding
its slot, and the round waiting for it, until then.

Bounds. What a peer has here (kept plus waiting for release) is bounded in messages and in
bytes, so a misbehaving peer cannot grow this worker's memory: past either bound its messages
are dropped as "overflow". The defaults (``PeerBounds.for_model``) never drop a legitimate one:
- bytes: one model-sized message per round of the window, i.e. per peer at most
  (max_rounds_ahead + 2) model-sized messages' bytes, 18 by default: 8.7 MB for tiny (0.48 MB
  of float32 parameters), 75 MB for small, 9.0 GB for gpt2. Gossip sends one model-sized message
  per neighbour per round, so the window itself admits no more than that from a peer. DiLoCo's
  ring All-Reduce sends 2(n-1) chunks of 1/n of the model per round (under 2 models' bytes) and
  is lock-step: the previous worker on the ring cannot finish round t+1 without this worker's
  round t+1 input, so it is never more than one round ahead (under 4 models' bytes).
- messages: max(max_rounds_ahead + 2, 3 * 2(n-1)): every round of the window for gossip, and
  for the ring the current round and two ahead (one more than the lock-step allows).

Link observations (``RecvLinks``). What each taken message says about its link: its bytes and
its transfer time, from the sender's ``sent_at`` stamp to the moment it became available here
(``take_timed``). The stamp is the sender's word, so it feeds this measurement only, never a
decision, and a transfer time no link can have (not positive, or over MAX_TRANSFER_S: clocks
apart, or a made-up stamp) is not counted.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gasloc_emu.transport.base import check_rank
from gasloc_emu.transport.framing import Message

Key = tuple[int, int, str]  # (src, round, kind)
# Ring rounds a peer's chunk messages are allowed to span: the current round and two ahead.
RING_ROUNDS_HELD = 3
# A transfer longer than this is no link's (gpt2 over 1 Mbit/s takes about 13 minutes): the
# sender's clock is far from this one, or its stamp is made up. Such an observation is dropped.
MAX_TRANSFER_S = 3600.0
# Rounds whose link observations wait to be taken; an older one is forgotten (bounded memory
# when nobody asks, e.g. a worker that stopped reporting rows).
MAX_TALLY_ROUNDS = 64


class Shaping(Protocol):
    """The userspace shaper's hooks (implemented in the netem package)."""

    def stamp(self, peer: int, nbytes: int, now_s: float) -> float | None:
        """Delivery time (time.time() clock) of ``nbytes`` of payload sent to ``peer`` now, or
        None."""

    def release_at(self, src: int, deliver_at: float | None, arrival_s: float) -> float:
        """When a message from ``src`` stamped ``deliver_at`` (or not) that arrived at ``arrival_s``
        may be handed to the algorithm."""

    def latest_release_s(self, src: int, nbytes: int, arrival_s: float) -> float:
        """The latest release time a legitimate message of ``nbytes`` from ``src`` that arrived
        at ``arrival_s`` can have; a later one is a bad stamp."""


@dataclass(frozen=True)
class PeerBounds:
    """The most one peer may have in a mailbox (kept plus waiting for release)."""

    max_msgs: int
    max_bytes: int

    def __post_init__(self) -> None:
        for name in ("max_msgs", "max_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    @classmethod
    def for_model(cls, model_bytes: int, world_size: int, max_rounds_ahead: int) -> PeerBounds:
        """Bounds no algorithm's legitimate traffic reaches (see the module docstring)."""
        window_rounds = max_rounds_ahead + 2
        ring_msgs = RING_ROUNDS_HELD * 2 * (world_size - 1)
        return cls(max(window_rounds, ring_msgs), window_rounds * model_bytes)


class Mailbox:
    """One worker's received messages: the round window, duplicates, release queue and bounds.

    One thread uses it; nothing here is thread-safe.
    """

    def __init__(self, rank: int, world_size: int, max_rounds_ahead: int, bounds: PeerBounds,
                 shaping: Shaping | None = None, now: Callable[[], float] = time.time):
        _check_config(rank, world_size, max_rounds_ahead, bounds)
        self.rank, self.world_size = rank, world_size
        self.max_rounds_ahead, self.bounds = max_rounds_ahead, bounds
        self.shaping, self._now = shaping, now
        self._round = 0
        self._held: dict[Key, Message] = {}
        # when each held message became available (time.time() clock): max(arrival, release)
        self._available_s: dict[Key, float] = {}
        self._pending: list[tuple[float, int, Message]] = []  # (release time, seq, msg) heap
        self._seq = itertools.count()  # ties in release time go out in arrival order
        self._seen: dict[int, set[tuple[int, str]]] = defaultdict(set)  # round -> {(src, kind)}
        self._usage = [[0, 0] for _ in range(world_size)]  # per src: [messages, bytes]
        self._drops: dict[str, int] = defaultdict(int)
        self.numbering = Numbering()   # each sender's message count: gaps never arrived
        # bytes per source that became available here, cumulative: what each link delivered
        # (a userspace-shaped message counts when its release time comes, not on arrival)
        # (a list: another thread copies it while this one adds to it)
        self.delivered = [0] * world_size

    # -- the round window

    @property
    def round(self) -> int:
        return self._round

    def window(self) -> tuple[int, int]:
        """Rounds whose messages are accepted, inclusive."""
        return self._round - 1, self._round + self.max_rounds_ahead

    def note_round(self, round_idx: int) -> None:
        """This worker sent or asked for ``round_idx``: move the window forward if it is later."""
        if round_idx > self._round:
            self.set_round(round_idx)

    def set_round(self, round_idx: int) -> None:
        """Move the window to ``round_idx`` (either way, e.g. when a run resumes)."""
        self._round = round_idx
        self._prune()

    # -- arrivals

    def accept(self, msg: Message, arrival_s: float) -> str | None:
        """Keep ``msg`` (decoded by framing) or drop it; returns the drop reason, or None."""
        reason = self._refusal(msg)
        release_s = None if reason is not None else self._release_time(msg, arrival_s)
        if release_s is not None and release_s > self._latest_release_s(msg, arrival_s):
            reason = "deliver_at"  # a stamp no link needs: holding it would stall its round
        if reason is not None:
            self.refuse(reason)
            return reason
        self._keep(msg, arrival_s, release_s)
        return None

    def _keep(self, msg: Message, arrival_s: float, release_s: float | None) -> None:
        self._seen[msg.round].add((msg.src, msg.kind))
        self._charge(msg, +1)
        if release_s is None or release_s <= self._now():
            self._hold(msg, arrival_s if release_s is None else max(arrival_s, release_s))
        else:
            heapq.heappush(self._pending, (release_s, next(self._seq), msg))

    def numbered(self, src: int, seq: int | None) -> None:
        """A message ``src`` numbered ``seq`` came in, kept or not: those its sender numbered
        before it that never did are dropped, reason "lost" (``Numbering``)."""
        lost = self.numbering.note(src, seq)
        if lost:
            self.refuse("lost", lost)

    def refuse(self, reason: str, count: int = 1) -> None:
        """Count ``count`` messages dropped for ``reason`` (also those framing refused to
        decode, and those that never arrived)."""
        self._drops[reason] += count

    def _refusal(self, msg: Message) -> str | None:
        if not 0 <= msg.src < self.world_size or msg.src == self.rank:
            return "src"  # framing refuses these too; here it guards the per-peer bookkeeping
        lo, hi = self.window()
        if not lo <= msg.round <= hi:
            return "round"
        if (msg.src, msg.kind) in self._seen.get(msg.round, ()):
            return "duplicate"
        msgs, nbytes = self._usage[msg.src]
        if msgs + 1 > self.bounds.max_msgs or nbytes + _nbytes(msg) > self.bounds.max_bytes:
            return "overflow"
        return None

    def _release_time(self, msg: Message, arrival_s: float) -> float | None:
        """When the shaper lets ``msg`` out; None without one. Unstamped messages are asked about
        too: a delay-only shaper (tc does the rate) adds its latency at the receiver."""
        if self.shaping is None:
            return None
        return self.shaping.release_at(msg.src, msg.deliver_at, arrival_s)

    def _latest_release_s(self, msg: Message, arrival_s: float) -> float:
        return self.shaping.latest_release_s(msg.src, _nbytes(msg), arrival_s)

    # -- the release queue

    def release_due(self) -> None:
        """Move every message whose release time has come into the mailbox, in release order."""
        now = self._now()
        while self._pending and self._pending[0][0] <= now:
            release_s, _, msg = heapq.heappop(self._pending)
            self._release(msg, release_s)

    def _release(self, msg: Message, release_s: float) -> None:
        if msg.round < self.window()[0]:
            self._drop(msg, "stale")
        elif _key(msg) in self._held:
            # only after set_round moved the window back over a round whose duplicate record
            # was pruned meanwhile; keep the one that is already claimable
            self._drop(msg, "duplicate")
        else:
            self._seen[msg.round].add((msg.src, msg.kind))  # that record may be pruned too
            # its release time, not now: how late this worker polled is not the link's doing
            self._hold(msg, release_s)

    def _hold(self, msg: Message, available_s: float) -> None:
        self._held[_key(msg)] = msg
        self._available_s[_key(msg)] = available_s
        self.delivered[msg.src] += _nbytes(msg)

    def next_release_s(self) -> float | None:
        """The earliest release time waiting (on the ``now`` clock), or None."""
        return self._pending[0][0] if self._pending else None

    # -- handing out

    def has(self, key: Key) -> bool:
        return key in self._held

    def take(self, key: Key) -> Message:
        """Hand out the message (src, round, kind); KeyError if it is not here (yet)."""
        return self.take_timed(key)[0]

    def take_timed(self, key: Key) -> tuple[Message, float]:
        """``take``, with the moment the message became available to the algorithm (its arrival
        or its release, whichever was later; time.time() clock): where its transfer ended."""
        if key not in self._held:
            raise KeyError(f"worker {self.rank}: no message {key} in the mailbox")
        msg = self._held.pop(key)
        self._charge(msg, -1)
        return msg, self._available_s.pop(key)

    def clear(self) -> None:
        """Forget every message (on close); the drop counters stay."""
        self._held.clear()
        self._available_s.clear()
        self._pending.clear()
        self._seen.clear()
        self._usage = [[0, 0] for _ in range(self.world_size)]

    # -- counters and introspection

    @property
    def dropped(self) -> int:
        return sum(self._drops.values())

    @property
    def drop_reasons(self) -> dict[str, int]:
        return dict(self._drops)

    def peer_usage(self, src: int) -> tuple[int, int]:
        """(messages, bytes) that ``src`` has here, kept or waiting for release."""
        msgs, nbytes = self._usage[src]
        return msgs, nbytes

    def held_keys(self) -> list[Key]:
        return list(self._held)

    def pending_count(self) -> int:
        return len(self._pending)

    # -- bookkeeping

    def _prune(self) -> None:
        """Forget rounds that fell out of the window; unclaimed messages of theirs are drops."""
        lo = self.window()[0]
        for key in [k for k in self._held if k[1] < lo]:
            self._available_s.pop(key, None)
            self._drop(self._held.pop(key), "stale")
        for rnd in [r for r in self._seen if r < lo]:
            del self._seen[rnd]

    def _drop(self, msg: Message, reason: str) -> None:
        """Drop an accepted message: it no longer counts against its sender's bound."""
        self._charge(msg, -1)
        self.refuse(reason)

    def _charge(self, msg: Message, sign: int) -> None:
        usage = self._usage[msg.src]
        usage[0] += sign
        usage[1] += sign * _nbytes(msg)


def _key(msg: Message) -> Key:
    return msg.src, msg.round, msg.kind


def _nbytes(msg: Message) -> int:
    return msg.tensor.numel() * msg.tensor.element_size()


def _check_config(rank: int, world_size: int, max_rounds_ahead: int, bounds: PeerBounds) -> None:
    check_rank(rank, world_size)
    if type(max_rounds_ahead) is not int or max_rounds_ahead < 1:
        raise ValueError(f"max_rounds_ahead must be an int >= 1, got {max_rounds_ahead!r}")
    if not isinstance(bounds, PeerBounds):
        raise TypeError(f"bounds must be a PeerBounds, got {type(bounds).__name__}")


class Numbering:
    """Per sender: the number its next message should carry (``framing``'s ``seq``). A message
    numbered past it means the ones between never arrived: libzmq cut them at its size limit
    (MAXMSGSIZE), with the connection they were on, before they existed here. The first message
    seen from a sender sets its count (a joiner hears senders mid-stream), and a number below
    the count starts it again (the sender is a successor, counting from 0)."""

    def __init__(self):
        self._next: dict[int, int] = {}

    def note(self, src: int, seq: int | None) -> int:
        """Messages from ``src`` that never arrived before this one numbered ``seq``."""
        if seq is None:
            return 0
        expected = self._next.get(src)
        self._next[src] = seq + 1
        return 0 if expected is None or seq < expected else seq - expected


@dataclass
class LinkUse:
    """What one source's messages of one round said about its link to this worker."""

    nbytes: int = 0
    messages: int = 0
    transfer_s: float = 0.0  # summed over the messages, each from sent_at to available
    first_sent_at: float = math.inf  # the earliest sent_at (time.time() clock)


@dataclass
class RecvLinks:
    """Per round and source, the link observations of the messages handed to the algorithm."""

    max_rounds: int = MAX_TALLY_ROUNDS
    rejected: int = 0  # observations dropped for an impossible transfer time
    _rounds: dict[int, dict[int, LinkUse]] = field(default_factory=dict, init=False, repr=False)

    def note(self, msg: Message, available_s: float) -> bool:
        """Count ``msg``, which became available at ``available_s``; False when its stamp is
        missing or its transfer time impossible (then nothing is counted)."""
        if msg.sent_at is None:
            return False
        transfer_s = available_s - msg.sent_at
        if not 0.0 < transfer_s <= MAX_TRANSFER_S:
            self.rejected += 1
            return False
        use = self._round(msg.round).setdefault(msg.src, LinkUse())
        use.nbytes += _nbytes(msg)
        use.messages += 1
        use.transfer_s += transfer_s
        use.first_sent_at = min(use.first_sent_at, msg.sent_at)
        return True

    def _round(self, round_idx: int) -> dict[int, LinkUse]:
        if round_idx not in self._rounds and len(self._rounds) >= self.max_rounds:
            del self._rounds[min(self._rounds)]
        return self._rounds.setdefault(round_idx, {})

    def take(self, round_idx: int) -> dict[int, LinkUse]:
        """Round ``round_idx``'s observations by source; they and every older round's are
        forgotten (a round is reported once)."""
        out = self._rounds.pop(round_idx, {})
        for old in [r for r in self._rounds if r < round_idx]:
            del self._rounds[old]
        return out
