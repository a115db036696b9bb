"""Read run records back and compare them: a table, a two-panel loss plot, one run in detail.

Both the comparison and the run view also say where each worker's time went (computing,
sending, waiting: sums over the rounds of metrics.jsonl) and what that makes the run bound by:
a slow worker's compute, or communication.

A run folder is read up to its damage: a killed run leaves a cut-off last metrics line and no
summary, a copied folder may lack its config. Each such defect becomes a line in
``Run.warnings`` (the CLI prints them); reading never raises for a folder that exists.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gasloc_emu.config import ConfigError, load_toml
from gasloc_emu.report import fidelity, fmt
from gasloc_emu.report.schema import (
    OLDEST_VERSION,
    MetricRow,
    RunSummary,
    SchemaError,
    check_version,
)
from netem.cloud import CloudError, parse_placement

INSTALL_PLOT = "pip install 'gasloc-emu[plot]'"
LINK_TOLERANCE = 0.10  # a link whose measured rate is off its target by more misses it


class CompareError(Exception):
    """A run folder cannot be read at all, or a plot cannot be made."""


class PlotUnavailable(CompareError):
    """matplotlib (the optional 'plot' extra) is not installed."""


@dataclass(frozen=True)
class RoundPoint:
    """One round's mean over the workers that reported a value, and when it ended."""

    round: int  # 1-based
    value: float
    time_s: float | None  # the latest worker's time_s in that round: the round ends with it


@dataclass
class Run:
    path: Path
    config: dict = field(default_factory=dict)
    summary: RunSummary | dict = field(default_factory=dict)  # {}: none readable
    rows: list[MetricRow] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    regions: tuple[str, ...] = ()  # each worker's region (config's net.placement); () for none

    @property
    def name(self) -> str:
        return self.path.resolve().name or str(self.path)

    @property
    def algorithm(self) -> str:
        return self.summary.get("algorithm") or _cfg(self.config, "algo", "name") or "?"

    @property
    def topology(self) -> str:
        return self.summary.get("topology") or _cfg(self.config, "topology", "name") or "?"

    @property
    def profile(self) -> str:
        return (self.summary.get("profile") or _cfg(self.config, "net", "bw_profile")
                or "unshaped")

    @property
    def label(self) -> str:
        return f"{self.name} ({self.algorithm}/{self.topology})"

    @property
    def rounds_done(self) -> int:
        return max((r["round"] + 1 for r in self.rows), default=0)

    @property
    def rounds_planned(self) -> int | None:
        return self.summary.get("rounds") or _cfg(self.config, "run", "rounds")

    @property
    def clock_s(self) -> float | None:
        """The run's own clock at its last row (virtual in the simulator)."""
        times = [r["time_s"] for r in self.rows if fmt.finite(r.get("time_s"))]
        return max(times) if times else None

    @property
    def bytes_sent(self) -> int | None:
        if fmt.finite(self.summary.get("bytes_sent_total")):
            return int(self.summary["bytes_sent_total"])
        sent = [r["bytes_sent"] for r in self.rows if fmt.finite(r.get("bytes_sent"))]
        return int(sum(sent)) if sent else None

    def series(self, key: str) -> list[RoundPoint]:
        return round_means(self.rows, key)


def _cfg(config: dict, section: str, key: str):
    sec = config.get(section)
    return sec.get(key) if isinstance(sec, dict) else None


def round_means(rows: list[dict], key: str) -> list[RoundPoint]:
    """Per round, the mean of ``key`` over the rows that have a finite one, in round order."""
    acc: dict[int, list] = {}
    for row in rows:
        slot = acc.setdefault(row["round"], [0.0, 0, None])  # sum, count, latest time
        if fmt.finite(row.get(key)):
            slot[0] += row[key]
            slot[1] += 1
        if fmt.finite(row.get("time_s")):
            slot[2] = row["time_s"] if slot[2] is None else max(slot[2], row["time_s"])
    return [RoundPoint(rnd + 1, s / n, t) for rnd, (s, n, t) in sorted(acc.items()) if n]


