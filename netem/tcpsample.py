"""TCP as the senders' kernels saw it during training: ``ss -tin`` sampled in each worker's
namespace, summarised per directed link.

The transport's sockets belong to libzmq, which exposes neither their descriptors nor
TCP_INFO, so ``netem.tcpinfo`` (which reads a socket we own) cannot see them. ``ss`` asks the
kernel over sock_diag for every socket of a namespace and prints the same ``struct tcp_info``
fields (iproute2's misc/ss.c ``tcp_show_info``): the smoothed RTT, cwnd, ssthresh, bytes
acknowledged, retransmissions, and the chrono counters of include/uapi/linux/tcp.h (time busy
sending, and of that, limited by the receiver's window or the send buffer; ss prints them only
when non-zero, in ms).

A sender's socket to worker ``dst`` is the one whose peer address is ``dst``'s (worker
addresses are unique per run); a link striped over several connections sums them. From the
first and last sample of each socket over training, each link gets its RTT (median and largest
sample), cwnd, retransmitted segments, and who held its sender back while it had data queued:

- ``receiver``: more than ``HELD_SHARE`` of its busy time limited by the receiver's window
  (a receiver process that does not read, e.g. busy computing);
- ``send buffer``: more than ``HELD_SHARE`` limited by its own send buffer;
- ``path``: neither: congestion window and the shaper set the pace.

The parsing and the summary are pure (tested on captured output); ``TcpSampler`` runs the
commands on a thread with an injected runner and clock, bounded in samples and time.
"""
from __future__ import annotations

import re
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

HELD_SHARE = 0.25            # of busy time, limited by one cause: that cause held it back
MAX_SAMPLES = 10_000         # per run: a bound on the sampler's loop, whatever the interval
SS_TIMEOUT_S = 5.0
INTERVAL_RANGE_S = (0.05, 60.0)
SS_ARGV = ("ss", "-t", "-i", "-n", "-H", "state", "established")

_ADDR = re.compile(r"^\[?([0-9a-fA-F.:]+?)\]?(?:%\S+)?:(\d+)$")
_MS = re.compile(r"^(\d+(?:\.\d+)?)ms")


class TcpSampleError(ValueError):
    """A sampler setting is out of range (the message names it and the range)."""


@dataclass(frozen=True)
class SocketSample:
    """One established TCP socket as ``ss -tin`` printed it (cumulative counters)."""

    local: tuple[str, int]
    peer: tuple[str, int]
    congestion_control: str = ""
    rtt_ms: float | None = None
    min_rtt_ms: float | None = None
    cwnd_segs: int | None = None
    ssthresh_segs: int | None = None
    bytes_acked: int = 0
    retrans_total: int = 0
    busy_ms: float = 0.0
    rwnd_limited_ms: float = 0.0
    sndbuf_limited_ms: float = 0.0


def _addr(text: str) -> tuple[str, int] | None:
    m = _ADDR.match(text)
    if not m:
        return None
    host = m.group(1)
    return (host.removeprefix("::ffff:"), int(m.group(2)))   # an IPv4-mapped IPv6 address


def _ms(value: str) -> float:
    m = _MS.match(value)
    return float(m.group(1)) if m else 0.0


def _info(tokens: list[str]) -> dict:
    out: dict = {}
    if tokens and ":" not in tokens[0] and tokens[0].isidentifier():
        out["congestion_control"] = tokens[0]
    for tok in tokens:
        key, sep, value = tok.partition(":")
        if not sep:
            continue
        if key == "rtt":
            out["rtt_ms"] = float(value.split("/")[0])
        elif key == "minrtt":
            out["min_rtt_ms"] = float(value)
        elif key in ("cwnd", "ssthresh"):
            out[f"{key}_segs"] = int(value)
        elif key == "bytes_acked":
            out["bytes_acked"] = int(value)
        elif key == "retrans":              # "now/total"
            out["retrans_total"] = int(value.split("/")[-1])
        elif key in ("busy", "rwnd_limited", "sndbuf_limited"):
            out[f"{key}_ms"] = _ms(value)
    return out


def parse_ss(text: str) -> list[SocketSample]:
    """The sockets of ``ss -t -i -n -H state established`` output: a line of queues and
    addresses, then an indented line of TCP_INFO fields."""
    out: list[SocketSample] = []
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if not line.strip() or line[0].isspace():
            continue
        cols = line.split()
        ends = [a for a in (_addr(c) for c in cols) if a is not None]
        if len(ends) < 2:
            continue
        info = lines[k + 1].split() if k + 1 < len(lines) and lines[k + 1][:1].isspace() else []
        out.append(SocketSample(ends[0], ends[1], **_info(info)))
    return out


# ---------------------------------------------------------------- per link

