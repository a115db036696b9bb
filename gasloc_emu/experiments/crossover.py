"""The crossover map: at a given link rate and step time, which algorithm reaches the target loss
first, and by how much.

A preset's ``[crossover]`` table names its arms (a candidate, the baseline, then any further
candidates, each set against the baseline), a grid of link rates (uniform links, Mbit/s) and
nominal step times (s), and a target loss. The map is made so:

1. one simulation per arm at the grid's fastest point (an evaluation every round) finds its
   rounds to the target;
2. an arm with rounds is synchronous, and the links change when its messages arrive, never what
   they carry, so its loss after round r is the same at every grid point (each grid run checks
   it): every point simulates exactly those rounds, and the clock at the end is its time to the
   target. An arm without rounds (``driver = "pairwise"``: asynchronous pairwise gossip) pairs by
   the links' timing, so its loss differs from point to point: every point simulates up to
   ``BUDGET`` times the probe's steps with an evaluation every step, and its time is that of the
   first evaluation at or below the target;
3. a few points (``check``) run in the emulator too, with real processes over shaped links, for
   the rounds (or steps) the simulator took there, and the measured time and loss are set beside
   the prediction.

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
from gasloc_emu.experiments.engines import LOCAL_WORDS, Engine, LocalEngine, Point
from gasloc_emu.experiments.spec import Arm, arm_config
from gasloc_emu.experiments.sweep import machine


@dataclass(frozen=True)
class CrossoverSpec:
    title: str
    rates_mbit: tuple[float, ...]
    step_times_s: tuple[float, ...]
    target_loss: float
    arms: tuple[Arm, ...]                         # candidate, baseline, further candidates
    checks: tuple[tuple[float, float], ...] = ()  # (rate_mbit, step_time_s) run in the emulator
    seed: int = 0


KIND = "crossover"  # its data file's header kind (``data.write``)
BUDGET = 1.5        # an arm without rounds runs up to this many times its probe's steps
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
    if len(arms) < 2:
        raise C.ConfigError(f"{path}: crossover needs 2 or more [[crossover.arm]] (candidate, "
                            f"baseline, then any further candidates), got {len(arms)}")
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


def point_overrides(rate_mbit: float, step_s: float, rounds: int, eval_every: int = 0) -> dict:
    """A grid point's settings: evaluated at the end only, or every ``eval_every`` rounds."""
    return {"net.bw_profile": "uniform", "net.rate_mbit": rate_mbit, "net.probe": False,
            "compute.step_time_s": step_s, "run.rounds": rounds,
            "run.eval_every": eval_every or rounds}


def first_at_target(row: dict, target: float) -> tuple[int | None, float | None, float | None]:
    """(rounds, time, loss) at the first evaluation at or below ``target``; Nones if never."""
    return next(((int(r), t, v) for r, t, v in row["curve"] if v is not None and v <= target),
                (None, None, None))


def rounds_to_target(row: dict, target: float) -> tuple[int | None, float | None]:
    """(rounds, loss) at the first evaluation at or below ``target``; (None, None) if never."""
    rounds, _, loss = first_at_target(row, target)
    return rounds, loss


def replays_exactly(preset: Path, arm: Arm, seed: int) -> bool:
    """Whether the arm's runs replay to the bit at any link timing, so that one probe times
    it at every grid point (its drive's trait, ``training.drivers``)."""
    # both load torch, which reading results does not
    from gasloc_emu.algorithms import registry
    from gasloc_emu.training.drivers import drive_of
    return drive_of(registry.load(arm_config(preset, arm, seed).algo.name)).replays_exactly