# ---------------------------------------------------------------- reading

def load_run(path) -> Run:
    """A run folder read as far as it goes; defects are listed in ``Run.warnings``."""
    path = Path(path)
    if not path.is_dir():
        raise CompareError(f"{path}: no such run folder")
    run = Run(path)
    run.rows = _read_metrics(path / "metrics.jsonl", run.warnings)
    run.summary = _read_summary(path / "summary.json", run.warnings)
    run.config = _read_config(path / "config.toml", run.warnings)
    run.links = _read_links(path / "links.json", run.warnings)
    run.regions = _regions(_cfg(run.config, "net", "placement"), run.warnings)
    return run


def _regions(placement, warnings: list[str]) -> tuple[str, ...]:
    """The workers' regions of the recorded net.placement, () without one; a placement this
    version cannot read (a region since dropped from the table) is a warning."""
    if not placement:
        return ()
    try:
        return parse_placement(str(placement))
    except CloudError as exc:
        warnings.append(f"config.toml's net.placement is unreadable ({exc}); links by number")
        return ()


def _read_metrics(p: Path, warnings: list[str]) -> list[MetricRow]:
    if not p.is_file():
        warnings.append("no metrics.jsonl: the run recorded no rounds")
        return []
    lines = p.read_text(errors="replace").split("\n")
    rows, bad, unfit = [], [], []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = _parse_row(line)
        if row is None:
            bad.append(i)
        elif isinstance(row, SchemaError):
            unfit.append((i, row))
        else:
            rows.append(row)
    # a run killed mid-write leaves its last line without the newline that ends every row
    if bad and bad[-1] == len(lines) and lines[-1]:
        bad.pop()
        warnings.append(f"metrics.jsonl: the last line is cut off (line {len(lines)}), ignored")
    if bad:
        warnings.append(f"metrics.jsonl: {len(bad)} unreadable line(s) skipped "
                        f"(line {_lines(bad)})")
    if unfit:
        warnings.append(f"metrics.jsonl: {len(unfit)} row(s) skipped that do not fit its "
                        f"schema (line {_lines([i for i, _ in unfit])}; line {unfit[0][0]}: "
                        f"{unfit[0][1]})")
    return rows


def _lines(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers[:5])) + (", ..." if len(numbers) > 5 else "")


