"""What the dashboard knows: rows from the run fold into a `DashboardState`, which hands out a
frozen `Snapshot` (header, workers, links, warnings) for the pure renderer in `dashboard.py`.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from gasloc_emu.report import fmt


@dataclass(frozen=True)
class Header:
    """What is fixed for the whole run, shown at the top."""

    algorithm: str = "?"
    topology: str = "?"
    lambda2: float | None = None
    gamma: float | None = None
    profile: str = "unshaped"
    shaper: str = "none"
    workers: int = 1
    rounds: int = 1
    devices: tuple[str, ...] = ()
    tokens_per_step: int = 0  # batch_size * micro_batches * block_size: one inner step's
    compute: str = ""  # the compute model in words; empty when every worker runs at host speed
    step_time_s: float = 0.0  # nominal step time at speed 1 (0: measured), to tell late phases
    regions: tuple[str, ...] = ()  # each worker's region (net.placement); () without one
    time_scale: float = 1.0  # the run's time scale K (links at rate / K, delay x K)


def header_from_plan(plan, devices=(), shaper: str | None = None) -> Header:
    """The header of a ``RunPlan``; ``shaper`` is the one actually in use, when known."""
    from gasloc_emu.training.model import shape_from_config
    cfg, topo = plan.cfg, plan.topology
    return Header(
        algorithm=cfg.algo.name, topology=plan.topology_label(),
        lambda2=None if topo is None else topo.lambda2,
        # only what the algorithm shows (plain gossip and a2cid2 have no outer momentum)
        gamma=plan.constants().get("gamma"),
        profile=cfg.net.bw_profile or "unshaped", shaper=shaper or cfg.net.shaper,
        workers=cfg.workers, rounds=cfg.run.rounds, devices=tuple(devices),
        tokens_per_step=cfg.data.batch_size * cfg.algo.inner.micro_batches
        * shape_from_config(cfg.model).block_size,
        compute=compute_words(cfg.compute), step_time_s=cfg.compute.step_time_s,
        regions=plan.regions, time_scale=plan.time_scale)


def compute_words(c) -> str:
    """``compute.*`` in a few words for the header; empty for the default (host speed, fixed H)."""
    parts = [c.profile] if c.profile else []
    if c.step_time_s > 0:
        parts.append(f"step {c.step_time_s:g} s")
    if c.inner_budget_s > 0:
        parts.append(f"budget {c.inner_budget_s:g} s")
    return ", ".join(parts)


@dataclass(frozen=True)
class WorkerView:
    rank: int
    device: str = ""
    round: int = 0  # 1-based round last reported or in progress; 0 before the first report
    step: int = 0
    train_loss: float | None = None
    tokens_per_s: float | None = None
    state: str = "starting"
    peer: int | None = None
    speed: float | None = None  # the compute model's speed (None: not reported)
    round_steps: int | None = None  # inner steps of the last reported round
    wait_share: float | None = None  # share of its time so far spent waiting for peers


@dataclass(frozen=True)
class LinkView:
    src: int
    dst: int
    configured_mbit: float | None
    mbit_now: float | None
    bytes: int
    waited: bool = False  # dst waits for src now
    # its messages' bytes over their transfer times so far: the rate while it carries one
    # (links.json's training goodput), whatever share of the time it is idle
    sending_mbit: float | None = None
    # the sender's kernel as last sampled during training (tc runs; None elsewhere)
    rtt_ms: float | None = None
    retrans_segs: int | None = None

    @property
    def busy_s(self) -> float:
        """Seconds the link needs for what it moved, at its configured rate (its bytes when
        no rate is configured): the links that bound a run have the most."""
        if self.configured_mbit:
            return self.bytes * 8 / (self.configured_mbit * 1e6)
        return float(self.bytes)


@dataclass(frozen=True)
class Snapshot:
    header: Header
    elapsed_s: float = 0.0
    eta_s: float | None = None
    clock_s: float | None = None  # the run's own clock (virtual in the simulator)
    workers: tuple[WorkerView, ...] = ()
    links: tuple[LinkView, ...] = ()
    links_in_use: int = 0
    train_mean: float | None = None
    train_std: float | None = None
    eval_loss: float | None = None
    eval_round: int | None = None
    final_eval_loss: float | None = None
    consensus: float | None = None
    train_history: tuple[float, ...] = ()
    eval_history: tuple[float, ...] = ()
    warnings: tuple[str, ...] = ()
    # data-plane messages the workers dropped (None: no worker reports them, as in the
    # simulator, which has no wire) and control messages the launcher dropped; reasons with
    # their counts, most first
    drops: int | None = None
    drop_reasons: tuple[tuple[str, int], ...] = ()
    control_drops: tuple[tuple[str, int], ...] = ()
    # (worker, round) of every round a worker did not commit (DiLoCo after a lost peer broke
    # its All-Reduce: its inner steps of that round are discarded), in the order reported
    uncommitted: tuple[tuple[int, int], ...] = ()
    # the fidelity verdict as it stands (report.fidelity's headline); None: none asked yet
    fidelity: str | None = None
    faithful: bool | None = None


class _Worker:
    """Mutable per-worker state; copied into a WorkerView at snapshot time."""

    __slots__ = ("rank", "device", "round", "step", "reported_step", "train_loss",
                 "tokens_per_s", "state", "peer", "last_seen", "wait_since", "dropped",
                 "drop_reasons", "speed", "round_steps", "busy_s", "waited_s", "wait_share",
                 "overruns", "worst_ratio")

    def __init__(self, rank: int, device: str):
        self.rank, self.device = rank, device
        self.round, self.step, self.reported_step, self.dropped = 0, 0, 0, 0
        self.train_loss = self.tokens_per_s = self.peer = self.last_seen = None
        self.wait_since = None
        self.drop_reasons: dict[str, int] | None = None  # cumulative, from status rows
        self.state = "starting"
        self.speed = self.round_steps = self.wait_share = None
        self.busy_s = self.waited_s = self.worst_ratio = 0.0  # summed over metric rows
        self.overruns = 0

    def view(self) -> WorkerView:
        return WorkerView(self.rank, self.device, self.round, self.step, self.train_loss,
                          self.tokens_per_s, self.state, self.peer, self.speed,
                          self.round_steps, self.wait_share)


class _RoundMeans:
    """Mean of one value per round, appended to a history once every live worker reported."""

    def __init__(self, history: int):
        self.pending: dict[int, list] = {}
        self.history: list[float] = []
        self.cap = history
        self.last_round: int | None = None

    def add(self, rnd: int, value, expected: int) -> None:
        acc = self.pending.setdefault(rnd, [0.0, 0, 0])  # sum, finite values, reports
        acc[2] += 1
        if fmt.finite(value):
            acc[0] += value
            acc[1] += 1
        if acc[2] >= expected:
            del self.pending[rnd]
            if acc[1]:
                self._push(rnd, acc[0] / acc[1])

    def _push(self, rnd: int, mean: float) -> None:
        self.history.append(mean)
        self.last_round = rnd
        if len(self.history) > 2 * self.cap:  # trim in bulk: amortised O(1) per round
            del self.history[:-self.cap]


class DashboardState:
    """Accumulates events; ``snapshot(now)`` freezes what the dashboard shows.

    Thread-safe: the simulator feeds it from worker threads while the Live timer snapshots.
    """

    def __init__(self, header: Header | dict, start: float | None = None, *, top_links: int = 8,
                 history: int = 240, late_after_s: float = 10.0, max_warnings: int = 6):
        self.header = header if isinstance(header, Header) else Header(**header)
        self.start = time.monotonic() if start is None else start
        self.top_links, self.late_after_s, self.max_warnings = top_links, late_after_s, max_warnings
        self._lock = threading.Lock()
        devs = self.header.devices
        self._workers = {r: _Worker(r, devs[r] if r < len(devs) else "")
                         for r in range(self.header.workers)}
        self._links: dict[tuple[int, int], LinkView] = {}
        self._train, self._eval = _RoundMeans(history), _RoundMeans(history)
        self._warnings: OrderedDict = OrderedDict()
        self._alive = self.header.workers
        self._reports, self._last_report = 0, self.start
        self._clock_s = self._consensus = self._final_eval = None
        self._control_drops: dict[str, int] = {}
        self._uncommitted: list[tuple[int, int]] = []
        self._events = 0  # scenario events shown so far (each keeps its own line)
        self._fidelity: tuple[str, bool] | None = None   # (headline, faithful)

    # ---- feeding

    def update(self, row: dict, now: float | None = None) -> None:
        handler = _HANDLERS.get(row.get("kind", "metric"))
        if handler is None:
            return  # kinds from newer producers are ignored, not fatal
        now = time.monotonic() if now is None else now
        with self._lock:
            try:
                handler(self, row, now)
            except (KeyError, TypeError, ValueError) as exc:  # a display must not stop a run
                self._warn(("malformed", row.get("kind", "metric")),
                           f"ignored a malformed {row.get('kind', 'metric')} row ({exc!r})")

    __call__ = update

    def _worker(self, rank: int) -> _Worker:
        w = self._workers.get(rank)
        if w is None:  # a rank beyond the header's count still gets a row
            w = self._workers[rank] = _Worker(rank, "")
        return w

    def _warn(self, key, text: str) -> None:
        """Keep the latest distinct warnings; a repeated key updates its text in place."""
        self._warnings[key] = text
        self._warnings.move_to_end(key)
        if len(self._warnings) > self.max_warnings:
            self._warnings.popitem(last=False)

    def _on_metric(self, row: dict, now: float) -> None:
        w = self._worker(row["worker"])
        self._throughput(w, row)
        w.round, w.step = row["round"] + 1, row.get("step", w.step)
        w.reported_step = w.step
        w.train_loss, w.last_seen, w.peer, w.wait_since = row.get("train_loss"), now, None, None
        w.state = "done" if w.round >= self.header.rounds else "computing"
        self._reports, self._last_report = self._reports + 1, now
        self._train.add(row["round"], row.get("train_loss"), self._alive)
        if row.get("eval_loss") is not None:
            self._eval.add(row["round"], row["eval_loss"], self._alive)
        self._extras(w, row)
        self._compute(w, row)

    def _compute(self, w: _Worker, row: dict) -> None:
        """Speed, steps and the share of time waiting from a metric row; overruns warn."""
        w.speed = row.get("speed", w.speed)
        w.round_steps = row.get("steps", w.round_steps)
        if fmt.finite(row.get("compute_s")) and fmt.finite(row.get("comm_s")):
            w.busy_s += row["compute_s"] + row["comm_s"]
            w.waited_s += row.get("wait_s") or 0.0
            w.wait_share = min(1.0, w.waited_s / w.busy_s) if w.busy_s > 0 else None
        if row.get("overruns"):
            w.overruns += int(row["overruns"])
            w.worst_ratio = max(w.worst_ratio, float(row.get("overrun_ratio") or 0.0))
            self._warn(("overrun", w.rank), self._overrun_text(w, row))

    def _overrun_text(self, w: _Worker, row: dict) -> str:
        text = (f"worker {w.rank}: {w.overruns} inner step(s) slower than their nominal time "
                f"so far (worst {w.worst_ratio:.2f}×)")
        late_s = _late_s(row, self.header.step_time_s)
        if late_s is None:
            return text + "; later steps caught up"
        return text + (f"; round {row['round'] + 1} ran {late_s:.2f} s late: the host is too "
                       "slow for this compute.step_time_s")

    def _throughput(self, w: _Worker, row: dict) -> None:
        # steps since the last metric row: status rows may move w.step within a round
        steps = row.get("step", w.reported_step) - w.reported_step
        compute = row.get("compute_s") or 0.0
        if self.header.tokens_per_step and compute > 0 and steps > 0:
            w.tokens_per_s = self.header.tokens_per_step * steps / compute

    def _extras(self, w: _Worker, row: dict) -> None:
        if fmt.finite(row.get("time_s")):
            self._clock_s = max(self._clock_s or 0.0, row["time_s"])
        if fmt.finite(row.get("consensus_distance")):
            self._consensus = row["consensus_distance"]
        if row.get("uncommitted"):
            self._uncommitted.append((w.rank, row["round"]))
        if row.get("dropped") and int(row["dropped"]) > w.dropped:  # cumulative counts
            w.dropped = int(row["dropped"])
            self._warn(("dropped", w.rank), f"worker {w.rank}: {w.dropped} message(s) dropped "
                                            f"(last in round {w.round})")

    def _on_status(self, row: dict, now: float) -> None:
        w = self._worker(row["worker"])
        before, state, peer = w.state, row.get("state") or w.state, row.get("peer")
        if state != "waiting" or peer != w.peer or w.wait_since is None:
            w.wait_since = now if state == "waiting" else None  # a new wait starts its clock
        w.state, w.peer, w.last_seen = state, peer, now
        if row.get("round") is not None:
            w.round = max(0, row["round"] + 1)
        w.device = row.get("device") or w.device
        w.step = w.step if row.get("step") is None else row["step"]
        if row.get("drop_reasons") is not None:
            w.drop_reasons = _counts(row["drop_reasons"])
        for key, attr in (("speed", "speed"), ("round_steps", "round_steps"),
                          ("wait_share", "wait_share")):
            if row.get(key) is not None:
                setattr(w, attr, row[key])
        if state == "failed" and before != "failed":
            self._alive = max(1, self._alive - 1)  # later rounds complete without it
            self._warn(("failed", w.rank), f"worker {w.rank} failed"
                       + (f": {row['error']}" if row.get("error") else ""))

    def _on_links(self, row: dict, now: float) -> None:
        for link in row.get("links", ()):
            goodput = link.get("training_goodput_mbit")
            view = LinkView(link["src"], link["dst"], link.get("configured_mbit"),
                            link.get("mbit_now"), int(link.get("bytes") or 0),
                            sending_mbit=goodput if fmt.finite(goodput) else None,
                            rtt_ms=link.get("tcp_rtt_ms"),
                            retrans_segs=link.get("tcp_retrans_segs"))
            self._links[(view.src, view.dst)] = view
            miss = _link_miss(view, link.get("ok"), link.get("training_goodput_mbit"))
            if miss:
                self._warn(("link", view.src, view.dst), f"link {view.src}→{view.dst} {miss}")

    def _on_warning(self, row: dict, now: float) -> None:
        text = str(row.get("text", ""))
        self._warn(("text", text), text)

    def _on_event(self, row: dict, now: float) -> None:
        self._events += 1
        self._warn(("event", self._events), "event: " + str(row["text"]))

    def _on_control_drops(self, row: dict, now: float) -> None:
        self._control_drops = _counts(row["drops"])

    def _on_fidelity(self, row: dict, now: float) -> None:
        self._fidelity = (str(row["headline"]), row["fidelity"]["fidelity"] == "faithful")

    def _on_summary(self, row: dict, now: float) -> None:
        if fmt.finite(row.get("consensus_distance")):
            self._consensus = row["consensus_distance"]
        if fmt.finite(row.get("final_eval_loss")):
            self._final_eval = row["final_eval_loss"]

    # ---- reading

    def snapshot(self, now: float | None = None) -> Snapshot:
        now = time.monotonic() if now is None else now
        with self._lock:
            workers = tuple(w.view() for w in sorted(self._workers.values(), key=worker_rank))
            late = self._late_warnings(now)
            waits = {(w.peer, w.rank) for w in workers if w.state == "waiting"}
            links = [dataclasses.replace(lk, waited=(lk.src, lk.dst) in waits) for lk in
                     heapq.nlargest(self.top_links, self._links.values(), key=_link_key)]
            in_use = sum(1 for lk in self._links.values() if lk.bytes > 0)
            warnings = tuple(self._warnings.values()) + late
            train_hist, eval_hist = tuple(self._train.history), tuple(self._eval.history)
            eval_round = self._eval.last_round
            reports, clock_s = self._reports, self._clock_s
            consensus, final_eval = self._consensus, self._final_eval
            drops = _sum_counts([w.drop_reasons for w in self._workers.values()
                                 if w.drop_reasons is not None])
            control = _most_first(self._control_drops)
            uncommitted = tuple(self._uncommitted)
            verdict = self._fidelity
        mean, std = _mean_std([w.train_loss for w in workers])
        elapsed = max(0.0, now - self.start)
        return Snapshot(
            header=self.header, elapsed_s=elapsed, eta_s=self._eta(elapsed, reports),
            clock_s=clock_s, workers=workers, links=tuple(lk for lk in links if lk.bytes > 0),
            links_in_use=in_use, train_mean=mean, train_std=std,
            eval_loss=eval_hist[-1] if eval_hist else None,
            eval_round=None if eval_round is None else eval_round + 1,
            final_eval_loss=final_eval, consensus=consensus, train_history=train_hist,
            eval_history=eval_hist, warnings=warnings,
            drops=None if drops is None else sum(drops.values()),
            drop_reasons=() if drops is None else _most_first(drops), control_drops=control,
            uncommitted=uncommitted, fidelity=None if verdict is None else verdict[0],
            faithful=None if verdict is None else verdict[1])

    def _eta(self, elapsed: float, reports: int) -> float | None:
        """Remaining time at the rate worker-rounds have been reported so far."""
        total = self.header.workers * self.header.rounds
        if reports <= 0 or total <= 0:
            return None
        return max(0.0, elapsed * (total - reports) / reports)

    def _late_warnings(self, now: float) -> tuple[str, ...]:
        return self._silent_workers(now) + self._held_up(now)

    def _silent_workers(self, now: float) -> tuple[str, ...]:
        """Workers silent for over 3 typical round times (at least ``late_after_s``); the
        typical time is taken up to the last report, so a stalled run does not stretch it."""
        done = max((w.round for w in self._workers.values()), default=0)
        typical = (self._last_report - self.start) / done if done else 0.0
        limit = max(self.late_after_s, 3.0 * typical)
        out = []
        for w in sorted(self._workers.values(), key=worker_rank):
            silent = now - (self.start if w.last_seen is None else w.last_seen)
            if w.state not in ("done", "failed") and silent > limit:
                out.append(f"worker {w.rank} late: silent for {silent:.0f}s in round "
                           f"{max(w.round, 1)}")
        return tuple(out)

    def _held_up(self, now: float) -> tuple[str, ...]:
        """Workers that peers have waited for longer than ``late_after_s``: a heartbeating
        worker is never silent, but a slow one shows in the others' waits."""
        waiters: dict[int, list[int]] = {}
        for w in sorted(self._workers.values(), key=worker_rank):
            if w.wait_since is not None and now - w.wait_since > self.late_after_s:
                waiters.setdefault(w.peer, []).append(w.rank)
        return tuple(f"worker {p} late: worker(s) {', '.join(map(str, ranks))} waiting for it"
                     for p, ranks in sorted(waiters.items(), key=lambda kv: str(kv[0])))


