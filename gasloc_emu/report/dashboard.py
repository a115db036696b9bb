"""Live terminal dashboard: an accumulator of progress events, a pure render of its snapshot,
and a rich ``Live`` view that redraws on a timer (used only on a TTY).

Events are dicts, fed one at a time to ``DashboardState.update`` (O(1) work each, so feeding
never slows training):

    metric rows   as in metrics.jsonl (no 'kind', or kind='metric'); with the compute model's
                  steps, speed, overruns and overrun_ratio where the worker reports them
    status rows   {kind: 'status', worker, state, peer, round, device, dropped, drop_reasons,
                  and optionally speed, round_steps, wait_share}; state is one of computing,
                  sending, waiting, done, failed; drop_reasons is the worker's cumulative
                  {reason: count} of dropped data-plane messages
    control drops {kind: 'control_drops', drops: {reason: count}} (the launcher's, cumulative)
    link rows     {kind: 'links', links: [{src, dst, configured_mbit, bytes, mbit_now,
                  training_goodput_mbit}, ...]}
    warning rows  {kind: 'warning', text}
    event rows    {kind: 'event', text} (a scenario's event fired; shown with the warnings)
    summary row   {kind: 'summary', ...summary.json keys} (final consensus and eval loss)


``render(state.snapshot(now))`` is a pure function of the snapshot, so it is tested against
golden text and never sees a half-updated state.
"""
from __future__ import annotations

import heapq
from collections import Counter

from rich import box, get_console
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gasloc_emu.report import fmt
from gasloc_emu.report.dashboard_state import (
    DashboardState,
    Header,
    Snapshot,
    WorkerView,
    worker_rank,
)

_SPARK = "▁▂▃▄▅▆▇█"

_STATE_STYLE = {"failed": "bold red", "waiting": "yellow", "done": "green", "sending": "cyan"}


def render(snap: Snapshot, max_workers: int = 16) -> RenderableType:
    """The whole dashboard for one snapshot."""
    parts: list[RenderableType] = [_header_text(snap), _workers_table(snap, max_workers)]
    if snap.links:
        parts.append(_links_table(snap))
    parts.append(_global_text(snap))
    if snap.drops is not None or snap.control_drops:
        parts.append(_drops_text(snap))
    if snap.uncommitted:
        parts.append(_uncommitted_text(snap.uncommitted))
    if snap.warnings:
        parts.append(_warnings_text(snap.warnings))
    spaced: list[RenderableType] = []
    for part in parts:  # a blank line between sections keeps the tables apart
        spaced.extend((Text(""), part) if spaced else (part,))
    return Group(*spaced)


def _header_text(snap: Snapshot) -> Text:
    h = snap.header
    spectral = ", ".join(f"{sym} {v:.3f}" for sym, v in (("λ₂", h.lambda2), ("γ", h.gamma))
                         if v is not None)
    graph = f"{h.topology} ({spectral})" if spectral else h.topology
    done = min((w.round for w in snap.workers), default=0)
    text = Text()
    text.append(h.algorithm, style="bold")
    text.append(f" on {graph} · profile {h.profile} · shaper {h.shaper} · "
                + (f"compute {h.compute} · " if h.compute else "")
                + f"{h.workers} workers · round {done}/{h.rounds}\n")
    text.append(f"elapsed {_duration(snap.elapsed_s)} · ETA {_duration(snap.eta_s)}"
                + (f" · run clock {snap.clock_s:.2f}s" if snap.clock_s is not None else "")
                + (f" · time scale K {h.time_scale:g}" if h.time_scale > 1 else ""))
    if snap.fidelity is not None:
        text.append("\nfidelity: ")
        text.append(snap.fidelity, style="green" if snap.faithful else "bold yellow")
    return text