@dataclass
class LinkTcp:
    """What the samples of one directed link's sender sockets say; ``summary`` for the record."""

    first: dict[tuple, SocketSample] = field(default_factory=dict)   # by local end
    last: dict[tuple, SocketSample] = field(default_factory=dict)
    rtts_ms: list[float] = field(default_factory=list)
    cwnds: list[int] = field(default_factory=list)
    samples: int = 0

    def add(self, sock: SocketSample) -> None:
        self.first.setdefault(sock.local, sock)
        self.last[sock.local] = sock
        self.samples += 1
        if sock.rtt_ms is not None:
            self.rtts_ms.append(sock.rtt_ms)
        if sock.cwnd_segs is not None:
            self.cwnds.append(sock.cwnd_segs)

    def _delta(self, attr: str) -> float:
        return sum(getattr(self.last[k], attr) - getattr(self.first[k], attr) for k in self.last)

    def now(self) -> dict:
        """The latest sample, for the live view: RTT and cwnd now (the first connection with
        an RTT), retransmitted segments so far."""
        last = [v for v in self.last.values() if v.rtt_ms is not None]
        return {"tcp_rtt_ms": last[0].rtt_ms if last else None,
                "tcp_cwnd_segs": last[0].cwnd_segs if last else None,
                "tcp_retrans_segs": int(self._delta("retrans_total"))}

    def summary(self) -> dict:
        busy = self._delta("busy_ms")
        rwnd, sndbuf = self._delta("rwnd_limited_ms"), self._delta("sndbuf_limited_ms")
        out = {"samples": self.samples, "connections": len(self.last),
               "rtt_ms_median": _round(statistics.median(self.rtts_ms)) if self.rtts_ms else None,
               "rtt_ms_max": _round(max(self.rtts_ms)) if self.rtts_ms else None,
               "min_rtt_ms": _round(min((s.min_rtt_ms for s in self.last.values()
                                         if s.min_rtt_ms is not None), default=None)),
               "cwnd_segs_median": statistics.median(self.cwnds) if self.cwnds else None,
               "cwnd_segs_max": max(self.cwnds) if self.cwnds else None,
               "retrans_segs": int(self._delta("retrans_total")),
               "bytes_acked": int(self._delta("bytes_acked")),
               "busy_ms": busy, "rwnd_limited_ms": rwnd, "sndbuf_limited_ms": sndbuf}
        return out | {"held_by": held_by(busy, rwnd, sndbuf)}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def held_by(busy_ms: float, rwnd_limited_ms: float, sndbuf_limited_ms: float) -> str | None:
    """Who held a sender back while it had data queued (None: it never was busy)."""
    if busy_ms <= 0:
        return None
    if rwnd_limited_ms > HELD_SHARE * busy_ms:
        return "receiver"
    if sndbuf_limited_ms > HELD_SHARE * busy_ms:
        return "send buffer"
    return "path"


def group(samples_by_rank: Mapping[int, list[SocketSample]],
          rank_of_addr: Mapping[str, int], links: dict[tuple[int, int], LinkTcp]) -> None:
    """Add one round of samples to ``links``: a socket in ``src``'s namespace whose peer is
    another worker's address is a connection of link src -> that worker."""
    for src, socks in samples_by_rank.items():
        for sock in socks:
            dst = rank_of_addr.get(sock.peer[0])
            if dst is not None and dst != src:
                links.setdefault((src, dst), LinkTcp()).add(sock)


# ---------------------------------------------------------------- the sampler

Runner = Callable[[list[str], float], str]     # (argv, timeout_s) -> stdout; raises on failure


class TcpSampler:
    """Every ``interval_s``, ``ss`` in each worker's namespace (``wrap(rank, argv)``), until
    ``stop``; at most MAX_SAMPLES rounds. A failing ``ss`` stops the sampler and is reported in
    ``summary`` (``error``), not retried."""

    def __init__(self, ranks: list[int], rank_of_addr: Mapping[str, int],
                 wrap: Callable[[int, list[str]], list[str]], run: Runner,
                 interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        lo, hi = INTERVAL_RANGE_S
        if not lo <= interval_s <= hi:
            raise TcpSampleError(f"interval_s = {interval_s!r} is out of range; expected a "
                                 f"value in [{lo:g}, {hi:g}]")
        self.ranks, self.rank_of_addr, self.wrap, self.run = ranks, rank_of_addr, wrap, run
        self.interval_s, self.clock = interval_s, clock
        self.links: dict[tuple[int, int], LinkTcp] = {}
        self.rounds, self.error = 0, None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample_once(self) -> None:
        got = {r: parse_ss(self.run(self.wrap(r, list(SS_ARGV)), SS_TIMEOUT_S))
               for r in self.ranks}
        with self._lock:
            group(got, self.rank_of_addr, self.links)
            self.rounds += 1

    def _loop(self) -> None:
        while self.rounds < MAX_SAMPLES and not self._stop.is_set():
            started = self.clock()
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - recorded in the summary, sampling stops
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self._stop.wait(max(0.0, self.interval_s - (self.clock() - started)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tcp-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and take one last sample, so the counters cover the whole of training."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SS_TIMEOUT_S * (len(self.ranks) + 1))
            self._thread = None
            if self.error is None:
                try:
                    self.sample_once()
                except Exception as exc:  # noqa: BLE001 - as in _loop
                    self.error = f"{type(exc).__name__}: {exc}"

    def now(self) -> dict[tuple[int, int], dict]:
        """Per link, ``LinkTcp.now`` (the dashboard's links panel)."""
        with self._lock:
            return {k: v.now() for k, v in self.links.items()}

    def summary(self) -> dict:
        """{"rounds", "interval_s", "error", "links": {(src, dst): LinkTcp.summary()}}."""
        with self._lock:
            links = {k: v.summary() for k, v in sorted(self.links.items())}
        return {"rounds": self.rounds, "interval_s": self.interval_s, "error": self.error,
                "links": links}


def run_ss(argv: list[str], timeout_s: float) -> str:
    """The default runner: the command's stdout; an error naming it when it fails."""
    import subprocess
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[:200]}")
    return proc.stdout
