"""Pure: what ``netem measure`` measures, in what order, within which bounds, and the file it
writes. No socket and no clock of its own (every time is handed in), so each rule is a test.

- ``MeasureBounds``: the user's bounds (bytes and seconds per pair, seconds in all, pings),
  checked at construction; an error names the value and the allowed range.
- ``pair_order``: every directed pair of hosts, one at a time, in an order each host derives
  alone from the host count.
- ``PairBudget``: one pair's deadlines from its start and the whole measurement's deadline;
  which bound ended a transfer.
- ``ping_stats`` / ``goodput``: the numbers of one pair, from the samples the sockets took.
- ``PairResult`` / ``HostReport``: the typed records the hosts exchange (nothing read from the
  wire or the store is trusted: ``from_json`` checks every field).
- ``profile_document``: node 0's profile file (``netem.profiles`` reads it as a *site*
  profile: ``format``, ``site``, ``site_link``, ``placement``, ``same_site``, ``provenance``).
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

FORMAT = "gasloc-emu measured profile"
FORMAT_VERSION = 1
BOUND_NAMES = ("max_bytes_per_pair", "max_seconds_per_pair", "max_seconds")
BYTES_RANGE = (64 * 1024, 64 * 2**30)
PAIR_SECONDS_RANGE = (0.5, 600.0)
TOTAL_SECONDS_RANGE = (1.0, 7 * 86400.0)
PINGS_RANGE = (1, 10_000)
DEFAULT_MAX_BYTES = 64_000_000
DEFAULT_PAIR_SECONDS = 10.0
DEFAULT_TOTAL_SECONDS = 600.0
DEFAULT_PINGS = 20
PING_SHARE = 0.25          # of a pair's time, at most, for its pings
REPORT_RESERVE_S = 1.0     # kept at the end of a pair for the receiver's report (at most 20 %)
MIN_PAIR_S = 0.5           # a pair that would get less than this of the total is not started
WARMUP_SHARE = 0.25        # of the receiver's time, left out of the goodput (slow start)
PLACEMENTS = ("cycle", "blocks")
SAME_SITE_RULES = ("unshaped", "given")
UNSHAPED_RATE_MBIT = 100_000.0     # profiles.RATE_RANGE_MBIT's top: no rate limits it


class MeasureError(ValueError):
    """A bound out of range, or a record from another host that is not what it must be."""


def _check_number(name: str, value, lo: float, hi: float, integer: bool = False):
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or \
            not lo <= value <= hi:
        kind, span = ("an integer", f"[{lo}, {hi}]") if integer else ("a number",
                                                                       f"[{lo:g}, {hi:g}]")
        raise MeasureError(f"{name} = {value!r} is out of range; expected {kind} in {span}")
    return value


@dataclass(frozen=True)
class MeasureBounds:
    """What one measurement may take: a transfer stops at whichever bound comes first."""

    max_bytes_per_pair: int = DEFAULT_MAX_BYTES
    max_seconds_per_pair: float = DEFAULT_PAIR_SECONDS
    max_seconds: float = DEFAULT_TOTAL_SECONDS
    pings: int = DEFAULT_PINGS

    def __post_init__(self) -> None:
        _check_number("--max-bytes-per-pair", self.max_bytes_per_pair, *BYTES_RANGE,
                      integer=True)
        _check_number("--max-seconds-per-pair", self.max_seconds_per_pair, *PAIR_SECONDS_RANGE)
        _check_number("--max-seconds", self.max_seconds, *TOTAL_SECONDS_RANGE)
        _check_number("--pings", self.pings, *PINGS_RANGE, integer=True)

    def as_dict(self) -> dict:
        return asdict(self)


def pair_order(hosts: int) -> list[tuple[int, int]]:
    """Every directed pair, one at a time: (0,1), (1,0), (0,2), (2,0), ..., (1,2), (2,1), ...
    Both directions of a pair follow each other, so a slow pair shows up early in both."""
    _check_number("hosts", hosts, 2, 4096, integer=True)
    return [p for i in range(hosts) for j in range(i + 1, hosts) for p in ((i, j), (j, i))]


@dataclass(frozen=True)
class PairBudget:
    """One pair's time: it starts at ``start_s`` and ends at ``deadline_s``, the earlier of its
    own bound and the whole measurement's deadline (``bound``: which of the two)."""

    bounds: MeasureBounds
    start_s: float
    total_deadline_s: float

    @property
    def deadline_s(self) -> float:
        return min(self.start_s + self.bounds.max_seconds_per_pair, self.total_deadline_s)

    @property
    def time_bound(self) -> str:
        own = self.start_s + self.bounds.max_seconds_per_pair
        return "max_seconds_per_pair" if own <= self.total_deadline_s else "max_seconds"

    @property
    def startable(self) -> bool:
        return self.deadline_s - self.start_s >= MIN_PAIR_S

    @property
    def ping_deadline_s(self) -> float:
        return self.start_s + PING_SHARE * (self.deadline_s - self.start_s)

    @property
    def bulk_deadline_s(self) -> float:
        """The sender stops writing, and the receiver reading, here; what is left of the pair
        carries the receiver's report back."""
        span = self.deadline_s - self.start_s
        return self.deadline_s - min(REPORT_RESERVE_S, 0.2 * span)

    def bulk_seconds(self, now_s: float) -> float:
        return max(0.0, self.bulk_deadline_s - now_s)

    def ended_by(self, bytes_done: int) -> str:
        """The bound that ended a transfer of ``bytes_done`` bytes: the bytes when all came,
        else the time bound in force."""
        return "max_bytes_per_pair" if bytes_done >= self.bounds.max_bytes_per_pair \
            else self.time_bound


