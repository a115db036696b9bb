"""A run's own fidelity verdict: did it emulate the network and compute it was asked for?

Plain functions of what the run recorded (no sockets, no clock): the plan (each link's
configured rate and one-way delay, the compute's nominal step time), what the run measured
(the packet line's lateness and read lag, the senders' TCP_INFO per link, the pre-run probe,
the workers' real / nominal step times), and the verdict ``faithful`` or ``degraded`` with
every reason, its numbers and the link it concerns.

The rules (docs/RECORDS.md lists the same):

- ``lateness``: the packet line released frames late beyond ``lateness_limit_ms`` at p99,
  the limit being min(2 ms, 10 % of the smallest delayed link's one-way delay) in emulated
  time (the line's clock is the wall: under dilation by K the limit is min(2 ms x K, 10 % of
  the dilated delay) wall ms); a frame held for 15 ms and released 27 ms late gave TCP a
  42 ms path, not the 15 ms asked;
- ``read_lag``: the line read frames off its sockets later, at p99, than the smallest
  delayed link's one-way delay (``read_lag_limit_ms``). A frame's delay runs from the
  kernel's receive timestamp (SO_TIMESTAMPNS), not from when the line reads it, so a frame
  read within its delay is still released on time (its lateness says whether it was); one
  read after its delay had passed cannot be. At K = 3 the 8-worker expander's frames were
  read up to 18 ms after they arrived on 45 ms links and released within 3 ms of their
  due time, and the run's messages took simulate's times within 3 %;
- ``rate``: a link busy long enough to judge (``MIN_BUSY_MS`` of TCP_INFO busy time,
  tcpi_busy_time of include/uapi/linux/tcp.h) whose sender was held by the path (not by the
  receiver's window or its own send buffer: netem.tcpsample.held_by) carried below
  ``RATE_SHARE`` of its configured rate while busy (bytes acknowledged * 8 / busy time). A
  sender that was app-limited is not busy (the kernel's busy chrono stops when nothing is
  queued), so its idle time does not count against the link. Nor is a link judged whose
  largest congestion window seen (``cwnd_segs_max`` x ``MSS_B``) over its smallest RTT could
  not carry ``RATE_SHARE`` of the rate: its messages were spent in slow start (a 0.48 MB
  message after idle over 100 ms takes 5.5 round trips at 10 to 344 segments), TCP held them
  by its window, not the shaper by its rate, and their times are TCP's, which simulate's
  model predicts;
- ``transfer``: a link's messages took longer (links.json's ``training_message_s_median``:
  the median over rounds, as their receivers timed them; the first also waits for its
  connection's handshakes, which no model of a message has; else the mean,
  ``training_transfer_s`` / ``training_messages``) than
  1 + ``TRANSFER_SLACK`` times what simulate's TCP model says one takes over the asked link
  (``tcp_model_message_s``, set by the launcher): the emulated path was slower than the
  asked one, whatever made it so (a late line, a short shaper, a starved sender). Where a
  link has this expectation the ``rate`` rule is not applied to it: a training message is
  short, its busy time is mostly slow start and round trips, and TCP_INFO's busy rate reads
  a faithful 0.48 MB exchange over 50 Mbit/s and 100 ms at 11 % of the rate;
- ``probe``: the pre-run probe read a link below ``RATE_SHARE`` of its configured rate. That
  is degraded too: the probe is a bulk flow over the very link training then used, and a link
  that cannot carry its rate alone cannot carry it under training;
- ``compute``: the median over workers and rounds of the round's worst real / nominal step
  time (metrics.jsonl's ``overrun_ratio``) above 1 + ``COMPUTE_SLACK``: the machine could not
  keep the nominal pace. Only where steps have a nominal time (compute.step_time_s > 0).

The packet line's engine (``c`` or ``python``) is recorded, never a reason by itself: the
Python engine is slower, and what that costs shows up as lateness or it does not.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

# 2: thresholds carry read_lag_limit_ms (read lag held to the smallest delay, not to the
# lateness limit) and the lateness cap holds in emulated time under dilation
FIDELITY_VERSION = 2
FAITHFUL, DEGRADED = "faithful", "degraded"

LATENESS_CAP_MS = 2.0     # the line's p99 lateness may not pass this ...
LATENESS_SHARE = 0.10     # ... nor this share of the smallest delayed link's one-way delay
RATE_SHARE = 0.95         # a link must carry this share of its configured rate
MIN_BUSY_MS = 500.0       # TCP_INFO busy time a link needs before its rate is judged
TRANSFER_SLACK = 0.10     # a link's messages may take this much longer than the TCP model's
# TCP's segment at the default 1500 B MTU: a larger MTU's window only reads smaller here, so
# such a link goes unjudged sooner, never degraded wrongly
MSS_B = 1448
COMPUTE_SLACK = 0.05      # the median step may take this much longer than its nominal time


class FidelityError(ValueError):
    """Inputs the verdict cannot be made of; the message names the value and its range."""


@dataclass(frozen=True)
class LinkPlan:
    """One directed link as asked: rate and one-way delay (the played ones, under dilation)."""

    src: int
    dst: int
    rate_mbit: float | None     # None: unshaped
    delay_ms: float

    def __post_init__(self):
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise FidelityError(f"link {self.src}->{self.dst}: rate_mbit {self.rate_mbit!r} "
                                "must be > 0 or None")
        if not self.delay_ms >= 0:
            raise FidelityError(f"link {self.src}->{self.dst}: delay_ms {self.delay_ms!r} "
                                "must be >= 0")


@dataclass(frozen=True)
class Reason:
    """Why a run is degraded: the rule's name, one line, its numbers and the link (or None)."""

    rule: str
    text: str
    numbers: dict
    link: tuple[int, int] | None = None

    def to_json(self) -> dict:
        return {"rule": self.rule, "text": self.text, "numbers": dict(self.numbers),
                "link": None if self.link is None else list(self.link)}


