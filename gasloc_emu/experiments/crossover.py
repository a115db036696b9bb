"""The crossover map: at a given link rate and step time, which algorithm reaches the target loss
first, and by how much.

A preset's ``[crossover]`` table names two arms (a candidate and a baseline), a grid of link
rates (uniform links, Mbit/s) and nominal step times (s), and a target loss. Rounds here are
synchronous and the links change when messages arrive, never what they carry, so an arm's loss
after round r is the same at every grid point (each grid run checks it). The map is made so:

1. one full simulation per arm finds the rounds to the target (an evaluation every round);
2. at every grid point, each arm is simulated for exactly that many rounds, and the simulator's
   clock at the end is its time to the target;
3. a few points (``check``) run in the emulator too, with real processes over shaped links, and
   their measured time is set beside the prediction.

The data file (docs/results/<name>.jsonl) holds every run; ``section`` rebuilds the section of
docs/RESULTS.md from it alone.
"""
from __future__ import annotations

import math
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gasloc_emu import config as C
from gasloc_emu.experiments import data
from gasloc_emu.experiments.spec import Arm, arm_config
from gasloc_emu.experiments.sweep import machine, run_one


@dataclass(frozen=True)
class CrossoverSpec:
    title: str
    rates_mbit: tuple[float, ...]
    step_times_s: tuple[float, ...]
    target_loss: float
    arms: tuple[Arm, Arm]                         # candidate, baseline
    checks: tuple[tuple[float, float], ...] = ()  # (rate_mbit, step_time_s) run in the emulator
    seed: int = 0


KIND = "crossover"  # its data file's header kind (``data.write``)
_KEYS = {"title", "rates_mbit", "step_times_s", "target_loss", "arm", "check", "seed"}


def load_crossover(path: str | Path) -> CrossoverSpec:
    raw = C.load_toml(path).get("crossover")
    if not isinstance(raw, dict):
        raise C.ConfigError(f"{path}: no [crossover] table")
    unknown = set(raw) - _KEYS
    if unknown:
        raise C.ConfigError(f"{path}: unknown crossover keys {sorted(unknown)}; known: "
                            f"{sorted(_KEYS)}")
    arms = raw.get("arm", [])
    if len(arms) != 2:
        raise C.ConfigError(f"{path}: crossover needs exactly 2 [[crossover.arm]] (candidate, "
                            f"then baseline), got {len(arms)}")
    rates, steps = _positive(path, raw, "rates_mbit"), _positive(path, raw, "step_times_s")
    checks = tuple((float(r), float(s)) for r, s in raw.get("check", []))
    outside = [c for c in checks if c[0] not in rates or c[1] not in steps]
    if outside:  # a check is set beside the grid's prediction at the same point
        raise C.ConfigError(f"{path}: crossover.check points {outside} are not on the grid")
    return CrossoverSpec(raw.get("title", Path(path).stem), rates, steps,
                         float(raw["target_loss"]),
                         tuple(Arm(a["name"], dict(a.get("set", {}))) for a in arms),
                         checks, int(raw.get("seed", 0)))


def _positive(path, raw: dict, key: str) -> tuple[float, ...]:
    values = raw.get(key)
    if not isinstance(values, list) or not values or any(
            not isinstance(v, (int, float)) or v <= 0 for v in values):
        raise C.ConfigError(f"{path}: crossover.{key} = {values!r}; expected a non-empty list "
                            "of numbers > 0")
    return tuple(float(v) for v in values)


def point_overrides(rate_mbit: float, step_s: float, rounds: int) -> dict:
    return {"net.bw_profile": "uniform", "net.rate_mbit": rate_mbit, "net.probe": False,
            "compute.step_time_s": step_s, "run.rounds": rounds, "run.eval_every": rounds}


def rounds_to_target(row: dict, target: float) -> tuple[int | None, float | None]:
    """(rounds, loss) at the first evaluation at or below ``target``; (None, None) if never."""
    return next(((int(r), v) for r, _, v in row["curve"] if v is not None and v <= target),
                (None, None))