# ---------------------------------------------------------------- the numbers of one pair

def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in (0, 100]): a value that was measured, not interpolated."""
    if not values:
        raise MeasureError("no samples")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ping_stats(rtts_s: Sequence[float]) -> dict:
    """RTTs of the request/response pings, in ms: median, p95, min, count."""
    ms = [r * 1e3 for r in rtts_s]
    n = len(ms)
    median = sorted(ms)[n // 2] if n % 2 else (sorted(ms)[n // 2 - 1] + sorted(ms)[n // 2]) / 2
    return {"count": n, "median_ms": round(median, 4), "p95_ms": round(percentile(ms, 95), 4),
            "min_ms": round(min(ms), 4)}


def goodput(points: Sequence[tuple[float, int]]) -> dict:
    """The receiver's goodput from its clock: ``points`` = (time, bytes received so far), in
    order. ``mbit``: over the last 1 - WARMUP_SHARE of the receiving time (slow start left
    out); ``mean_mbit``: first byte to last; ``seconds``, ``bytes``."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        raise MeasureError("too few bytes arrived to time a goodput (fewer than two reads)")
    t0, b0 = points[0]
    t1, b1 = points[-1]
    cut = t0 + WARMUP_SHARE * (t1 - t0)
    ta, ba = next((t, b) for t, b in points if t >= cut)
    steady = (b1 - ba) * 8 / (t1 - ta) / 1e6 if t1 > ta else (b1 - b0) * 8 / (t1 - t0) / 1e6
    return {"mbit": round(steady, 4), "mean_mbit": round((b1 - b0) * 8 / (t1 - t0) / 1e6, 4),
            "seconds": round(t1 - t0, 4), "bytes": b1}


# ---------------------------------------------------------------- records between hosts

def _typed(cls, raw, what: str):
    """A dataclass from JSON-decoded ``raw``: every field present and of its JSON type."""
    kinds = {"int": (int,), "float": (int, float), "str": (str,), "dict": (dict,)}
    names = {f.name: f for f in fields(cls)}
    if not isinstance(raw, dict) or set(raw) != set(names):
        shown = sorted(raw) if isinstance(raw, dict) else raw
        raise MeasureError(f"{what} has the wrong fields: {shown!r}")
    for key, value in raw.items():
        want = kinds[str(names[key].type)]
        if isinstance(value, bool) or not isinstance(value, want):
            raise MeasureError(f"{what}: {key} = {value!r} is not a {names[key].type}")
    return cls(**raw)


@dataclass(frozen=True)
class HostReport:
    """One host as it published itself: where it listens and its TCP."""

    node: int
    host: str
    addr: str
    port: int
    version: str
    tcp: dict        # netem.tcpsettings.HostTcp.as_dict() of its initial namespace
    pid: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text) -> HostReport:
        try:
            raw = json.loads(text)
        except ValueError:
            raise MeasureError("a host report is not JSON") from None
        rep = _typed(cls, raw, "host report")
        if not 1 <= rep.port <= 65535:
            raise MeasureError(f"host report: port = {rep.port} is out of range [1, 65535]")
        return rep


