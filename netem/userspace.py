"""Userspace shaping: sender pacing with a per-link virtual clock, and a receiver release queue.

Two modes, both driven by the transport through two calls on ``LinkShaper``:

- ``userspace`` (no namespaces or tc here: macOS, locked-down CI): the sender's ``stamp`` runs a
  virtual clock per directed link (start = max(now, link_free); link_free = start + bytes * 8 /
  rate) and returns the delivery time ``link_free + latency``, which goes into the message
  header; the receiver releases the message at that time. The clock also gives backpressure:
  ``stamp`` sleeps while a link has more than ``max_queue_s`` of data queued, which bounds memory.
- ``delay-only`` (tc shapes the bandwidth, the kernel has no netem): ``stamp`` returns None and
  the receiver releases each message at its arrival time + the link's one-way latency.

Measured on loopback (docs/NETWORK.md, "The userspace shaper"): 50/5/5 Mbit/s with 10 ms
latency gave 49.93/4.996/4.995 Mbit/s; messages were released within p50 0.05 ms, p99 0.12 ms
of their time.

What this does NOT do: it does not change TCP's own round-trip time. Congestion control, ACK
clocking and retransmission timers still see the unshaped path, so effects that depend on RTT
inside TCP (slow start length, the bandwidth-delay product a window must cover) are those of
the fast path. Messages the algorithm sees are delayed correctly; the kernel's view is not.
netem, where the kernel has it, delays packets instead and gets that right too. Jitter and
loss need netem and are refused here (``netem.commands.check_supported``).

A worker's uplink cap is a second virtual clock shared by all of its links; a downlink cap is
approximated at each sender as min(link rate, receiver's cap), i.e. as if that sender had the
receiver's downlink to itself (senders cannot see each other without coordination).

Links change while a run goes on (a scenario timeline): the sender calls ``set_link`` and the
receiver ``set_rx_link``, each when its own timeline says so. A cut (rate 0, a partition) makes
``stamp`` raise ``LinkCutError``: a virtual clock cannot hold a message "until the link comes
back" (nobody knows when), and pacing it at a trickle would stamp it minutes ahead and keep
every later message behind it after the restore. Messages stamped before a cut keep their
stamps and are delivered, as tc's cut (``netem.commands.CUT_LEAF_LIMIT_PKTS``) still delivers
what it finds queued.
"""
from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_QUEUE_S = 0.5       # a link's queue ahead of a new message, at most (backpressure)
# A release time may exceed the link's worst case by this much (float rounding, clock steps)
RELEASE_SLACK_S = 0.25
MAX_POLL_S = 0.02       # a waiting receiver re-checks at least this often
MODES = ("userspace", "delay-only")
LATENCY_RANGE_MS = (0.0, 60_000.0)   # what set_link / set_rx_link accept


class ShapingError(ValueError):
    """A shaping spec is malformed or names a link that does not exist."""


class LinkCutError(ShapingError):
    """A message was offered to a cut link (rate 0: a partition); nothing was stamped."""


def _rate_bps(what: str, rate_mbit: float | None) -> float | None:
    """A new rate in bit/s: None (unshaped), 0.0 (cut) or the rate; a ShapingError names a bad
    value."""
    if rate_mbit is None:
        return None
    if isinstance(rate_mbit, bool) or not isinstance(rate_mbit, (int, float)) \
            or not math.isfinite(rate_mbit) or rate_mbit < 0:
        raise ShapingError(f"{what} = {rate_mbit!r} is out of range; expected None (unshaped), "
                           "0 (cut) or a finite rate > 0")
    return float(rate_mbit) * 1e6


def _latency_s(what: str, latency_ms: float | None) -> float | None:
    if latency_ms is None:
        return None
    lo, hi = LATENCY_RANGE_MS
    if isinstance(latency_ms, bool) or not isinstance(latency_ms, (int, float)) \
            or not lo <= latency_ms <= hi:      # NaN fails both comparisons
        raise ShapingError(f"{what} = {latency_ms!r} is out of range; expected a value in "
                           f"[{lo:g}, {hi:g}]")
    return float(latency_ms) / 1e3


def _slower_bps(a: float | None, b: float | None) -> float | None:
    """The slower of two rates in bit/s, None meaning unlimited."""
    return b if a is None else a if b is None else min(a, b)


