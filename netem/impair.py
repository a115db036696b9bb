"""Pure: what one directed link does to each packet (delay, jitter, reordering, loss, queue).

Nothing here touches a socket or reads a clock: ``LinkLine.admit`` is told the packet's arrival
time and answers when it leaves (or that it is dropped, and why). ``netem.packetline`` applies
the answers to real frames in the switch namespace; the tests drive it with made-up times.

The rules follow the kernel's netem qdisc (net/sched/sch_netem.c, ``netem_enqueue``) so that a
link behaves alike under either:

- **Loss first.** Random loss (``loss_pct``) and the Gilbert-Elliott channel (``ge_*``) decide
  before anything is queued; with both set a packet survives only if both let it through (they
  are independent), so the long-run loss is 1 - (1 - loss)(1 - ge).
- **Gilbert-Elliott** is netem's ``loss gemodel p r 1-h 1-k`` (tc-netem(8); the model of
  Hasslinger and Hohlfeld, "The Gilbert-Elliott Model for Packet Loss in Real Time Services on
  the Internet", MMB 2008; RFC 6534 names the same states): per packet, the channel moves from
  good to bad with probability p (``ge_p_pct``) and back with r (``ge_r_pct``); a packet is lost
  with 1-h (``ge_bad_loss_pct``) in the bad state and 1-k (``ge_good_loss_pct``) in the good
  one. As in the kernel's ``loss_gilb_ell`` the loss of a packet is judged by the state it
  found, then the state moves. Stationary: bad with p / (p + r), so the loss is
  (r (1-k) + p (1-h)) / (p + r) (``Impairment.ge_loss_share``).
- **Reordering** (``reorder_pct``): as netem's ``reorder P`` (with its default gap of 1), a
  packet skips the delay with probability P and leaves at once, overtaking those held.
- **Delay and jitter**: delay_ms + jitter_ms * t, t drawn from ``jitter_dist`` (below); a draw
  below zero leaves at arrival. Without reordering packets keep their order, as netem does with
  a rate: release = max(arrival + delay + jitter draw, previous release of the link). With
  ``reorder`` (or reorder_pct > 0) each packet keeps its own draw and may overtake, as netem's
  time-sorted queue (tfifo) does.
- **Queue** (``limit_pkts``, ``limit_bytes``): what the link holds (admitted, not yet released;
  the forwarder reports releases with ``LinkLine.released``) is bounded; a packet that does not
  fit is dropped on arrival (tail drop), after the loss decision, as netem's tfifo does.

Jitter distributions (iproute2's netem/*.c table generators and the kernel's ``tabledist``:
delay = mu + sigma * t with t the table entry / NETEM_DIST_SCALE, entries clipped to the s16
range, i.e. |t| <= 4):

- ``uniform``: t uniform in [-1, 1) (the kernel's default without a table), SD 1/sqrt(3);
- ``normal``: t = the standard normal's quantile of a uniform draw, clipped to +-4 (SD ~1);
- ``pareto``: t = 4/3 (v^(-1/3) - 1.5), v uniform in (0, 1], clipped to 4 (pareto.c: shape 3,
  mean 1.5 taken off, so the mean is ~0);
- ``paretonormal``: t = (normal(u) + 3 pareto(u)) / 4 at the same quantile u (paretonormal.c).

So ``jitter_ms`` is netem's sigma, not always the standard deviation: ``jitter_sd_ms`` says what
spread each distribution gives. Continuous draws stand in for netem's 4096-entry tables.

GSO: a forwarder sees TCP's super-packets (up to 64 KiB, many wire packets). Losing one whole
would lose tens of segments at once, which no wire does; ``LinkLine.admit_gso`` decides loss per
segment (and says which were lost) while the survivors share one delay draw, as one burst.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from typing import Any, NamedTuple

JSON_VERSION = 1

DELAY_RANGE_MS = (0.0, 10_000.0)
JITTER_DISTS = ("normal", "uniform", "pareto", "paretonormal")   # netem's names
LIMIT_PKTS_RANGE = (1, 10_000_000)
LIMIT_BYTES_RANGE = (1_514, 2**31)        # at least one full frame at MTU 1500

# Default queue: twice the delay's worth of data at 10 Gbit/s (rate-independent: the line does
# not know the link's rate), within [floor, cap]. The cap bounds memory per link: 64 MiB is
# 2 x 50 ms at 5.4 Gbit/s, more than a Python forwarder carries (benchmarks/bench_packetline.py).
DEFAULT_QUEUE_RATE_BPS = 10e9
DEFAULT_QUEUE_FLOOR_BYTES = 4 << 20
DEFAULT_QUEUE_CAP_BYTES = 64 << 20
DEFAULT_BYTES_PER_PKT = 512               # default limit_pkts = limit_bytes / this

DROP_REASONS = ("loss", "ge_loss", "queue")
T_CLIP = 4.0                              # netem's tables are s16 / NETEM_DIST_SCALE (8192)
_NORMAL = statistics.NormalDist()
_TINY = 2.0**-53


class ImpairmentError(ValueError):
    """An impairment names a value out of its range (the message names it and the range)."""


# ---------------------------------------------------------------- jitter distributions

def _pareto_t(v: float) -> float:
    """netem/pareto.c at v in (0, 1]: 4/3 (v^(-1/3) - 1.5), clipped to the table's range."""
    return min(T_CLIP, (4.0 / 3.0) * (v ** (-1.0 / 3.0) - 1.5))