class _Maker:
    def __init__(self, preset: Path, spec: CrossoverSpec, out: Path, log):
        self.preset, self.spec, self.out, self.log = preset, spec, out, log

    def run(self, arm: Arm, tag: str, overrides: dict, mode: str) -> dict:
        cfg = arm_config(self.preset, arm, self.spec.seed, overrides)
        d = run_one(cfg, self.out / f"{arm.name}-{tag}", mode)
        row = data.run_row(d, arm, mode, self.spec.seed, (), mode)
        last = row["curve"][-1] if row["curve"] else [None, None, None]
        self.log(f"  {arm.name}-{tag}: loss {last[2]}, {last[1]} s")
        return row | {"tag": tag, "time_s": last[1], "loss": last[2]}

    def arm(self, arm: Arm) -> tuple[list[dict], int | None]:
        """The probe and the grid of one arm, and its rounds to the target."""
        rate, step = self.spec.rates_mbit[-1], self.spec.step_times_s[0]
        probe = self.run(arm, "probe", {"run.eval_every": 1} | _net(rate, step), "simulate")
        rounds, _ = rounds_to_target(probe, self.spec.target_loss)
        rows = [probe | {"phase": "probe"}]
        if rounds is None:
            return rows, None
        for rate in self.spec.rates_mbit:
            for step in self.spec.step_times_s:
                rows.append(self.point(arm, rate, step, rounds, "simulate"))
        return rows, rounds

    def checks(self, arm: Arm, rounds: int | None) -> list[dict]:
        """The emulator's runs (after every simulation, so that a busy host can be quietened
        for them alone)."""
        if rounds is None:
            return []
        return [self.point(arm, rate, step, rounds, "run") for rate, step in self.spec.checks]

    def point(self, arm: Arm, rate: float, step: float, rounds: int, mode: str) -> dict:
        tag = f"{rate:g}mbit-{step:g}s" + ("-run" if mode == "run" else "")
        row = self.run(arm, tag, point_overrides(rate, step, rounds), mode)
        return row | {"phase": "check" if mode == "run" else "grid", "rate_mbit": rate,
                      "step_time_s": step, "rounds_to_target": rounds}


def _net(rate: float, step: float) -> dict:
    return {"net.bw_profile": "uniform", "net.rate_mbit": rate, "compute.step_time_s": step}


def run_crossover(preset: str | Path, out: str | Path, log=print) -> tuple[dict, list[dict]]:
    """Every run of the map (reusing finished ones), and the data file's header."""
    preset, out = Path(preset), Path(out)
    spec, t0 = load_crossover(preset), time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    maker = _Maker(preset, spec, out, log)
    made = [maker.arm(arm) for arm in spec.arms]
    rows = [r for arm_rows, _ in made for r in arm_rows]
    if spec.checks:
        log("emulator checks (timed: keep the host otherwise idle)")
    rows += [r for arm, (_, n) in zip(spec.arms, made, strict=True) for r in maker.checks(arm, n)]
    header = {"preset": str(preset), "spec": spec_dict(spec),
              "machine": machine(), "seconds": time.perf_counter() - t0,
              "command": f"gasloc-emu crossover {preset} --report docs/RESULTS.md"}
    return header, rows


def spec_dict(spec: CrossoverSpec) -> dict:
    return {"title": spec.title, "rates_mbit": list(spec.rates_mbit),
            "step_times_s": list(spec.step_times_s), "target_loss": spec.target_loss,
            "arms": [{"name": a.name, "sets": a.sets} for a in spec.arms],
            "checks": [list(c) for c in spec.checks], "seed": spec.seed}


def ratio_grid(spec: dict, rows: list[dict]) -> np.ndarray:
    """Time to the target of the candidate over the baseline's: rows step times, columns
    rates; NaN where either did not reach it."""
    cand, base = (a["name"] for a in spec["arms"])
    times = {(r["arm"], r["rate_mbit"], r["step_time_s"]): r["time_s"]
             for r in rows if r.get("phase") == "grid"}
    grid = np.full((len(spec["step_times_s"]), len(spec["rates_mbit"])), math.nan)
    for i, step in enumerate(spec["step_times_s"]):
        for j, rate in enumerate(spec["rates_mbit"]):
            a, b = times.get((cand, rate, step)), times.get((base, rate, step))
            if a is not None and b:
                grid[i, j] = a / b
    return grid


def crossover_rates(spec: dict, grid: np.ndarray) -> list[float | None]:
    """Per step time, the link rate (log-interpolated) where the ratio crosses 1, None when
    it does not within the grid."""
    rates = np.log10(spec["rates_mbit"])
    out = []
    for row in grid:
        cross = None
        for j in range(len(row) - 1):
            a, b = row[j] - 1.0, row[j + 1] - 1.0
            if np.isfinite(a) and np.isfinite(b) and a * b <= 0 and a != b:
                cross = float(10 ** (rates[j] + (rates[j + 1] - rates[j]) * a / (a - b)))
                break
        out.append(cross)
    return out


def plot_map(spec: dict, grid: np.ndarray, path: Path) -> None:
    from gasloc_emu.report.compare import matplotlib_figure
    Figure, FigureCanvasAgg = matplotlib_figure()
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    x, y = np.log10(spec["rates_mbit"]), np.log10(spec["step_times_s"])
    mesh = ax.pcolormesh(x, y, np.log2(grid), cmap="RdBu_r", vmin=-2, vmax=2, shading="nearest")
    if np.nanmin(grid) < 1 < np.nanmax(grid):
        ax.contour(x, y, grid, levels=[1.0], colors="black", linewidths=1.5)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            ax.text(x[j], y[i], "-" if math.isnan(grid[i, j]) else f"{grid[i, j]:.2f}",
                    ha="center", va="center", fontsize=8)
    ax.set_xticks(x, [f"{r:g}" for r in spec["rates_mbit"]])
    ax.set_yticks(y, [f"{s:g}" for s in spec["step_times_s"]])
    ax.set_xlabel("link rate (Mbit/s, every link)")
    ax.set_ylabel("step time (s)")
    cand, base = (a["name"] for a in spec["arms"])
    fig.colorbar(mesh, ax=ax, label=f"log2 of time to loss {spec['target_loss']:g}: "
                                    f"{cand} / {base}")
    ax.set_title("\n".join(textwrap.wrap(spec["title"], 90)), fontsize=9)
    fig.savefig(path, dpi=110)