class LinkShaper:
    """One worker's view of its links: pacing of what it sends, release times of what it
    receives."""

    def __init__(self, rank: int, mode: str, tx: dict[int, tuple[float | None, float]],
                 rx_delay_ms: dict[int, float], up_mbit: float | None = None,
                 max_queue_s: float = MAX_QUEUE_S, sleep: Callable[[float], None] = time.sleep,
                 rx_links: dict[int, tuple[float | None, float]] | None = None):
        if mode not in MODES:
            raise ShapingError(f"mode = {mode!r} is not allowed; "
                               f"expected one of {', '.join(MODES)}")
        if not 0.0 < max_queue_s <= 60.0:
            raise ShapingError(f"max_queue_s = {max_queue_s!r} is out of range; expected (0, 60]")
        self.rank, self.mode, self.max_queue_s = rank, mode, max_queue_s
        self._rate_bps = {p: (r * 1e6 if r else None) for p, (r, _) in tx.items()}
        self._latency_s = {p: lat / 1e3 for p, (_, lat) in tx.items()}
        self._rx_delay_s = {p: d / 1e3 for p, d in rx_delay_ms.items()}
        self._up_bps = up_mbit * 1e6 if up_mbit else None
        # links into this worker, (rate bit/s or None, latency s): what bounds a sender's stamp
        # (the slowest rate and largest latency each has had, see set_rx_link)
        self._rx_bound = {p: (r * 1e6 if r else None, lat / 1e3)
                          for p, (r, lat) in (rx_links or {}).items()}
        self._link_free: dict[int, float] = {}
        self._up_free = 0.0
        self._lock = threading.Lock()
        self._sleep = sleep
        # called before each stamp (peer, now) and each release (src, arrival), outside the
        # lock: a caller's timeline sets the values in force then (links changed by time)
        self.on_stamp: Callable[[int, float], None] | None = None
        self.on_release: Callable[[int, float], None] | None = None

    @property
    def paces(self) -> bool:
        """Whether this worker paces its sends to the link rates (``userspace``), rather than
        only holding what arrives for the latency while tc paces (``delay-only``)."""
        return self.mode == "userspace"

    def stamp(self, peer: int, nbytes: int, now: float) -> float | None:
        """Sender side, just before sending ``nbytes`` to ``peer``: the delivery time, or None.

        Backpressure, as a NIC queue of ``max_queue_s`` per link: the sender waits until what
        the link (and a capped uplink) still holds is at most ``max_queue_s``, then the message
        joins the queue. A message never waits for another link's queue, so sends to several
        peers go out side by side as on independent links; and the stamp stays within
        ``max_queue_s`` plus the message's own transfer and latency of the moment it is sent,
        the bound a receiver checks (``latest_release_s``).
        """
        if not self.paces:
            return None
        self._check_peer(peer)
        if self.on_stamp is not None:
            self.on_stamp(peer, now)
        with self._lock:
            if self._rate_bps[peer] == 0.0:
                raise LinkCutError(f"link {self.rank}->{peer} is cut (rate 0, a partition): "
                                   "nothing can be sent on it until set_link gives it a rate")
            wait_s = self._backlog_s(peer, now) - self.max_queue_s
        if wait_s > 0:
            self._sleep(wait_s)
            now += wait_s
        with self._lock:
            done = self._advance(peer, nbytes, now)
            latency_s, rate_bps = self._latency_s[peer], self._rate_bps[peer]
        # a capped uplink can put the end further out than the link's own rate would
        over_s = done - now - self.max_queue_s - (nbytes * 8 / rate_bps if rate_bps else 0.0)
        if over_s > 0:
            self._sleep(over_s)
        return done + latency_s

    def _backlog_s(self, peer: int, now: float) -> float:
        """Seconds of data queued ahead of a new message to ``peer``."""
        free = self._link_free.get(peer, 0.0)
        if self._up_bps:
            free = max(free, self._up_free)
        return max(0.0, free - now)

    def _check_peer(self, peer: int) -> None:
        if peer not in self._rate_bps:
            raise ShapingError(f"worker {self.rank} has no link to worker {peer}")

    def _advance(self, peer: int, nbytes: int, now: float) -> float:
        """Move the link's (and the uplink's) virtual clock past this message; its wire end time."""
        bits, rate_bps = nbytes * 8, self._rate_bps[peer]
        done = max(now, self._link_free.get(peer, 0.0)) + (bits / rate_bps if rate_bps else 0.0)
        if self._up_bps:
            self._up_free = max(now, self._up_free) + bits / self._up_bps
            done = max(done, self._up_free)
        self._link_free[peer] = done
        return done

    def set_link(self, peer: int, rate_mbit: float | None, latency_ms: float | None = None) -> None:
        """Sender side, from now on: pace messages to ``peer`` at ``rate_mbit`` (None: unshaped;
        0: cut, ``stamp`` raises ``LinkCutError``) and add ``latency_ms`` (None: keep it).

        Messages stamped before keep their stamps, and data the link's clock already holds keeps
        its place: the next message starts when that has left at the old rate, as on a link
        whose rate changes under a queue. In delay-only mode ``stamp`` stamps nothing (tc paces,
        the receiver delays), so this only records the values; ``set_rx_link`` is what counts.
        """
        self._check_peer(peer)
        name = f"link {self.rank}->{peer}"
        rate_bps = _rate_bps(f"{name} rate_mbit", rate_mbit)
        latency_s = _latency_s(f"{name} latency_ms", latency_ms)
        with self._lock:
            self._rate_bps[peer] = rate_bps
            if latency_s is not None:
                self._latency_s[peer] = latency_s

    def set_rx_link(self, src: int, rate_mbit: float | None,
                    latency_ms: float | None = None) -> None:
        """Receiver side, from now on: the values of the link ``src`` -> this worker.

        In delay-only mode ``latency_ms`` is what ``release_at`` adds to what arrives from now
        on (messages already held keep their times). In both modes the bound of
        ``latest_release_s`` takes the new values in but never drops older ones: it uses the
        slowest rate and the largest latency the link has had (a cut stamps nothing and is left
        out). Each worker applies the timeline on its own clock and round, so a message stamped
        under the old values can arrive after this worker took the new ones; refusing it as a
        bad stamp would lose a legitimate message, while an older value only lets a bad stamp
        wait longer. The other order is not covered: a sender that slows a link before this
        worker does stamps a large message past the bound of the faster rate, so a caller
        should apply a link's change here no later than at its sender.
        """
        if isinstance(src, bool) or not isinstance(src, int) or src < 0 or src == self.rank:
            raise ShapingError(f"src = {src!r} is not a worker that sends to worker {self.rank}")
        name = f"link {src}->{self.rank}"
        rate_bps = _rate_bps(f"{name} rate_mbit", rate_mbit)
        latency_s = _latency_s(f"{name} latency_ms", latency_ms)
        with self._lock:
            old_rate, old_latency = self._rx_bound.get(src, (None, self._rx_delay_s.get(src, 0.0)))
            rate = old_rate if rate_bps == 0.0 else _slower_bps(old_rate, rate_bps)
            latency = old_latency if latency_s is None else max(old_latency, latency_s)
            self._rx_bound[src] = (rate, latency)
            if self.mode == "delay-only" and latency_s is not None:
                self._rx_delay_s[src] = latency_s

    def release_at(self, src: int, deliver_at: float | None, arrival: float) -> float:
        """Receiver side: when the algorithm may see a message from ``src`` that arrived at
        ``arrival``."""
        base = arrival if deliver_at is None else max(deliver_at, arrival)
        if self.on_release is not None:
            self.on_release(src, arrival)
        with self._lock:
            delay_s = self._rx_delay_s.get(src, 0.0)
        return max(base, arrival + delay_s)

    def latest_release_s(self, src: int, nbytes: int, arrival: float) -> float:
        """The latest ``release_at`` a legitimate message of ``nbytes`` from ``src`` can have.

        A sender's ``stamp`` is at most ``max_queue_s`` (its backpressure) plus the link's
        latency past the moment it sends, and the message arrives after that moment; one such
        message over the link's rate and a small slack are added on top. A stamp beyond this is
        a bad sender's, and the receiver drops the message ("deliver_at") rather than hold it.
        Rate and latency are the slowest and largest the link has had (``set_rx_link``).
        """
        with self._lock:
            rate_bps, latency_s = self._rx_bound.get(src, (None, self._rx_delay_s.get(src, 0.0)))
        transfer_s = nbytes * 8 / rate_bps if rate_bps else 0.0
        return arrival + latency_s + self.max_queue_s + transfer_s + RELEASE_SLACK_S

    def queued_s(self, peer: int, now: float) -> float:
        """Seconds of data the virtual clock holds for ``peer`` beyond ``now`` (for dashboards)."""
        return max(0.0, self._link_free.get(peer, 0.0) - now)