def _workers_table(snap: Snapshot, max_rows: int) -> Table:
    shown = _workers_shown(snap.workers, max_rows)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  caption=_hidden_line(snap, shown))
    # the compute columns only when some worker reports its speed (older producers do not)
    timed = any(w.speed is not None for w in snap.workers)
    for name, just in (("worker", "right"), ("device", "left"), ("round", "right"),
                       ("step", "right"), *(_COMPUTE_COLUMNS if timed else ()),
                       ("train loss", "right"), ("tokens/s", "right"), ("state", "left")):
        table.add_column(name, justify=just)
    for w in shown:
        table.add_row(str(w.rank), w.device or "-", f"{w.round}/{snap.header.rounds}",
                      str(w.step), *(_compute_cells(w) if timed else ()), _loss(w.train_loss),
                      fmt.count(w.tokens_per_s),
                      Text(_state(w), style=_STATE_STYLE.get(w.state, "")))
    return table


_COMPUTE_COLUMNS = (("speed", "right"), ("steps/round", "right"), ("waiting", "right"))


def _compute_cells(w: WorkerView) -> tuple[str, str, str]:
    return (f"{w.speed:.2f}" if fmt.finite(w.speed) else "-",
            "-" if w.round_steps is None else str(w.round_steps),
            f"{100 * w.wait_share:.0f} %" if fmt.finite(w.wait_share) else "-")


def _hidden_line(snap: Snapshot, shown: list[WorkerView]) -> str | None:
    """One summary line for the workers without a row (the furthest behind have rows): how
    many, their rounds, their train losses and their states."""
    ranks = {w.rank for w in shown}
    rest = [w for w in snap.workers if w.rank not in ranks]
    if not rest:
        return None
    rounds = sorted({w.round for w in rest})
    span = f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {rounds[0]}-{rounds[-1]}"
    losses = [w.train_loss for w in rest if fmt.finite(w.train_loss)]
    loss = f", train loss {min(losses):.4f}-{max(losses):.4f}" if losses else ""
    states = ", ".join(f"{n} {state}" for state, n in
                       sorted(Counter(w.state or "-" for w in rest).items()))
    return (f"{len(rest)} more workers (the furthest behind have rows): {span}{loss}; "
            f"{states}")


def _workers_shown(workers: tuple[WorkerView, ...], max_rows: int) -> list[WorkerView]:
    """All workers, or when there are many the ones furthest behind, in rank order."""
    if len(workers) <= max_rows:
        return list(workers)
    behind = heapq.nsmallest(max_rows, workers, key=lambda w: (w.round, w.step, w.rank))
    return sorted(behind, key=worker_rank)


def _state(w: WorkerView) -> str:
    if w.peer is None:
        return w.state
    if w.state == "waiting":
        return f"waiting for peer {w.peer}"
    if w.state == "sending":
        return f"sending to peer {w.peer}"
    return w.state


def _links_table(snap: Snapshot) -> Table:
    title = (f"links ({len(snap.links)} of {snap.links_in_use}, longest at their rate)"
             if snap.links_in_use > len(snap.links) else "links (longest at their rate first)")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False)
    tcp = any(lk.rtt_ms is not None for lk in snap.links)   # sampled senders (tc runs)
    names = ("link", "configured", "sending at", "last 3 s", "moved", "busy",
             *(("rtt", "retrans") if tcp else ()), "")
    for name in names:
        # a link named by its regions is one line, whatever the other columns need
        table.add_column(name, justify="left" if name in ("link", "") else "right",
                         no_wrap=name == "link")
    for lk in snap.links:
        busy = f"{lk.busy_s:.1f} s" if lk.configured_mbit else "-"
        kernel = (_ms(lk.rtt_ms), "-" if lk.retrans_segs is None else str(lk.retrans_segs))
        table.add_row(fmt.link(lk.src, lk.dst, snap.header.regions), fmt.mbit(lk.configured_mbit),
                      fmt.mbit(lk.sending_mbit), fmt.mbit(lk.mbit_now), fmt.nbytes(lk.bytes),
                      busy, *(kernel if tcp else ()), f"{lk.dst} waits" if lk.waited else "")
    return table


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def _global_text(snap: Snapshot) -> Text:
    parts = [f"train loss {_loss(snap.train_mean)} ± {_loss(snap.train_std)}"]
    if snap.eval_loss is not None:
        parts.append(f"eval loss {_loss(snap.eval_loss)} (round {snap.eval_round})")
    if snap.final_eval_loss is not None:
        parts.append(f"final eval (average model) {_loss(snap.final_eval_loss)}")
    if snap.consensus is not None:
        parts.append(f"consensus {snap.consensus:.4g}")
    text = Text("  ".join(parts))
    if snap.train_history:
        text.append(f"\ntrain {sparkline(snap.train_history)}  "
                    f"{_loss(snap.train_history[0])} → {_loss(snap.train_history[-1])}")
    if snap.eval_history:
        text.append(f"\neval  {sparkline(snap.eval_history)}  "
                    f"{_loss(snap.eval_history[0])} → {_loss(snap.eval_history[-1])}")
    return text