@dataclass(frozen=True)
class Thresholds:
    lateness_limit_ms: float | None   # None: no delayed link, no line to judge
    read_lag_limit_ms: float | None = None   # the smallest delayed link's one-way delay
    rate_share: float = RATE_SHARE
    min_busy_ms: float = MIN_BUSY_MS
    compute_slack: float = COMPUTE_SLACK


@dataclass(frozen=True)
class Verdict:
    fidelity: str
    reasons: tuple[Reason, ...]
    worst_link: dict | None          # {src, dst, rule, text}
    thresholds: Thresholds
    recorded: dict = field(default_factory=dict)   # measured numbers not judged (engine, drops)
    version: int = FIDELITY_VERSION

    @property
    def faithful(self) -> bool:
        return self.fidelity == FAITHFUL

    @property
    def line_late(self) -> bool:
        """Whether the packet line's own lateness or read lag broke its limit."""
        return any(r.rule in ("lateness", "read_lag") for r in self.reasons)

    def headline(self) -> str:
        """One line: the verdict and its worst reason."""
        if self.faithful:
            return FAITHFUL
        return f"{DEGRADED}: {self.reasons[0].text}"

    def to_json(self) -> dict:
        return {"version": self.version, "fidelity": self.fidelity,
                "reasons": [r.to_json() for r in self.reasons], "worst_link": self.worst_link,
                "thresholds": asdict(self.thresholds), "recorded": dict(self.recorded)}


def lateness_limit_ms(links: list[LinkPlan], time_scale: float = 1.0) -> float | None:
    """min(LATENESS_CAP_MS x K, LATENESS_SHARE x the smallest positive one-way delay) in wall
    ms, ``links`` being the played (dilated) plan: the same bound in emulated time at every
    K; None when no link is delayed."""
    smallest = read_lag_limit_ms(links)
    if smallest is None:
        return None
    return min(LATENESS_CAP_MS * time_scale, LATENESS_SHARE * smallest)


def read_lag_limit_ms(links: list[LinkPlan]) -> float | None:
    """The smallest positive one-way delay (wall ms): a frame read later than that after it
    arrived is released late whatever the line does next; None when no link is delayed."""
    return min((lk.delay_ms for lk in links if lk.delay_ms > 0), default=None)


def _line_rules(line: dict | None, th: Thresholds) -> list[Reason]:
    out = []
    if not line or th.lateness_limit_ms is None:
        return out
    # training's frames alone where the run marked its start (the probe's bulk flows before
    # it are the probe's, judged by their own rule)
    window = line.get("since_mark") or line
    for rule, key, what, limit_ms in (
            ("lateness", "late_release", "released frames late", th.lateness_limit_ms),
            ("read_lag", "read_lag", "read frames late", th.read_lag_limit_ms)):
        h = window.get(key) or {}
        if limit_ms is None:
            continue
        p99 = h.get("p99_ms")
        if h.get("count") and p99 is not None and p99 > limit_ms:
            out.append(Reason(rule, f"the packet line {what}: p99 {p99:g} ms, p50 "
                              f"{h.get('p50_ms', 0):g} ms, max {h.get('max_ms', 0):g} ms "
                              f"(limit {limit_ms:g} ms)",
                              {"p50_ms": h.get("p50_ms"), "p99_ms": p99,
                               "max_ms": h.get("max_ms"), "count": h.get("count"),
                               "limit_ms": limit_ms}))
    return out