def section(header: dict, rows: list[dict]) -> str:
    """The section of docs/RESULTS.md, from the data file alone."""
    spec = header["spec"]
    grid = ratio_grid(spec, rows)
    cand, base = (a["name"] for a in spec["arms"])
    lines = [f"## {spec['title']}", "",
             f"Command: `{header['command']}`", "",
             _method(spec, rows), "",
             f"Time to eval loss {spec['target_loss']:g} of {cand} over {base}'s, on the "
             "simulator's clock (below 1: " + cand + " first):", "",
             *_ratio_table(spec, grid), "",
             f"![crossover](results/{Path(header['preset']).stem}.png)", "",
             _crossing_line(spec, grid), ""]
    checks = [r for r in rows if r.get("phase") == "check"]
    if checks:
        lines += ["Checked in the emulator (processes over shaped links; the time at the end of "
                  "the target round):", "", *_check_table(rows, checks), ""]
    m = header["machine"]
    lines.append(f"Machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, torch "
                 f"{m['torch']}, GPU {m['gpu'] or 'none'}; its {len(rows)} runs took "
                 f"{header['seconds'] / 60:.1f} min of wall-clock.")
    return "\n".join(lines)


def _method(spec: dict, rows: list[dict]) -> str:
    probes = {r["arm"]: rounds_to_target(r, spec["target_loss"])
              for r in rows if r.get("phase") == "probe"}
    said = "; ".join(f"{arm} {n} rounds (loss {v:.4f})" if n else f"{arm} never"
                     for arm, (n, v) in probes.items())
    return (f"Seed {spec['seed']}. Rounds to the target, from one run per arm with an "
            f"evaluation every round: {said}. Every grid point runs each arm for exactly "
            "those rounds on uniform links at the rate, with the nominal step time; "
            + _same_losses(rows) + " (the links change when messages arrive, never what they "
            "carry).")


def _same_losses(rows: list[dict]) -> str:
    """Whether every grid run ended on its probe's loss at that round, as it should."""
    probe = {r["arm"]: {int(n): v for n, _, v in r["curve"]}
             for r in rows if r.get("phase") == "probe"}
    gaps = [abs(r["loss"] - probe[r["arm"]][r["rounds_to_target"]])
            for r in rows if r.get("phase") == "grid" and r["loss"] is not None]
    if gaps and max(gaps) == 0.0:
        return "its loss there is the probe's at every point, to the last bit"
    return f"its loss there differs from the probe's by up to {max(gaps, default=0):.2e}"


def _ratio_table(spec: dict, grid: np.ndarray) -> list[str]:
    head = "| step time \\ rate (Mbit/s) | " + " | ".join(f"{r:g}" for r in spec["rates_mbit"])
    rows = [head + " |", "| --- " * (len(spec["rates_mbit"]) + 1) + "|"]
    for step, values in zip(spec["step_times_s"], grid, strict=True):
        cells = ["-" if math.isnan(v) else (f"**{v:.2f}**" if v < 1 else f"{v:.2f}")
                 for v in values]
        rows.append(f"| {step:g} s | " + " | ".join(cells) + " |")
    return rows


def _crossing_line(spec: dict, grid: np.ndarray) -> str:
    cand, base = (a["name"] for a in spec["arms"])
    parts = []
    for step, rate in zip(spec["step_times_s"], crossover_rates(spec, grid), strict=True):
        parts.append(f"{step:g} s: " + (f"{rate:.3g} Mbit/s" if rate else "none in the grid"))
    return (f"The crossover line (ratio 1, log-interpolated between grid rates; {cand} first on "
            f"one side, {base} on the other), per step time: " + "; ".join(parts) + ".")


def _check_table(rows: list[dict], checks: list[dict]) -> list[str]:
    predicted = {(r["arm"], r["rate_mbit"], r["step_time_s"]): r["time_s"]
                 for r in rows if r.get("phase") == "grid"}
    out = ["| arm | rate (Mbit/s) | step time (s) | predicted s | measured s | measured / "
           "predicted |", "| --- | --- | --- | --- | --- | --- |"]
    for r in checks:
        p = predicted.get((r["arm"], r["rate_mbit"], r["step_time_s"]))
        ratio = f"{r['time_s'] / p:.3f}" if p and r["time_s"] else "-"
        out.append(f"| {r['arm']} | {r['rate_mbit']:g} | {r['step_time_s']:g} | "
                   f"{p if p is None else round(p, 2)} | "
                   f"{r['time_s'] if r['time_s'] is None else round(r['time_s'], 2)} | {ratio} |")
    return out