def _normal_t(u: float) -> float:
    return max(-T_CLIP, min(T_CLIP, _NORMAL.inv_cdf(min(max(u, _TINY), 1.0 - _TINY))))


def jitter_t(dist: str, u: float) -> float:
    """The multiplier of jitter_ms for a uniform draw ``u`` in [0, 1) (a quantile function)."""
    if dist == "uniform":
        return 2.0 * u - 1.0
    if dist == "normal":
        return _normal_t(u)
    if dist == "pareto":
        return _pareto_t(1.0 - u)
    if dist == "paretonormal":
        # the same quantile for both parts, as paretonormal.c builds its table
        return max(-T_CLIP, min(T_CLIP, (_normal_t(u) + 3.0 * _pareto_t(1.0 - u)) / 4.0))
    raise ImpairmentError(f"jitter_dist = {dist!r} is not allowed; expected one of "
                          f"{', '.join(JITTER_DISTS)}")


@cache
def jitter_moments(dist: str, points: int = 1 << 16) -> tuple[float, float]:
    """(mean, SD) of ``jitter_t`` over u (midpoint rule): what jitter_ms = 1 gives."""
    ts = [jitter_t(dist, (i + 0.5) / points) for i in range(points)]
    mean = math.fsum(ts) / points
    return mean, math.sqrt(math.fsum((t - mean) ** 2 for t in ts) / points)


# ---------------------------------------------------------------- validation