def carried_mbit(tcp: dict) -> float | None:
    """The rate a link's senders carried while busy: bytes acked x 8 / busy time (Mbit/s)."""
    busy, acked = tcp.get("busy_ms") or 0, tcp.get("bytes_acked") or 0
    if busy <= 0:
        return None
    return acked * 8 / (busy * 1e3)


def window_mbit(tcp: dict) -> float | None:
    """The rate the largest congestion window seen could carry over the smallest RTT seen
    (Mbit/s); None where the samples do not say."""
    cwnd, rtt_ms = tcp.get("cwnd_segs_max"), tcp.get("min_rtt_ms")
    if not cwnd or not rtt_ms:
        return None
    return cwnd * MSS_B * 8 / (rtt_ms * 1e3)


def _transfer_rules(rows: list[dict], slack: float) -> list[Reason]:
    out = []
    for row in rows:
        n, took = row.get("training_messages") or 0, row.get("training_transfer_s")
        model = row.get("tcp_model_message_s")
        if not n or took is None or not model:
            continue
        each = row.get("training_message_s_median") or took / n
        if each > (1 + slack) * model:
            key = (row["src"], row["dst"])
            out.append(Reason("transfer", f"link {key[0]}->{key[1]}: its {n} messages took "
                              f"{each:.3f} s (median), {each / model:.2f}x the {model:.3f} s TCP "
                              "takes over the asked link (simulate's model)",
                              {"message_s": round(each, 6), "model_message_s": model,
                               "ratio": round(each / model, 4), "messages": n}, key))
    return out


def _rate_rules(links: dict[tuple[int, int], LinkPlan], tcp: dict, th: Thresholds,
                modelled: frozenset = frozenset()) -> list[Reason]:
    out = []
    for key, row in sorted(tcp.items()):
        lk = links.get(key)
        if lk is None or lk.rate_mbit is None or not row or key in modelled:
            continue
        if (row.get("busy_ms") or 0) < th.min_busy_ms or row.get("held_by") != "path":
            continue
        window = window_mbit(row)
        if window is not None and window < th.rate_share * lk.rate_mbit:
            continue   # held by TCP's own window (slow start), not by the link's rate
        got = carried_mbit(row)
        if got is not None and got < th.rate_share * lk.rate_mbit:
            out.append(Reason("rate", f"link {key[0]}->{key[1]} carried {got:.2f} Mbit/s while "
                              f"busy, {got / lk.rate_mbit:.0%} of its {lk.rate_mbit:g} Mbit/s",
                              {"carried_mbit": round(got, 3), "configured_mbit": lk.rate_mbit,
                               "share": round(got / lk.rate_mbit, 4),
                               "busy_ms": row.get("busy_ms")}, key))
    return out


def _probe_rules(probe_rows: list[dict], th: Thresholds) -> list[Reason]:
    out = []
    for r in probe_rows:
        want, got = r.get("configured_mbit"), r.get("measured_mbit")
        if not want or got is None or got >= th.rate_share * want:
            continue
        key = (r["src"], r["dst"])
        out.append(Reason("probe", f"link {key[0]}->{key[1]} probed {got:.2f} Mbit/s, "
                          f"{got / want:.0%} of its {want:g} Mbit/s",
                          {"measured_mbit": got, "configured_mbit": want,
                           "share": round(got / want, 4)}, key))
    return out


def _compute_rules(step_time_s: float | None, ratios: list[float], th: Thresholds) -> list[Reason]:
    ratios = [r for r in ratios if r and r > 0]
    if not step_time_s or not ratios:
        return []
    p50 = statistics.median(ratios)
    if p50 <= 1 + th.compute_slack:
        return []
    return [Reason("compute", f"steps took {p50:.2f}x their nominal {step_time_s:g} s at the "
                   "median: the machine could not keep the pace",
                   {"p50_ratio": round(p50, 4), "step_time_s": step_time_s,
                    "samples": len(ratios), "limit_ratio": 1 + th.compute_slack})]


def _severity(r: Reason) -> float:
    """How far past its limit a reason is (for the worst link): a share of the limit."""
    n = r.numbers
    if r.rule in ("lateness", "read_lag"):
        return n["p99_ms"] / n["limit_ms"]
    if r.rule in ("rate", "probe"):
        return 1 / max(n["share"], 1e-9)
    if r.rule == "transfer":
        return n["ratio"] / (1 + TRANSFER_SLACK)
    return n["p50_ratio"] / n["limit_ratio"]


