"""The pictures of a sweep: eval loss against rounds and time per arm, and the tuning heat map.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gasloc_emu.experiments.spec import (
    ArmResult,
    SweepSpec,
    fmt_value,
    seeds_words,
    short_names,
)
from gasloc_emu.report.compare import matplotlib_figure


def _curve(row: dict, x_axis: str) -> tuple[np.ndarray, np.ndarray]:
    """A data row's eval loss per evaluated round, against rounds or the run clock."""
    pts = [p for p in row["curve"] if p[2] is not None]
    x = [r if x_axis == "round" else (t or 0.0) for r, t, _ in pts]
    return np.array(x, dtype=float), np.array([v for _, _, v in pts], dtype=float)


def plot_sweep(spec: SweepSpec, results: list[ArmResult], path: Path) -> None:
    """Mean eval loss (band: min..max over seeds) per arm, against rounds and run-clock seconds."""
    Figure, FigureCanvasAgg = matplotlib_figure()
    axes_wanted = ("round", "time") if spec.x_axis == "both" else ("round",)
    fig = Figure(figsize=(6.5 * len(axes_wanted), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(1, len(axes_wanted))) if len(axes_wanted) > 1 else [fig.subplots()]
    for res in results:
        for ax, axis in zip(axes, axes_wanted, strict=True):
            curves = [_curve(r, axis) for r in res.runs]
            n = min((len(c[0]) for c in curves), default=0)
            if n == 0:
                continue
            x = np.mean([c[0][:n] for c in curves], axis=0)
            ys = np.array([c[1][:n] for c in curves])
            line, = ax.plot(x, ys.mean(0), label=res.arm.name,
                            linestyle="-" if res.arm.role == "candidate" else "--")
            ax.fill_between(x, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15)
    axes[0].set_xlabel("outer round")
    if len(axes) > 1:
        axes[1].set_xlabel("seconds" + (" (predicted by the simulator)" if spec.mode == "simulate"
                                        else " (wall-clock, emulator)"))
    for ax in axes:
        ax.set_ylabel("eval loss (mean over workers)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(spec.title)
    fig.savefig(path, dpi=110)


def tuning_grid(spec: SweepSpec, res: ArmResult) -> np.ndarray:
    """The search's final eval loss (mean over the tune seeds) over the first two keys of the
    arm's search (rows: the second key's values, columns: the first's), each cell the best over
    the other keys; one row when the arm searched one key; NaN where every run diverged or
    failed."""
    tune = spec.tune_of(res.arm)
    v0 = tune[0][1]
    v1 = tune[1][1] if len(tune) > 1 else (None,)
    cells = np.full((len(v1), len(v0)), np.inf)
    for point, loss in res.tuned.items():
        i, j = (v1.index(point[1]) if len(tune) > 1 else 0), v0.index(point[0])
        cells[i, j] = min(cells[i, j], loss)
    cells[~np.isfinite(cells)] = np.nan
    return cells


def plot_tuning(spec: SweepSpec, results: list[ArmResult], path: Path) -> None:
    """One heat map per arm that searched anything (on the tune seeds): the whole grid, not
    only its best."""
    panels = [res for res in results if spec.tune_of(res.arm)]
    Figure, FigureCanvasAgg = matplotlib_figure()
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax, res in zip(axes, panels, strict=False):
        _heat_map(fig, ax, spec, res)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    # one sweep-wide grid: what each cell is the best over is the same for all, said once
    rest = "" if spec.per_arm else ", ".join(k for k, _ in spec.tune[2:])
    fig.suptitle(f"{spec.title}: final eval loss on tune {seeds_words(spec.tune_seeds)}"
                 + (f", best over {rest}" if rest else ""), fontsize=10)
    fig.savefig(path, dpi=110)


def _heat_map(fig, ax, spec: SweepSpec, res: ArmResult) -> None:
    """One arm's panel: its first key along x, its second (if any) along y."""
    tune = spec.tune_of(res.arm)
    cells = tuning_grid(spec, res)
    from matplotlib import colormaps  # loaded already by matplotlib_figure
    # grey, not the blank background, where every run diverged: its white 'div' must show
    cmap = colormaps["viridis_r"].with_extremes(bad="0.55")
    image = ax.imshow(cells, cmap=cmap, aspect="auto", origin="lower")
    for (i, j), loss in np.ndenumerate(cells):   # white on the dark (high-loss) cells
        dark = np.isnan(loss) or image.norm(loss) > 0.5
        ax.text(j, i, "div" if np.isnan(loss) else f"{loss:.3f}", ha="center", va="center",
                fontsize=7 if len(tune[0][1]) <= 6 else 6, color="white" if dark else "black",
                rotation=0 if len(tune[0][1]) <= 6 else 90)  # many columns: narrow cells
    (k0, v0) = tune[0]
    ax.set_xticks(range(len(v0)), [fmt_value(v) for v in v0],
                  rotation=0 if len(v0) <= 6 else 45, fontsize=8)
    ax.set_xlabel(k0)
    if len(tune) > 1:
        (k1, v1) = tune[1]
        ax.set_yticks(range(len(v1)), [fmt_value(v) for v in v1])
        ax.set_ylabel(k1)
    else:
        ax.set_yticks([])
    rest = ", ".join(short_names(spec.arm_keys(res.arm))[k] for k, _ in tune[2:]) \
        if spec.per_arm else ""
    ax.set_title(res.arm.name + (f"\nbest over {rest}" if rest else ""), fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8)