def _drops_text(snap: Snapshot, top: int = 3) -> Text:
    """One line: messages dropped on the data plane (by the workers) and on the control plane
    (by the launcher), each with its most frequent reasons. Zero is shown too: it is news."""
    parts = []
    if snap.drops is not None:
        parts.append(f"{snap.drops} data-plane{_reasons(snap.drop_reasons, top)}")
    control = sum(n for _, n in snap.control_drops)
    parts.append(f"{control} control{_reasons(snap.control_drops, top)}")
    return Text("dropped " + " · ".join(parts),
                style="yellow" if snap.drops or control else "")


def _uncommitted_text(rounds: tuple[tuple[int, int], ...], top: int = 4) -> Text:
    """One line: the rounds workers did not commit (their inner steps discarded, θ back at
    the anchor: docs/ALGORITHM.md, "DiLoCo's elastic quorum"), the latest first."""
    latest = ", ".join(f"worker {w} round {r + 1}" for w, r in reversed(rounds[-top:]))
    more = f", {len(rounds) - top} more" if len(rounds) > top else ""
    return Text(f"not committed: {len(rounds)} worker-round(s) ({latest}{more})",
                style="bold red")


def _reasons(counts: tuple[tuple[str, int], ...], top: int) -> str:
    if not counts:
        return ""
    shown = ", ".join(f"{reason} {n}" for reason, n in counts[:top])
    more = f", +{len(counts) - top} more" if len(counts) > top else ""
    return f" ({shown}{more})"


def _warnings_text(warnings: tuple[str, ...]) -> Text:
    text = Text()
    for i, w in enumerate(warnings):
        text.append(("\n" if i else "") + f"! {w}", style="yellow")
    return text


def sparkline(values, width: int = 40) -> str:
    """The last ``width`` values as unicode blocks, scaled between their min and max."""
    vals = [v for v in list(values)[-width:] if fmt.finite(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    if hi - lo < 1e-12:
        return _SPARK[len(_SPARK) // 2] * len(vals)
    top = len(_SPARK) - 1
    return "".join(_SPARK[round((v - lo) / (hi - lo) * top)] for v in vals)


def _loss(v) -> str:
    return f"{v:.4f}" if fmt.finite(v) else "-"


def _duration(s) -> str:
    if not fmt.finite(s):
        return "-"
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class LiveView:
    """Progress callback for a TTY: ``view(row)`` only feeds the state (O(1)); a rich Live
    redraws from a snapshot on its own timer at ``refresh_hz``, never once per row."""

    def __init__(self, header: Header | dict, console=None, refresh_hz: float = 4.0):
        self.state, self.console = DashboardState(header), console
        self._live = Live(console=console, refresh_per_second=refresh_hz, auto_refresh=True,
                          get_renderable=self._renderable, transient=False)

    def _renderable(self) -> RenderableType:
        # as many worker rows as the terminal has lines to spare (the other sections take
        # about 30); the rest are summed up in one line
        rows = max(4, min(64, (self.console or get_console()).size.height - 30))
        return render(self.state.snapshot(), max_workers=rows)

    def __call__(self, row: dict) -> None:
        self.state.update(row)

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        self._live.stop()  # draws the final state once more and leaves it on screen