# ---------------------------------------------------------------- specs (what the launcher ships)

def spec_for(plan, decision) -> dict | None:
    """The JSON-able shaping spec of a run for every worker, or None when nothing is done in
    userspace: the decision's shaper says (``Shaper.worker_spec``)."""
    if not plan.shaped:
        return None
    return decision.shaper_kind.worker_spec(plan, decision)


def build_spec(plan, mode: str, max_queue_s: float = MAX_QUEUE_S) -> dict:
    """The spec of ``mode`` for every worker of a shaped ``plan``: ``userspace`` (the senders
    pace each link at its rate, the receivers hold the latency) or ``delay-only`` (the
    receivers hold the latency, rates are someone else's); ``max_queue_s``: each sender's
    backpressure (``LinkShaper``)."""
    if mode not in MODES:
        raise ShapingError(f"mode = {mode!r} is not a shaping mode; expected one of "
                           f"{', '.join(MODES)}")
    links = []
    for (s, d), link in sorted(plan.links.items()):
        rate = min(r for r in (link.rate_mbit, plan.cap(d).down_mbit) if r is not None)
        links.append([s, d, rate if mode == "userspace" else None, link.latency_ms])
    ups = {str(k): c.up_mbit for k, c in plan.caps.items() if c.up_mbit and mode == "userspace"}
    return {"mode": mode, "workers": plan.workers, "links": links, "up_mbit": ups,
            "max_queue_s": max_queue_s}