class _Maker:
    """The map's runs, a phase at a time (every arm's probe, every arm's grid, the checks), each
    phase one batch for the engine: its runs do not depend on one another."""

    def __init__(self, preset: Path, spec: CrossoverSpec, out: Path, log,
                 engine: Engine | None = None):
        self.preset, self.spec, self.out, self.log = preset, spec, out, log
        self.engine = engine if engine is not None else LocalEngine(C.EngineConfig(), out)

    def runs(self, requests: list[tuple[Arm, str, dict, str]]) -> list[dict]:
        """The row of each (arm, tag, overrides, mode), in order, made by the engine."""
        points = [Point(arm_config(self.preset, arm, self.spec.seed, overrides),
                        self.out / f"{arm.name}-{tag}", mode)
                  for arm, tag, overrides, mode in requests]
        made = self.engine.run(points, self.log)
        rows = []
        for arm, tag, _, mode in requests:
            row = data.run_row(next(made), arm, mode, self.spec.seed, (), mode)
            last = row["curve"][-1] if row["curve"] else [None, None, None]
            self.log(f"  {arm.name}-{tag}: loss {last[2]}, {last[1]} s")
            rows.append(row | {"tag": tag, "time_s": last[1], "loss": last[2]})
        return rows

    def arms(self, arms: tuple[Arm, ...]) -> list[dict]:
        """Every arm's probe, then the grid of every arm whose probe reached the target; each
        arm's probe row followed by its grid rows."""
        rate, step = self.spec.rates_mbit[-1], self.spec.step_times_s[0]
        timed = {a.name: replays_exactly(self.preset, a, self.spec.seed) for a in arms}
        probes = self.runs([(a, "probe", {"run.eval_every": 1} | _net(rate, step), "simulate")
                            for a in arms])
        probes = [p | {"phase": "probe", "timed": timed[a.name]}
                  for a, p in zip(arms, probes, strict=True)]
        asked = []   # (arm, rate, step, rounds) of every grid point
        for arm, probe in zip(arms, probes, strict=True):
            rounds, _ = rounds_to_target(probe, self.spec.target_loss)
            if rounds is not None:
                budget = rounds if timed[arm.name] else math.ceil(BUDGET * rounds)
                asked += [(arm, r, s, budget) for r in self.spec.rates_mbit
                          for s in self.spec.step_times_s]
        grid = self.points(asked, timed)
        return [r for arm, probe in zip(arms, probes, strict=True)
                for r in [probe, *(g for g in grid if g["arm"] == arm.name)]]

    def checks(self, arms: tuple[Arm, ...], rows: list[dict]) -> list[dict]:
        """The emulator's runs (after every simulation, so that a busy host can be quietened
        for them alone), each for the rounds or steps its grid point took to the target."""
        grid = {(r["arm"], r["rate_mbit"], r["step_time_s"]): r
                for r in rows if r.get("phase") == "grid"}
        asked = [(arm, grid[(arm.name, *point)]) for arm in arms for point in self.spec.checks
                 if grid.get((arm.name, *point), {}).get("rounds_to_target") is not None]
        made = self.runs([(arm, f"{g['rate_mbit']:g}mbit-{g['step_time_s']:g}s-run",
                           point_overrides(g["rate_mbit"], g["step_time_s"], g["rounds"],
                                           g["rounds_to_target"]), "run")
                          for arm, g in asked])
        return [self.check(row, g) for (_, g), row in zip(asked, made, strict=True)]

    def points(self, asked: list[tuple[Arm, float, float, int]], timed: dict) -> list[dict]:
        """Grid points on the simulator: a timed arm for exactly its rounds; an arm without
        rounds for up to its budget of steps, evaluated every step, timed at its target."""
        made = self.runs([(arm, f"{rate:g}mbit-{step:g}s",
                           point_overrides(rate, step, rounds, 0 if timed[arm.name] else 1),
                           "simulate") for arm, rate, step, rounds in asked])
        return [self.point(row, rate, step, rounds, timed[arm.name])
                for (arm, rate, step, rounds), row in zip(asked, made, strict=True)]

    def point(self, row: dict, rate: float, step: float, rounds: int, timed: bool) -> dict:
        """A grid point's row: where it reached the target, for an arm without rounds."""
        if not timed:
            rounds, time_s, loss = first_at_target(row, self.spec.target_loss)
            row |= {"time_s": time_s, "loss": loss}
        return row | {"phase": "grid", "rate_mbit": rate, "step_time_s": step,
                      "rounds_to_target": rounds, "timed": timed}

    def check(self, row: dict, grid: dict) -> dict:
        """A grid point in the emulator, run as long as its simulation was (so that an arm
        without rounds is not timed at its run's end, where neighbours stop pairing), and
        evaluated where that reached the target."""
        n = grid["rounds_to_target"]
        at = next((p for p in row["curve"] if p[0] == n), [n, None, None])
        return row | {"phase": "check", "rate_mbit": grid["rate_mbit"],
                      "step_time_s": grid["step_time_s"], "rounds_to_target": n,
                      "timed": grid["timed"], "time_s": at[1], "loss": at[2]}