def _parse_row(line: str) -> MetricRow | SchemaError | None:
    """A metrics row; None for anything that is not one (garbage, a partial line); the
    SchemaError of a row that does not fit (a version this code cannot read, a missing
    key)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not (isinstance(row, dict) and all(_is_int(row.get(k)) for k in ("worker", "round"))):
        return None
    try:
        return MetricRow.from_json(row)
    except SchemaError as exc:
        return exc


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _read_summary(p: Path, warnings: list[str]) -> RunSummary | dict:
    if not p.is_file():
        warnings.append("no summary.json: the run did not finish (killed, or still running); "
                        "numbers come from metrics.jsonl")
        return {}
    try:
        summary = json.loads(p.read_text(errors="replace"))
    except ValueError as exc:
        warnings.append(f"summary.json is unreadable ({exc}); numbers come from metrics.jsonl")
        return {}
    if not isinstance(summary, dict):
        warnings.append("summary.json is not a JSON object; numbers come from metrics.jsonl")
        return {}
    try:
        summary = RunSummary.from_json(summary)
    except SchemaError as exc:
        warnings.append(f"{exc}; numbers come from metrics.jsonl")
        return {}
    status = summary.get("status")
    if status not in (None, "ok"):  # failed, diverged, stopped, error: not a result
        warnings.append(f"the run {_ENDED.get(status, status)}: "
                        f"{summary.get('error') or 'no error recorded'}")
    return summary


_ENDED = {"failed": "failed", "diverged": "diverged", "stopped": "was stopped",
          "error": "hit an internal error"}


def _read_config(p: Path, warnings: list[str]) -> dict:
    if not p.is_file():
        warnings.append("no config.toml: settings unknown beyond summary.json")
        return {}
    try:
        return load_toml(p)
    except ConfigError as exc:
        warnings.append(str(exc))
        return {}


def _read_links(p: Path, warnings: list[str]) -> list[dict]:
    """links.json is optional; it holds a list of links or {'links': [...]}."""
    if not p.is_file():
        return []
    try:
        data = json.loads(p.read_text(errors="replace"))
    except ValueError as exc:
        warnings.append(f"links.json is unreadable ({exc})")
        return []
    links = data.get("links") if isinstance(data, dict) else data
    if not isinstance(links, list):
        warnings.append("links.json holds no list of links")
        return []
    try:   # rows as they are (a hand-made or older file may hold other keys); its version
        check_version("links.json", data.get("schema_version", OLDEST_VERSION)
                      if isinstance(data, dict) else OLDEST_VERSION)
    except SchemaError as exc:
        warnings.append(str(exc))
        return []
    return [lk for lk in links if isinstance(lk, dict)]


# ---------------------------------------------------------------- the table

def final_eval(run: Run) -> tuple[float | None, bool]:
    """The averaged model's final eval loss, else the last evaluated round's mean (flag True)."""
    if fmt.finite(run.summary.get("final_eval_loss")):
        return run.summary["final_eval_loss"], False
    points = run.series("eval_loss")
    return (points[-1].value, True) if points else (None, False)


def time_to_target(run: Run, target: float) -> float | None:
    """The run clock at the end of the first round whose mean eval loss is <= ``target``."""
    for p in run.series("eval_loss"):
        if p.value <= target:
            return p.time_s
    return None


def compare_table(runs: list[Run], target_loss: float | None = None) -> RenderableType:
    """The runs side by side, then where each run's workers spent their time."""
    parts: list[RenderableType] = [_runs_table(runs, target_loss)]
    timed = [run for run in runs if run.rows]
    if timed:
        parts.append(time_table(timed))
        parts.extend(Text(f"{run.name}: bound by {bottleneck(worker_times(run.rows))}")
                     for run in timed)
    return Group(*parts)