def shaping_from_spec(spec: dict | None, rank: int,
                      sleep: Callable[[float], None] = time.sleep) -> LinkShaper | None:
    """Worker ``rank``'s shaper from the run's spec (``spec_for``); None for no spec.
    ``sleep``: how a sender waits for its backpressure (a test's clock)."""
    if not spec:
        return None
    try:
        links, mode = spec["links"], spec["mode"]
        tx = {d: (rate, lat) for s, d, rate, lat in links if s == rank}
        rx = {s: lat for s, d, rate, lat in links if d == rank} if mode == "delay-only" else {}
        ups = spec.get("up_mbit", {})
        rx_links = {s: (_slower(rate, ups.get(str(s))), lat) for s, d, rate, lat in links
                    if d == rank}
        return LinkShaper(rank, mode, tx, rx, ups.get(str(rank)),
                          spec.get("max_queue_s", MAX_QUEUE_S), sleep=sleep, rx_links=rx_links)
    except (KeyError, TypeError, ValueError) as exc:
        raise ShapingError(f"malformed shaping spec for worker {rank}: {exc!r}") from None


def _slower(rate_mbit: float | None, cap_mbit: float | None) -> float | None:
    """The rate a sender can reach over a link and its own uplink cap (None: unlimited)."""
    rates = [r for r in (rate_mbit, cap_mbit) if r]
    return min(rates) if rates else None


# ---------------------------------------------------------------- receiver side

class ReleaseQueue:
    """Received messages held until their release time (thread-safe; any object as the item).

    One receive thread ``push``es on arrival; the consumer calls ``wait`` (or ``pop_due``) and
    gets the messages whose time has come, earliest first.
    """

    def __init__(self, shaper: LinkShaper | None, clock: Callable[[], float] = time.time):
        self.shaper, self.clock = shaper, clock
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()

    def push(self, src: int, deliver_at: float | None, arrival: float, item: Any) -> float:
        """Queue ``item``; its release time (``arrival`` when there is no shaper)."""
        due = arrival if self.shaper is None else self.shaper.release_at(src, deliver_at, arrival)
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), src, item))
            self._cond.notify()
        return due

    def pop_due(self, now: float | None = None) -> list[tuple[int, Any, float]]:
        """(src, item, release time) of every message due at ``now``, earliest first."""
        now = self.clock() if now is None else now
        out = []
        with self._cond:
            while self._heap and self._heap[0][0] <= now:
                due, _, src, item = heapq.heappop(self._heap)
                out.append((src, item, due))
        return out

    def next_due(self) -> float | None:
        with self._cond:
            return self._heap[0][0] if self._heap else None

    def wait(self, timeout_s: float) -> list[tuple[int, Any, float]]:
        """Block up to ``timeout_s`` until something is due; what is due (maybe nothing)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                due = self.pop_due()
                left = deadline - time.monotonic()
                if due or left <= 0:
                    return due
                head = self._heap[0][0] - self.clock() if self._heap else left
                self._cond.wait(max(0.0, min(head, left, MAX_POLL_S)))

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)