_HANDLERS = {"metric": DashboardState._on_metric, "status": DashboardState._on_status,
             "event": DashboardState._on_event,
             "links": DashboardState._on_links, "warning": DashboardState._on_warning,
             "summary": DashboardState._on_summary,
             "control_drops": DashboardState._on_control_drops,
             "fidelity": DashboardState._on_fidelity}


def worker_rank(w) -> int:
    return w.rank


def _link_key(lk: LinkView) -> tuple[bool, float]:
    """The links that bound the run first: the most seconds at their rate."""
    return lk.configured_mbit is not None, lk.busy_s


def _late_s(row: dict, step_time_s: float) -> float | None:
    """How much longer a round's inner phase took than its nominal time (over 1 % of it), or
    None: paced steps catch up after a slow one, so only a late phase changes the timing."""
    speed, steps, compute_s = row.get("speed"), row.get("steps"), row.get("compute_s")
    if not (step_time_s > 0 and fmt.finite(speed) and speed > 0 and fmt.finite(compute_s)
            and isinstance(steps, int)):
        return None
    nominal_s = steps * step_time_s / speed
    late_s = compute_s - nominal_s
    return late_s if late_s > 0.01 * nominal_s else None


def _link_miss(view: LinkView, ok, goodput_mbit=None) -> str | None:
    """Why a link misses its target. Only overshoot is judged, and from what its messages took
    to cross it (``goodput_mbit``: bytes over transfer time, the run's links.json figure): an
    idle link reads below its target without being wrong, and a window's delivered bytes come
    a whole message at a time, so two messages ending in one window read above it though the
    link kept its rate. An explicit ok=False covers the rest."""
    if ok is False:
        return f"misses its target of {fmt.mbit(view.configured_mbit)}"
    if view.configured_mbit and fmt.finite(goodput_mbit) and \
            goodput_mbit > 1.1 * view.configured_mbit:
        return (f"delivers {fmt.mbit(goodput_mbit)}, above its target of "
                f"{fmt.mbit(view.configured_mbit)} (not shaped?)")
    return None


def _counts(raw: dict) -> dict[str, int]:
    """{reason: count} from a row (a malformed one raises, and becomes a warning)."""
    if not isinstance(raw, dict):
        raise TypeError(f"drop counts must be a map, got {type(raw).__name__}")
    return {str(reason): int(n) for reason, n in raw.items()}


def _sum_counts(per_worker: list[dict[str, int]]) -> dict[str, int] | None:
    """The workers' reason counts added up; None when no worker reported any."""
    if not per_worker:
        return None
    total: dict[str, int] = {}
    for counts in per_worker:
        for reason, n in counts.items():
            total[reason] = total.get(reason, 0) + n
    return total


def _most_first(counts: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(((r, n) for r, n in counts.items() if n), key=lambda rn: (-rn[1], rn[0])))


def _mean_std(values) -> tuple[float | None, float | None]:
    vals = [v for v in values if fmt.finite(v)]
    if not vals:
        return None, None
    mean = sum(vals) / len(vals)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