def _runs_table(runs: list[Run], target_loss: float | None) -> Table:
    estimated = False
    table = Table(box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("run", "algorithm", "topology", "profile", "rounds", "final eval", "wall s",
                 "clock s", "K", "bytes sent"):
        table.add_column(name, no_wrap=True, justify="left" if name in (
            "run", "algorithm", "topology", "profile") else "right")
    if target_loss is not None:
        table.add_column(f"s to eval ≤ {target_loss:g}", justify="right", no_wrap=True)
    for run in runs:
        cells, from_rows = _table_row(run, target_loss)
        estimated |= from_rows
        table.add_row(*cells)
    notes = []
    if estimated:
        notes.append("~ no final evaluation: the last evaluated round's mean worker eval loss")
    if any(_time_scale(run) != 1.0 for run in runs):
        notes.append("K: the run's time dilation; its seconds are emulated (wall / K), "
                     "comparable with K = 1 runs and simulate")
    table.caption = "\n".join(notes) or None
    return table


def _time_scale(run: Run) -> float:
    """The run's K (summary.json ``time_scale``); 1 for a record from before dilation."""
    k = run.summary.get("time_scale")
    return float(k) if isinstance(k, (int, float)) and not isinstance(k, bool) else 1.0


def _table_row(run: Run, target_loss: float | None) -> tuple[list[str], bool]:
    loss, from_rows = final_eval(run)
    planned = run.rounds_planned
    rounds = str(run.rounds_done) if planned in (None, run.rounds_done) else \
        f"{run.rounds_done}/{planned}"
    cells = [run.name, run.algorithm, run.topology, run.profile, rounds,
             ("~" if from_rows else "") + _num(loss, ".4f"),
             _num(run.summary.get("wall_s"), ".1f"), _num(run.clock_s, ".2f"),
             f"{_time_scale(run):g}", fmt.nbytes(run.bytes_sent)]
    if target_loss is not None:
        reached = time_to_target(run, target_loss)
        cells.append("not reached" if reached is None else f"{reached:.2f}")
    return cells, from_rows


def _num(v, spec: str) -> str:
    return format(v, spec) if fmt.finite(v) else "-"


# ---------------------------------------------------------------- where the time went

# the shares that tell a slow worker from slow links (see ``bottleneck``)
IDLE_SHARE = 0.10  # a worker waiting less than this is never held up by others
WAIT_SHARE = 0.20  # workers waiting or sending at least this are held up


@dataclass(frozen=True)
class WorkerTime:
    """One worker's seconds over a run, summed over its rows: computing (emulated compute,
    ``compute_s``), sending (``comm_s - wait_s``: the communication phase not blocked on a
    message) and waiting (``wait_s``) for peers."""

    worker: int
    rounds: int
    steps: int | None  # inner steps over the run; None for rows without them
    speed: float | None
    computing_s: float
    sending_s: float
    waiting_s: float

    @property
    def total_s(self) -> float:
        return self.computing_s + self.sending_s + self.waiting_s

    def share(self, seconds: float) -> float:
        return seconds / self.total_s if self.total_s > 0 else 0.0


def worker_times(rows: list[dict]) -> list[WorkerTime]:
    """Per worker (rank order), its time computing, sending and waiting over its rows."""
    by_worker: dict[int, list[dict]] = {}
    for row in rows:
        by_worker.setdefault(row["worker"], []).append(row)
    return [_worker_time(w, rs) for w, rs in sorted(by_worker.items())]


def _worker_time(worker: int, rows: list[dict]) -> WorkerTime:
    compute_s, comm_s, wait_s = (_sum(rows, k) for k in ("compute_s", "comm_s", "wait_s"))
    steps = [r["steps"] for r in rows if _is_int(r.get("steps"))]
    speeds = [r["speed"] for r in rows if fmt.finite(r.get("speed"))]
    return WorkerTime(worker, len(rows), sum(steps) if steps else None,
                      speeds[-1] if speeds else None, compute_s, max(0.0, comm_s - wait_s),
                      wait_s)


def _sum(rows: list[dict], key: str) -> float:
    return float(sum(r[key] for r in rows if fmt.finite(r.get(key))))


def bottleneck(times: list[WorkerTime]) -> str:
    """What a run's pace was set by, in words.

    A slow worker: the worker that computed longest almost never waits (< ``IDLE_SHARE`` of its
    time) while the others wait at least ``WAIT_SHARE`` of theirs on average. Communication:
    otherwise, when the workers spend ``WAIT_SHARE`` or more sending or waiting on average.
    Else compute, evenly.
    """
    if not times:
        return "nothing recorded"
    slow = max(times, key=lambda t: t.computing_s)
    others = [t.share(t.waiting_s) for t in times if t is not slow]
    others_wait = sum(others) / len(others) if others else 0.0
    if slow.share(slow.waiting_s) < IDLE_SHARE and others_wait >= WAIT_SHARE:
        return (f"worker {slow.worker}'s compute (it waits {slow.share(slow.waiting_s):.0%} "
                f"of its time, the others {others_wait:.0%})")
    comm = sum(t.share(t.sending_s + t.waiting_s) for t in times) / len(times)
    if comm >= WAIT_SHARE:
        return f"communication (the workers send or wait {comm:.0%} of their time)"
    return f"compute, evenly (the workers send or wait {comm:.0%} of their time)"


def time_table(runs: list[Run]) -> Table:
    """Per run and worker: speed, inner steps, and seconds computing, sending and waiting."""
    table = Table(title="time per worker (sums over the rounds of metrics.jsonl)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("run", "worker", "speed", "inner steps", "computing s", "sending s",
                 "waiting s", "waiting"):
        table.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    for run in runs:
        for t in worker_times(run.rows):
            table.add_row(run.name, str(t.worker), _num(t.speed, ".2f"),
                          "-" if t.steps is None else str(t.steps), f"{t.computing_s:.2f}",
                          f"{t.sending_s:.2f}", f"{t.waiting_s:.2f}",
                          f"{t.share(t.waiting_s):.0%}")
    return table


# ---------------------------------------------------------------- the plot

def matplotlib_figure():
    """Figure and the Agg canvas, imported only when a plot is asked for (an optional extra).
    Using them directly, not pyplot, leaves the caller's global backend alone."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable("plotting needs matplotlib, an optional extra; install it with: "
                              f"{INSTALL_PLOT}") from None
    return Figure, FigureCanvasAgg


def plot(runs: list[Run], path) -> object:
    """Write a PNG: loss against rounds (left) and against the run clock (right); returns the
    matplotlib Figure. Eval loss is the solid line, train loss the faint one, one colour a run."""
    Figure, FigureCanvasAgg = matplotlib_figure()
    fig = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(fig)
    by_round, by_time = fig.subplots(1, 2)
    colours = [f"C{i % 10}" for i in range(len(runs))]
    drawn = sum(_plot_run(by_round, by_time, run, c) for run, c in zip(runs, colours, strict=True))
    if not drawn:
        raise CompareError("nothing to plot: no run has a loss in its metrics.jsonl")
    _dress(fig, by_round, by_time)
    fig.savefig(path, dpi=110)
    return fig


def _plot_run(by_round, by_time, run: Run, colour: str) -> int:
    """Draw one run on both panels; the number of lines drawn."""
    drawn = 0
    evals, trains = run.series("eval_loss"), run.series("train_loss")
    for points, faint in ((trains, True), (evals, False)):
        if not points:
            continue
        label = run.label if not faint or not evals else None  # one legend entry per run
        style = dict(color=colour, alpha=0.35, lw=1.2) if faint else \
            dict(color=colour, lw=2, marker="o", ms=3)
        by_round.plot([p.round for p in points], [p.value for p in points], label=label, **style)
        timed = [p for p in points if p.time_s is not None]
        by_time.plot([p.time_s for p in timed], [p.value for p in timed], **style)
        drawn += 1
    return drawn


def _dress(fig, by_round, by_time) -> None:
    by_round.set(xlabel="round", ylabel="loss", title="loss against rounds")
    by_time.set(xlabel="seconds (run clock; virtual in the simulator)", ylabel="loss",
                title="loss against wall-clock time")
    by_round.xaxis.get_major_locator().set_params(integer=True)  # rounds are whole numbers
    for ax in (by_round, by_time):
        ax.grid(True, alpha=0.3)
    handles, labels = by_round.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, max(1, len(labels))),
               fontsize="small")
    fig.suptitle("solid: eval loss (workers' own models, mean)   faint: train loss (mean)",
                 fontsize="medium")


# ---------------------------------------------------------------- one run

_SUMMARY_ORDER = ("status", "error", "mode", "algorithm", "topology", "workers", "rounds",
                  "local_steps", "lambda2", "gamma", "final_eval_loss", "final_perplexity",
                  "worker_eval_loss", "consensus_distance", "bytes_sent_total", "wall_s",
                  "predicted_wall_s", "compute")


def show_run(run: Run) -> RenderableType:
    """One run: warnings, its summary (or what metrics.jsonl tells), and its links."""
    parts: list[RenderableType] = [Text(f"{run.label}  {run.path}", style="bold")]
    parts.extend(Text(f"! {w}", style="yellow") for w in run.warnings)
    parts.append(_summary_table(run))
    verdict = fidelity.describe(run.summary.get("fidelity"))
    if verdict:
        bad = run.summary["fidelity"].get("fidelity") != fidelity.FAITHFUL
        parts.append(Text("\n".join(verdict), style="yellow" if bad else "green"))
    if run.rows:
        parts.append(time_table([run]))
        parts.append(Text(f"bound by {bottleneck(worker_times(run.rows))}"))
    if run.links:
        parts.append(links_table(run.links, run.regions))
    return Group(*parts)


def _summary_table(run: Run) -> Table:
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    keys = [k for k in _SUMMARY_ORDER if k in run.summary]
    keys += sorted(k for k in run.summary if k not in _SUMMARY_ORDER)  # later additions too
    keys = [k for k in keys if k != "fidelity"]   # show_run's own lines below the table
    for key in keys:
        table.add_row(key, _value(key, run.summary[key]))
    for key, value in _from_metrics(run):
        table.add_row(key, value)
    return table


def _from_metrics(run: Run) -> list[tuple[str, str]]:
    """What the metrics rows say, the only numbers a killed run has."""
    trains, evals = run.series("train_loss"), run.series("eval_loss")
    out = [("rounds recorded", str(run.rounds_done)),
           ("run clock s", _num(run.clock_s, ".2f"))]
    if trains:
        out.append((f"train loss (round {trains[-1].round})", f"{trains[-1].value:.4f}"))
    if evals:
        out.append((f"eval loss (round {evals[-1].round})", f"{evals[-1].value:.4f}"))
    if "bytes_sent_total" not in run.summary:
        out.append(("bytes sent", fmt.nbytes(run.bytes_sent)))
    return out


def _value(key: str, v) -> str:
    if v is None:
        return "-"
    if key.startswith("bytes"):
        return fmt.nbytes(v)
    if isinstance(v, list):
        return _list(v)
    if isinstance(v, float):
        return f"{v:.4f}" if "loss" in key else f"{v:.4g}"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _list(values: list) -> str:
    nums = [v for v in values if fmt.finite(v)]
    if len(values) <= 8 or len(nums) != len(values):
        return ", ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in values)
    return f"{min(nums):.4g} … {max(nums):.4g} ({len(nums)} values)"


def links_table(links: list[dict], regions: tuple[str, ...] = ()) -> Table:
    """Configured against measured (probed) rate and latency, what the link delivered while
    training, and the bytes it moved (and stood for, before compression); a miss is off by
    more than 10 %. ``regions``: each worker's (a placement's), named beside its number."""
    table = Table(title="links", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("link", "configured", "measured", "off by", "training", "latency ms",
                 "measured ms", "bytes moved", ""):
        # a link named by its regions is one line, whatever the other columns need
        table.add_column(name, justify="left" if name in ("link", "") else "right",
                         no_wrap=name == "link")
    for lk in links:
        off, miss = _link_off(lk)
        table.add_row(fmt.link(lk.get("src", "?"), lk.get("dst", "?"), regions),
                      fmt.mbit(lk.get("configured_mbit")), fmt.mbit(lk.get("measured_mbit")),
                      "-" if off is None else f"{off:+.0%}",
                      fmt.mbit(lk.get("training_goodput_mbit")),
                      _num(lk.get("configured_latency_ms", lk.get("latency_ms")), ".1f"),
                      _num(lk.get("measured_latency_ms"), ".1f"), _moved(lk),
                      _link_verdict(off, miss, lk.get("ok")))
    return table


def _moved(lk: dict) -> str:
    """Bytes on the link, and what they stood for when a codec compressed them."""
    if not fmt.finite(lk.get("bytes")):
        return "-"
    raw = lk.get("raw_bytes")
    if fmt.finite(raw) and raw != lk["bytes"]:
        return f"{fmt.nbytes(lk['bytes'])} (of {fmt.nbytes(raw)})"
    return fmt.nbytes(lk["bytes"])


def _link_verdict(off, miss: bool, ok) -> Text:
    if miss:
        return Text("MISS", style="bold red")
    return Text("ok" if off is not None or ok is True else "-")


def _link_off(lk: dict) -> tuple[float | None, bool]:
    """Relative error of the measured rate, and whether the link misses its target."""
    conf, meas = lk.get("configured_mbit"), lk.get("measured_mbit")
    off = (meas - conf) / conf if fmt.finite(conf) and conf > 0 and fmt.finite(meas) else None
    miss = lk.get("ok") is False or (off is not None and abs(off) > LINK_TOLERANCE)
    return off, miss