def judge(links: list[LinkPlan], *, line: dict | None = None, tcp: dict | None = None,
          probe_rows: list[dict] | None = None, step_time_s: float | None = None,
          step_ratios: list[float] | None = None, transfers: list[dict] | None = None,
          time_scale: float = 1.0) -> Verdict:
    """The verdict of a run.

    ``line``: the packet line's stats (``late_release``, ``read_lag``: {count, p50_ms, p99_ms,
    max_ms}; ``engine``, ``priority``, ``socket_drops``, ``budget`` recorded); ``tcp``:
    {(src, dst): netem.tcpsample LinkTcp.summary()}; ``probe_rows``: network.probe_rows;
    ``step_ratios``: each worker-round's worst real / nominal step time; ``transfers``:
    links.json rows with ``training_messages``, ``training_transfer_s`` and the TCP model's
    ``tcp_model_message_s``; ``time_scale``: the run's K (``links``' delays and the line's
    stats are wall ms, the limits hold in emulated time)."""
    by_key = {(lk.src, lk.dst): lk for lk in links}
    th = Thresholds(lateness_limit_ms(links, time_scale), read_lag_limit_ms(links))
    line_reasons = _line_rules(line, th)
    transfers = transfers or []
    modelled = frozenset((r["src"], r["dst"]) for r in transfers if r.get("tcp_model_message_s"))
    link_reasons = _transfer_rules(transfers, TRANSFER_SLACK) + \
        _rate_rules(by_key, tcp or {}, th, modelled) + _probe_rules(probe_rows or [], th)
    reasons = sorted(line_reasons + link_reasons + _compute_rules(step_time_s,
                                                                  step_ratios or [], th),
                     key=_severity, reverse=True)
    worst = _worst_link(line_reasons, link_reasons, links)
    recorded = {}
    if line:
        recorded = {"engine": line.get("engine", "python"), "priority": line.get("priority"),
                    "socket_drops": line.get("socket_drops"),
                    "budget_refused": (line.get("budget") or {}).get("refused")}
    return Verdict(DEGRADED if reasons else FAITHFUL, tuple(reasons), worst, th, recorded)


def _worst_link(line_reasons: list[Reason], link_reasons: list[Reason],
                links: list[LinkPlan]) -> dict | None:
    """The link a reason names, the worst first; a line reason (the line serves every link)
    falls on the link it hurts most: the one with the smallest delay, whose limit it sets."""
    if link_reasons:
        r = max(link_reasons, key=_severity)
        return {"src": r.link[0], "dst": r.link[1], "rule": r.rule, "text": r.text}
    if line_reasons:
        delayed = [lk for lk in links if lk.delay_ms > 0]
        r = max(line_reasons, key=_severity)
        if delayed:
            lk = min(delayed, key=lambda x: (x.delay_ms, x.src, x.dst))
            return {"src": lk.src, "dst": lk.dst, "rule": r.rule, "text": r.text}
    return None


def tcp_by_link(link_rows: list[dict]) -> dict:
    """{(src, dst): tcp_training} of links.json's rows (those that have one)."""
    return {(r["src"], r["dst"]): r["tcp_training"] for r in link_rows if r.get("tcp_training")}


def plan_links(link_rows: list[dict]) -> list[LinkPlan]:
    """The plan's links of links.json's rows (configured_mbit, configured_latency_ms)."""
    return [LinkPlan(r["src"], r["dst"], r.get("configured_mbit") or None,
                     float(r.get("configured_latency_ms") or 0.0)) for r in link_rows]


def of_links_record(record: dict, *, step_time_s: float | None = None,
                    step_ratios: list[float] | None = None, time_scale: float = 1.0) -> Verdict:
    """The verdict of a links.json record (``ShapedNetwork.links_record``'s dict) of a run at
    ``time_scale``."""
    rows = record.get("links") or []
    probes = [r for r in rows if r.get("measured_mbit") is not None]
    return judge(plan_links(rows), line=record.get("packet_line"), tcp=tcp_by_link(rows),
                 probe_rows=probes, step_time_s=step_time_s, step_ratios=step_ratios,
                 transfers=rows, time_scale=time_scale)


def describe(record: dict | None) -> list[str]:
    """summary.json's ``fidelity`` in lines for ``show``: the verdict (with the worst link),
    then one line per reason; [] for a record without one."""
    if not record:
        return []
    worst = record.get("worst_link")
    where = "" if not worst else f" (worst link {worst['src']}->{worst['dst']})"
    lines = [f"fidelity: {record.get('fidelity')}{where}"]
    lines += [f"  {r['rule']}: {r['text']}" for r in record.get("reasons") or []]
    engine = (record.get("recorded") or {}).get("engine")
    if engine:
        lines.append(f"  packet line engine: {engine}")
    return lines