def _net(rate: float, step: float) -> dict:
    return {"net.bw_profile": "uniform", "net.rate_mbit": rate, "compute.step_time_s": step}


def run_crossover(preset: str | Path, out: str | Path, log=print,
                  engine: Engine | None = None) -> tuple[dict, list[dict]]:
    """Every run of the map (reusing finished ones), and the data file's header. ``engine``:
    where the runs are made (``engines``; default: one after another in this process)."""
    preset, out = Path(preset), Path(out)
    spec, t0 = load_crossover(preset), time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    maker = _Maker(preset, spec, out, log, engine)
    rows = maker.arms(spec.arms)
    if spec.checks:
        log("emulator checks (timed: keep the host otherwise idle)")
    rows += maker.checks(spec.arms, rows)
    header = {"preset": str(preset), "spec": spec_dict(spec),
              "machine": machine(), "seconds": time.perf_counter() - t0,
              "command": f"gasloc-emu crossover {preset} --report docs/RESULTS.md",
              "engine": maker.engine.describe()}
    return header, rows


def spec_dict(spec: CrossoverSpec) -> dict:
    return {"title": spec.title, "rates_mbit": list(spec.rates_mbit),
            "step_times_s": list(spec.step_times_s), "target_loss": spec.target_loss,
            "arms": [{"name": a.name, "sets": a.sets} for a in spec.arms],
            "checks": [list(c) for c in spec.checks], "seed": spec.seed}


def baseline(spec: dict) -> str:
    return spec["arms"][1]["name"]


def candidates(spec: dict) -> list[str]:
    """Every arm set against the baseline: the first, then those after the baseline."""
    names = [a["name"] for a in spec["arms"]]
    return [names[0], *names[2:]]


def _times(rows: list[dict]) -> dict:
    return {(r["arm"], r["rate_mbit"], r["step_time_s"]): r["time_s"]
            for r in rows if r.get("phase") == "grid"}


def ratio_grid(spec: dict, rows: list[dict], cand: str | None = None) -> np.ndarray:
    """Time to the target of ``cand`` (default the first arm) over the baseline's: rows step
    times, columns rates; NaN where either did not reach it."""
    cand, base, times = cand or candidates(spec)[0], baseline(spec), _times(rows)
    grid = np.full((len(spec["step_times_s"]), len(spec["rates_mbit"])), math.nan)
    for i, step in enumerate(spec["step_times_s"]):
        for j, rate in enumerate(spec["rates_mbit"]):
            a, b = times.get((cand, rate, step)), times.get((base, rate, step))
            if a is not None and b:
                grid[i, j] = a / b
    return grid


def first_grid(spec: dict, rows: list[dict]) -> list[list[str | None]]:
    """Per step time and rate, the arm that reaches the target first (None: no arm does)."""
    times, names = _times(rows), [a["name"] for a in spec["arms"]]
    out = []
    for step in spec["step_times_s"]:
        line = []
        for rate in spec["rates_mbit"]:
            reached = [(times[n, rate, step], n) for n in names
                       if times.get((n, rate, step)) is not None]
            line.append(min(reached)[1] if reached else None)
        out.append(line)
    return out


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