@dataclass(frozen=True)
class PairResult:
    """One directed pair as its sender reports it. ``error`` empty: measured; else why not
    (and the numbers are zero)."""

    src: int
    dst: int
    error: str = ""
    ended_by: str = ""              # one of BOUND_NAMES
    rtt: dict = field(default_factory=dict)         # ping_stats
    receiver: dict = field(default_factory=dict)    # goodput, as the receiver timed it
    sender: dict = field(default_factory=dict)      # the sender's TCP_INFO after the transfer
    seconds: float = 0.0            # the pair's wall time at the sender

    def __post_init__(self) -> None:
        if not self.error and self.ended_by not in BOUND_NAMES:
            raise MeasureError(f"pair {self.src}->{self.dst}: ended_by = {self.ended_by!r} is "
                               f"not one of {', '.join(BOUND_NAMES)}")

    @property
    def ok(self) -> bool:
        return not self.error

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text) -> PairResult:
        try:
            raw = json.loads(text)
        except ValueError:
            raise MeasureError("a pair result is not JSON") from None
        res = _typed(cls, raw, "pair result")
        if res.ok:
            for key, table, names in (("rtt", res.rtt, ("median_ms", "p95_ms")),
                                      ("receiver", res.receiver, ("mbit",))):
                for name in names:
                    v = table.get(name)
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                            not math.isfinite(v) or v < 0:
                        raise MeasureError(f"pair result {res.src}->{res.dst}: {key}.{name} = "
                                           f"{v!r} is not a number >= 0")
        return res


# ---------------------------------------------------------------- the profile file

RATE_FROM = ("single-stream TCP goodput at the receiver, each read timed by the kernel's "
             "receive timestamp of its last segment (else the receiving process's clock: "
             "measured.goodput.clock says which), over the last "
             f"{1 - WARMUP_SHARE:.0%} of its receiving time (slow start left out)")
LATENCY_FROM = "median RTT of the TCP request/response pings over an open connection, halved"
LOSS_FROM = {"zero": "not applied (0): a single stream's retransmits are mostly its own queue "
                     "overflow, which the emulated link's queue reproduces; the share is kept "
                     "in measured.retrans_pct",
             "retransmits": "the sender's TCP_INFO total_retrans over data segments sent"}


def retrans_pct(sender: dict) -> float:
    segs = sender.get("data_segs_out") or 0
    return round(100 * sender.get("total_retrans", 0) / segs, 4) if segs else 0.0


def profile_document(hosts: Sequence[HostReport], results: Sequence[PairResult], *,
                     bounds: MeasureBounds, loss_from: str, date: str, tool_version: str,
                     placement: str = "cycle") -> dict:
    """The file ``run`` and ``simulate`` take with ``--bw-profile``: one site per host, one
    ``site_link`` per directed pair, each number with where it came from."""
    if loss_from not in LOSS_FROM:
        raise MeasureError(f"loss_from = {loss_from!r} is not one of {', '.join(LOSS_FROM)}")
    if placement not in PLACEMENTS:
        raise MeasureError(f"placement = {placement!r} is not one of {', '.join(PLACEMENTS)}")
    missing = [f"{r.src}->{r.dst}: {r.error}" for r in results if not r.ok]
    if missing:
        raise MeasureError("not every pair was measured: " + "; ".join(missing))
    links = []
    for r in results:
        retrans = retrans_pct(r.sender)
        links.append({"src": r.src, "dst": r.dst, "rate_mbit": r.receiver["mbit"],
                      "latency_ms": round(r.rtt["median_ms"] / 2, 4),
                      "loss_pct": retrans if loss_from == "retransmits" else 0.0,
                      "measured": {"rtt_ms": r.rtt, "goodput": r.receiver,
                                   "sender_tcp_info": r.sender, "retrans_pct": retrans,
                                   "ended_by": r.ended_by, "seconds": r.seconds}})
    return {
        "format": FORMAT, "version": FORMAT_VERSION, "placement": placement,
        "same_site": {"rule": "unshaped", "rate_mbit": UNSHAPED_RATE_MBIT, "latency_ms": 0.0,
                      "loss_pct": 0.0,
                      "why": "workers placed on one host talk over its loopback, which was not "
                             "measured: their links are not limited"},
        "site": [{"id": h.node, "host": h.host, "addr": h.addr, "tool_version": h.version,
                  "tcp": h.tcp} for h in hosts],
        "site_link": links,
        "provenance": {
            "tool": "gasloc-emu netem measure", "tool_version": tool_version, "date": date,
            "method": {"streams": 1, "repetitions": 1, "transport": "TCP",
                       "order": [[r.src, r.dst] for r in results], **bounds.as_dict()},
            "rate_mbit_from": RATE_FROM, "latency_ms_from": LATENCY_FROM,
            "loss_pct_from": LOSS_FROM[loss_from]},
    }