def _number(what: str, value: Any, lo: float, hi: float, *, hi_open: bool = False,
            note: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ImpairmentError(f"{what} = {value!r} is not a number")
    v = float(value)
    above = v >= hi if hi_open else v > hi
    if not math.isfinite(v) or v < lo or above:
        close = ")" if hi_open else "]"
        raise ImpairmentError(f"{what} = {value!r} is out of range; expected a value in "
                              f"[{lo:g}, {hi:g}{close}{note}")
    return v


def _integer(what: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ImpairmentError(f"{what} = {value!r} is out of range; expected an integer in "
                              f"[{lo}, {hi}] or None (the default)")
    return value


@dataclass(frozen=True)
class Impairment:
    """What one directed link does to its packets; see the module docstring for the rules."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    jitter_dist: str = "normal"
    reorder: bool = False            # packets may overtake each other (jitter, reorder_pct)
    reorder_pct: float = 0.0         # share of packets that skip the delay (implies reorder)
    loss_pct: float = 0.0            # independent random loss
    ge_p_pct: float = 0.0            # Gilbert-Elliott: good -> bad per packet (netem's p)
    ge_r_pct: float = 0.0            # bad -> good per packet (netem's r)
    ge_bad_loss_pct: float = 100.0   # loss in the bad state (netem's 1-h)
    ge_good_loss_pct: float = 0.0    # loss in the good state (netem's 1-k)
    limit_pkts: int | None = None    # None: limit_bytes / DEFAULT_BYTES_PER_PKT
    limit_bytes: int | None = None   # None: see default_limit_bytes

    def __post_init__(self) -> None:
        _number("delay_ms", self.delay_ms, *DELAY_RANGE_MS)
        _number("jitter_ms", self.jitter_ms, *DELAY_RANGE_MS)
        if self.jitter_dist not in JITTER_DISTS:
            raise ImpairmentError(f"jitter_dist = {self.jitter_dist!r} is not allowed; "
                                  f"expected one of {', '.join(JITTER_DISTS)}")
        if not isinstance(self.reorder, bool):
            raise ImpairmentError(f"reorder = {self.reorder!r} is not allowed; expected true "
                                  "or false")
        _number("reorder_pct", self.reorder_pct, 0.0, 100.0)
        if self.jitter_ms > self.delay_ms and not self.reorders:
            raise ImpairmentError(
                f"jitter_ms = {self.jitter_ms:g} is out of range; expected a value in "
                f"[0, {self.delay_ms:g}] (the delay_ms) while packets keep their order: set "
                "reorder = true (or reorder_pct > 0) to let packets overtake each other, or a "
                "delay at least the jitter")
        _number("loss_pct", self.loss_pct, 0.0, 100.0, hi_open=True,
                note=" (100 % loss is a cut link, not a loss)")
        self._check_ge()
        if self.limit_pkts is not None:
            _integer("limit_pkts", self.limit_pkts, *LIMIT_PKTS_RANGE)
        if self.limit_bytes is not None:
            _integer("limit_bytes", self.limit_bytes, *LIMIT_BYTES_RANGE)

    def _check_ge(self) -> None:
        _number("ge_p_pct", self.ge_p_pct, 0.0, 100.0)
        _number("ge_r_pct", self.ge_r_pct, 0.0, 100.0)
        _number("ge_bad_loss_pct", self.ge_bad_loss_pct, 0.0, 100.0)
        _number("ge_good_loss_pct", self.ge_good_loss_pct, 0.0, 100.0, hi_open=True,
                note=" (a good state that loses everything is a cut link)")
        if self.ge_p_pct and not self.ge_r_pct:
            raise ImpairmentError(
                f"ge_r_pct = {self.ge_r_pct!r} is out of range with ge_p_pct = "
                f"{self.ge_p_pct:g}; expected a value in (0, 100] (a bad state that is never "
                "left is a cut link)")

    # -- derived

    @property
    def reorders(self) -> bool:
        """Whether packets of this link may overtake each other."""
        return self.reorder or self.reorder_pct > 0

    @property
    def ge_active(self) -> bool:
        return self.ge_p_pct > 0 or self.ge_good_loss_pct > 0

    @property
    def lossy(self) -> bool:
        return self.loss_pct > 0 or self.ge_active

    def ge_loss_share(self) -> float:
        """Stationary loss of the Gilbert-Elliott channel: (r (1-k) + p (1-h)) / (p + r)."""
        if not self.ge_active:
            return 0.0
        p, r = self.ge_p_pct / 100, self.ge_r_pct / 100
        bad, good = self.ge_bad_loss_pct / 100, self.ge_good_loss_pct / 100
        if p == 0:
            return good                      # never leaves the good state it starts in
        return (r * good + p * bad) / (p + r)

    def mean_loss_share(self) -> float:
        """Long-run share of packets lost: random and Gilbert-Elliott loss, independent."""
        return 1.0 - (1.0 - self.loss_pct / 100) * (1.0 - self.ge_loss_share())

    def jitter_sd_ms(self) -> float:
        """The standard deviation of the delay draws (before clipping at zero and FIFO)."""
        return self.jitter_ms * jitter_moments(self.jitter_dist)[1] if self.jitter_ms else 0.0

    def default_limit_bytes(self) -> int:
        worth = 2 * (self.delay_ms + self.jitter_ms) / 1e3 * DEFAULT_QUEUE_RATE_BPS / 8
        return int(min(DEFAULT_QUEUE_CAP_BYTES, max(DEFAULT_QUEUE_FLOOR_BYTES, worth)))

    def queue_limits(self) -> tuple[int, int]:
        """(packets, bytes) the link may hold, the defaults filled in."""
        limit_bytes = self.limit_bytes or self.default_limit_bytes()
        limit_pkts = self.limit_pkts or max(1, limit_bytes // DEFAULT_BYTES_PER_PKT)
        return limit_pkts, limit_bytes

    # -- JSON

    def to_json(self) -> dict:
        return {"version": JSON_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> Impairment:
        if not isinstance(data, dict):
            raise ImpairmentError(f"an impairment is a JSON object, not {type(data).__name__}")
        version = data.get("version", JSON_VERSION)
        if version != JSON_VERSION:
            raise ImpairmentError(f"version = {version!r} is not supported; expected "
                                  f"{JSON_VERSION}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"version"})
        if unknown:
            raise ImpairmentError(f"unknown impairment field(s) {', '.join(unknown)}; expected "
                                  f"some of {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in data.items() if k != "version"})

    def updated(self, changes: dict) -> Impairment:
        """A copy with ``changes`` (field -> value) applied and validated."""
        return Impairment.from_json({**self.to_json(), **changes})


def impairment_of(link: Any, **overrides: Any) -> Impairment:
    """The impairment of an object with a plan link's attributes (``latency_ms``, ``jitter_ms``,
    ``jitter_dist``, ``reorder_pct``, ``loss_pct``, ``ge_*``); absent ones take the defaults."""
    names = {"delay_ms": "latency_ms"}
    kw = {}
    for f in fields(Impairment):
        attr = names.get(f.name, f.name)
        if hasattr(link, attr):
            kw[f.name] = getattr(link, attr)
    return replace(Impairment(), **{**kw, **overrides}) if kw or overrides else Impairment()


# ---------------------------------------------------------------- the line

@dataclass
class LinkCounters:
    """Per link: admitted = forwarded + dropped + held, in packets (wire packets: a GSO frame
    counts its segments) and bytes (as the forwarder passed them)."""

    admitted_pkts: int = 0
    admitted_bytes: int = 0
    forwarded_pkts: int = 0
    forwarded_bytes: int = 0
    dropped_pkts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    dropped_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))

    def drop(self, reason: str, pkts: int, size_bytes: int) -> None:
        self.dropped_pkts[reason] += pkts
        self.dropped_bytes[reason] += size_bytes

    def as_dict(self) -> dict:
        return asdict(self)


class ByteBudget:
    """A memory cap shared by every link of a forwarder: bytes held plus a per-packet cost for
    the objects that hold them. Pure bookkeeping; LinkLine asks it before it queues."""

    def __init__(self, limit_bytes: int, per_pkt_bytes: int = 256):
        self.limit_bytes, self.per_pkt_bytes = int(limit_bytes), int(per_pkt_bytes)
        self.held_bytes = 0
        self.refused = 0

    def _cost(self, size_bytes: int, frames: int) -> int:
        return size_bytes + frames * self.per_pkt_bytes

    def take(self, size_bytes: int, frames: int = 1) -> bool:
        cost = self._cost(size_bytes, frames)
        if self.held_bytes + cost > self.limit_bytes:
            self.refused += 1
            return False
        self.held_bytes += cost
        return True

    def give(self, size_bytes: int, frames: int = 1) -> None:
        self.held_bytes = max(0, self.held_bytes - self._cost(size_bytes, frames))


class Verdict(NamedTuple):
    """``admit_gso``'s answer: when the survivors leave (None: nothing leaves), the indices of
    the segments lost, and what the link now holds for this frame (pass to ``released``)."""

    release_s: float | None
    lost: tuple[int, ...]
    held_bytes: int
    held_pkts: int


def link_seed(seed: int, src: int, dst: int) -> str:
    """One stream per link and purpose, the same on every run with the same seed (a str seed
    goes through SHA-512 in random.Random, so it does not depend on PYTHONHASHSEED)."""
    return f"gasloc-packetline:{seed}:{src}:{dst}"


class LinkLine:
    """The delay line of one directed link.

    ``rng``: one random source for every draw (tests inject one); by default three seeded
    streams (loss, delay, reordering) from ``link_seed(seed, src, dst)``, so that changing the
    jitter leaves the loss pattern as it was. ``budget``: a ByteBudget shared across links.
    """

    def __init__(self, impairment: Impairment, seed: int = 0, src: int = 0, dst: int = 1,
                 rng: random.Random | None = None, budget: ByteBudget | None = None):
        base = link_seed(seed, src, dst)
        self._loss_rng = rng or random.Random(base + ":loss")
        self._delay_rng = rng or random.Random(base + ":delay")
        self._reorder_rng = rng or random.Random(base + ":reorder")
        self.budget = budget
        self.counters = LinkCounters()
        self.held_pkts = 0
        self.held_bytes = 0
        self.ge_bad = False                 # the Gilbert-Elliott state (starts good, as netem)
        self._last_release_s = -math.inf
        self.set_impairment(impairment)

    @property
    def impairment(self) -> Impairment:
        return self._imp

    def set_impairment(self, impairment: Impairment) -> None:
        """Change the link live: what is held keeps its release time; new packets get the new
        rules (and, without reordering, still leave after what is held)."""
        if not isinstance(impairment, Impairment):
            raise TypeError(f"expected an Impairment, not {type(impairment).__name__}")
        self._imp = impairment
        self.limit_pkts, self.limit_bytes = impairment.queue_limits()

    # -- decisions

    def _lost(self) -> str | None:
        """The loss decision for one wire packet: None (kept), 'loss' or 'ge_loss'."""
        imp, rnd = self._imp, self._loss_rng.random
        if imp.loss_pct and rnd() * 100 < imp.loss_pct:
            return "loss"
        if not imp.ge_active:
            return None
        # sch_netem.c loss_gilb_ell: transition first, loss by the state the packet found
        if self.ge_bad:
            if rnd() * 100 < imp.ge_r_pct:
                self.ge_bad = False
            return "ge_loss" if rnd() * 100 < imp.ge_bad_loss_pct else None
        if rnd() * 100 < imp.ge_p_pct:
            self.ge_bad = True
        return "ge_loss" if rnd() * 100 < imp.ge_good_loss_pct else None

    def _fits(self, size_bytes: int, pkts: int) -> bool:
        if self.held_pkts + pkts > self.limit_pkts or \
                self.held_bytes + size_bytes > self.limit_bytes:
            return False
        return self.budget is None or self.budget.take(size_bytes)

    def _schedule(self, arrival_s: float) -> float:
        imp = self._imp
        if imp.reorder_pct and self._reorder_rng.random() * 100 < imp.reorder_pct:
            return arrival_s                 # netem's reorder: sent at once, ahead of the rest
        delay_ms = imp.delay_ms
        if imp.jitter_ms:
            delay_ms += imp.jitter_ms * jitter_t(imp.jitter_dist, self._delay_rng.random())
        release_s = arrival_s + max(0.0, delay_ms) / 1e3
        if not imp.reorders:
            release_s = max(release_s, self._last_release_s)
            self._last_release_s = release_s
        return release_s

    def _queue(self, size_bytes: int, pkts: int, arrival_s: float) -> float | None:
        if not self._fits(size_bytes, pkts):
            self.counters.drop("queue", pkts, size_bytes)
            return None
        self.held_pkts += pkts
        self.held_bytes += size_bytes
        return self._schedule(arrival_s)

    # -- the interface

    def admit(self, size_bytes: int, arrival_s: float) -> float | None:
        """One packet of ``size_bytes`` arrived at ``arrival_s``: its release time, or None
        when it is dropped (the reason counted)."""
        c = self.counters
        c.admitted_pkts += 1
        c.admitted_bytes += size_bytes
        reason = self._lost() if self._imp.lossy else None
        if reason is not None:
            c.drop(reason, 1, size_bytes)
            return None
        return self._queue(size_bytes, 1, arrival_s)

    def admit_gso(self, size_bytes: int, arrival_s: float, segments: int) -> Verdict:
        """A GSO frame of ``segments`` wire packets: loss is decided per segment, the survivors
        are queued together and share one release time. Lost bytes are counted pro rata, to the
        byte."""
        segments = max(1, int(segments))
        c = self.counters
        c.admitted_pkts += segments
        c.admitted_bytes += size_bytes
        lost: list[int] = []
        lost_bytes = 0
        if self._imp.lossy:
            for i in range(segments):
                reason = self._lost()
                if reason is not None:
                    # the frame's bytes split over its segments, the remainder on the first
                    # ones, so that lost and kept bytes add up to the frame exactly
                    seg_bytes = size_bytes // segments + (i < size_bytes % segments)
                    lost.append(i)
                    lost_bytes += seg_bytes
                    c.drop(reason, 1, seg_bytes)
        kept_pkts = segments - len(lost)
        kept_bytes = size_bytes - lost_bytes
        if kept_pkts == 0:
            return Verdict(None, tuple(lost), 0, 0)
        release_s = self._queue(kept_bytes, kept_pkts, arrival_s)
        if release_s is None:
            return Verdict(None, tuple(lost), 0, 0)
        return Verdict(release_s, tuple(lost), kept_bytes, kept_pkts)

    def released(self, size_bytes: int, pkts: int = 1) -> None:
        """The forwarder sent (or gave up on) a packet this line had admitted."""
        self.held_pkts = max(0, self.held_pkts - pkts)
        self.held_bytes = max(0, self.held_bytes - size_bytes)
        self.counters.forwarded_pkts += pkts
        self.counters.forwarded_bytes += size_bytes
        if self.budget is not None:
            self.budget.give(size_bytes)