def plot_map(spec: dict, rows: list[dict], path: Path) -> None:
    """One heat map per candidate against the baseline, side by side."""
    from gasloc_emu.report.compare import matplotlib_figure
    Figure, FigureCanvasAgg = matplotlib_figure()
    cands = candidates(spec)
    fig = Figure(figsize=(7.5 * len(cands), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, cand in zip(np.atleast_1d(fig.subplots(1, len(cands))), cands, strict=True):
        _map_panel(fig, ax, spec, ratio_grid(spec, rows, cand), cand)
    fig.suptitle("\n".join(textwrap.wrap(spec["title"], 90 * len(cands))), fontsize=9)
    fig.savefig(path, dpi=110)


def _map_panel(fig, ax, spec: dict, grid: np.ndarray, cand: str) -> None:
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
    fig.colorbar(mesh, ax=ax, label=f"log2 of time to loss {spec['target_loss']:g}: "
                                    f"{cand} / {baseline(spec)}")


def section(header: dict, rows: list[dict]) -> str:
    """The section of docs/RESULTS.md, from the data file alone."""
    spec = header["spec"]
    lines = [f"## {spec['title']}", "",
             f"Command: `{header['command']}`", "",
             _method(spec, rows), ""]
    for cand in candidates(spec):
        grid = ratio_grid(spec, rows, cand)
        lines += [f"Time to eval loss {spec['target_loss']:g} of {cand} over "
                  f"{baseline(spec)}'s, on the simulator's clock (below 1: {cand} first):", "",
                  *_ratio_table(spec, grid), "", _crossing_line(spec, grid, cand), ""]
    if len(spec["arms"]) > 2:
        lines += ["First to the target:", "", *_first_table(spec, rows), ""]
    lines += [f"![crossover](results/{Path(header['preset']).stem}.png)", ""]
    checks = [r for r in rows if r.get("phase") == "check"]
    if checks:
        lines += ["Checked in the emulator (processes over shaped links, for the rounds or steps "
                  "the simulator took to the target there; the time at their end):", "",
                  *_check_table(rows, checks), ""]
    m = header["machine"]
    run_s = sum(r.get("run_wall_s") or 0.0 for r in rows)  # not the last call's: runs resume
    lines.append(f"Machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, torch "
                 f"{m['torch']}, GPU {m['gpu'] or 'none'}; its {len(rows)} runs took "
                 f"{run_s / 60:.1f} min of wall-clock, {header.get('engine', LOCAL_WORDS)}.")
    return "\n".join(lines)


def _method(spec: dict, rows: list[dict]) -> str:
    probes = [r for r in rows if r.get("phase") == "probe"]
    said = "; ".join(_probe_words(r, spec["target_loss"]) for r in probes)
    text = (f"Seed {spec['seed']}. To the target, from one run per arm at "
            f"{spec['rates_mbit'][-1]:g} Mbit/s and {spec['step_times_s'][0]:g} s steps with an "
            f"evaluation every round (every step for an arm without rounds): {said}.")
    if any(r.get("timed", True) for r in probes):
        text += (" Every grid point runs each arm with rounds for exactly those rounds on "
                 "uniform links at the rate, with the nominal step time; " + _same_losses(rows)
                 + " (the links change when messages arrive, never what they carry).")
    for r in probes:
        if not r.get("timed", True):
            text += " " + _to_target_words(r["arm"], rows)
    return text


def _probe_words(row: dict, target: float) -> str:
    n, v = rounds_to_target(row, target)
    unit = "rounds" if row.get("timed", True) else "steps"
    return f"{row['arm']} {n} {unit} (loss {v:.4f})" if n else f"{row['arm']} never"


def _to_target_words(arm: str, rows: list[dict]) -> str:
    """How an arm without rounds was timed, and what it took."""
    grid = [r for r in rows if r.get("phase") == "grid" and r["arm"] == arm]
    took = [r["rounds_to_target"] for r in grid if r["rounds_to_target"] is not None]
    budget = max((r["rounds"] or 0 for r in grid), default=0)
    reach = "it reached it at no point"
    if took:
        span = f"{min(took)}" if min(took) == max(took) else f"{min(took)} to {max(took)}"
        reach = f"it reached the target at {len(took)} of {len(grid)} points, after {span} steps"
    return (f"{arm} has no rounds: its pairings, and so its losses, follow the links' timing, "
            f"so every grid point runs it for {budget} steps with an evaluation every step, "
            f"and its time is that of the first evaluation at or below the target; {reach}.")


def _same_losses(rows: list[dict]) -> str:
    """Whether every timed grid run ended on its probe's loss at that round, as it should."""
    probe = {r["arm"]: {int(n): v for n, _, v in r["curve"]}
             for r in rows if r.get("phase") == "probe"}
    gaps = [abs(r["loss"] - probe[r["arm"]][r["rounds_to_target"]]) for r in rows
            if r.get("phase") == "grid" and r.get("timed", True) and r["loss"] is not None]
    if gaps and max(gaps) == 0.0:
        return "its loss there is the probe's at every point, to the last bit"
    return f"its loss there differs from the probe's by up to {max(gaps, default=0):.2e}"


def _ratio_table(spec: dict, grid: np.ndarray) -> list[str]:
    return _grid_table(spec, [["-" if math.isnan(v) else (f"**{v:.2f}**" if v < 1 else
                                                           f"{v:.2f}") for v in values]
                              for values in grid])


def _first_table(spec: dict, rows: list[dict]) -> list[str]:
    return _grid_table(spec, [[n or "-" for n in names] for names in first_grid(spec, rows)])


def _grid_table(spec: dict, cells: list[list[str]]) -> list[str]:
    """A markdown table over the grid: a row per step time, a column per rate."""
    head = "| step time \\ rate (Mbit/s) | " + " | ".join(f"{r:g}" for r in spec["rates_mbit"])
    out = [head + " |", "| --- " * (len(spec["rates_mbit"]) + 1) + "|"]
    for step, line in zip(spec["step_times_s"], cells, strict=True):
        out.append(f"| {step:g} s | " + " | ".join(line) + " |")
    return out


def _crossing_line(spec: dict, grid: np.ndarray, cand: str) -> str:
    parts = []
    for step, rate in zip(spec["step_times_s"], crossover_rates(spec, grid), strict=True):
        parts.append(f"{step:g} s: " + (f"{rate:.3g} Mbit/s" if rate else "none in the grid"))
    return (f"The crossover line (ratio 1, log-interpolated between grid rates; {cand} first on "
            f"one side, {baseline(spec)} on the other), per step time: " + "; ".join(parts)
            + ".")


def _check_table(rows: list[dict], checks: list[dict]) -> list[str]:
    predicted = {(r["arm"], r["rate_mbit"], r["step_time_s"]): r
                 for r in rows if r.get("phase") == "grid"}
    out = ["| arm | rate (Mbit/s) | step time (s) | rounds or steps | predicted s | measured s "
           "| measured / predicted | loss predicted | loss measured |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in checks:
        p = predicted.get((r["arm"], r["rate_mbit"], r["step_time_s"]), {})
        p_s, m_s = p.get("time_s"), r["time_s"]
        ratio = f"{m_s / p_s:.3f}" if p_s and m_s else "-"
        out.append(f"| {r['arm']} | {r['rate_mbit']:g} | {r['step_time_s']:g} | "
                   f"{r['rounds_to_target']} | {_fmt(p_s, 2)} | {_fmt(m_s, 2)} | {ratio} | "
                   f"{_fmt(p.get('loss'), 4)} | {_fmt(r['loss'], 4)} |")
    return out


def _fmt(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
