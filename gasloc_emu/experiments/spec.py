"""An experiment preset (`runs/*.toml` with a `[sweep]` table): its arms, seeds and tuning grid,
checked when read; the config of one run of an arm; the labels of grid points.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from gasloc_emu import config as C


@dataclass(frozen=True)
class Arm:
    name: str
    sets: dict
    group: str = ""
    role: str = ""  # "candidate" (GASLoC) or "baseline"; drives the verdict
    tune: tuple = ()  # ((key, values), ...): the arm's own grid; () means the sweep-wide one


@dataclass(frozen=True)
class SweepSpec:
    title: str
    claim: str
    mode: str
    seeds: tuple
    arms: tuple
    tune_key: str = ""
    tune_values: tuple = ()
    target_loss: float | None = None
    verdict: str = "beats"
    tolerance: float = 0.02
    x_axis: str = "round"  # "both": also plot and tabulate against seconds
    tune: tuple = ()  # ((key, values), ...): the searched grid, tune_key/values or [sweep.tune]
    equal_budget: bool = False  # every arm's search has as many points (checked by load_spec)
    # the search runs on these seeds, never reported: a setting tuned on a reported seed
    # would favour the arm on that seed
    tune_seeds: tuple = (100,)
    # a verdict whose paired difference is under two standard deviations gets this many seeds
    close_seeds: int = 5
    # run mode: each reported run is also simulated with the same config, and the simulator's
    # predicted time stands beside the measured one
    predict: bool = False

    @property
    def tune_keys(self) -> tuple[str, ...]:
        """The sweep-wide grid's keys (an arm with its own grid: ``arm_keys``)."""
        return tuple(k for k, _ in self.tune)

    @property
    def per_arm(self) -> bool:
        """Whether some arm searches its own grid instead of the sweep-wide one."""
        return any(a.tune for a in self.arms)

    def tune_of(self, arm: Arm | None = None) -> tuple:
        """The grid this arm searches: its own, else the sweep-wide one."""
        return arm.tune if arm is not None and arm.tune else self.tune

    def arm_keys(self, arm: Arm | None = None) -> tuple[str, ...]:
        return tuple(k for k, _ in self.tune_of(arm))

    def grid(self, arm: Arm | None = None) -> list[tuple]:
        """Every point of the arm's search (the sweep-wide one without an arm), as a tuple of
        values in ``arm_keys`` order; [()] when nothing is searched."""
        return list(itertools.product(*(values for _, values in self.tune_of(arm))))

    def settings(self, point: tuple, arm: Arm | None = None) -> dict:
        return dict(zip(self.arm_keys(arm), point, strict=True))


_SPEC_KEYS = {"title", "claim", "mode", "seeds", "arm", "tune_key", "tune_values", "target_loss",
              "verdict", "tolerance", "x_axis", "tune", "equal_budget", "tune_seeds",
              "close_seeds", "predict"}


_ARM_KEYS = {"name", "group", "role", "set", "tune"}


def load_spec(path: str | Path) -> SweepSpec:
    tree = C.load_toml(path)
    raw = tree.get("sweep")
    if not isinstance(raw, dict) or not raw.get("arm"):
        raise C.ConfigError(f"{path}: no [sweep] table with [[sweep.arm]] entries")
    unknown = set(raw) - _SPEC_KEYS
    if unknown:
        raise C.ConfigError(f"{path}: unknown sweep keys {sorted(unknown)}; "
                            f"known: {sorted(_SPEC_KEYS)}")
    if raw.get("mode", "simulate") not in ("simulate", "run"):
        raise C.ConfigError(f"sweep.mode = {raw['mode']!r}; expected 'simulate' or 'run'")
    if raw.get("predict", False) not in (False, True) or (raw.get("predict")
                                                           and raw.get("mode") != "run"):
        raise C.ConfigError(f"{path}: sweep.predict = {raw['predict']!r}; expected true (with "
                            "mode = 'run': simulate each run beside it) or false")
    if not isinstance(raw.get("equal_budget", False), bool):
        raise C.ConfigError(f"{path}: sweep.equal_budget = {raw['equal_budget']!r}; expected "
                            "true or false")
    spec = SweepSpec(raw.get("title", Path(path).stem), raw.get("claim", ""),
                     raw.get("mode", "simulate"), tuple(raw.get("seeds", [0, 1, 2])),
                     tuple(_arm(path, a) for a in raw["arm"]),
                     raw.get("tune_key", ""), tuple(raw.get("tune_values", ())),
                     raw.get("target_loss"), raw.get("verdict", "beats"),
                     float(raw.get("tolerance", 0.02)), raw.get("x_axis", "round"),
                     _tune(path, raw), raw.get("equal_budget", False),
                     tuple(raw.get("tune_seeds", (100,))), int(raw.get("close_seeds", 5)),
                     bool(raw.get("predict", False)))
    reused = sorted(set(spec.tune_seeds) & set(spec.seeds))
    if reused:
        raise C.ConfigError(f"{path}: sweep.tune_seeds {list(spec.tune_seeds)} share {reused} "
                            f"with sweep.seeds {list(spec.seeds)}; tune on seeds never reported")
    if spec.equal_budget:
        _check_equal_budget(path, spec)
    return spec


def _arm(path, raw: dict) -> Arm:
    unknown = set(raw) - _ARM_KEYS
    if unknown:  # a misspelt 'tune' would otherwise quietly fall back to the sweep-wide grid
        raise C.ConfigError(f"{path}: sweep.arm {raw.get('name')!r}: unknown keys "
                            f"{sorted(unknown)}; known: {sorted(_ARM_KEYS)}")
    arm = Arm(raw["name"], dict(raw.get("set", {})), raw.get("group", ""), raw.get("role", ""),
              _grid_table(path, f"sweep.arm {raw['name']!r} tune", raw["tune"])
              if "tune" in raw else ())
    both = sorted(set(arm.sets) & {k for k, _ in arm.tune})
    if both:  # the searched value would silently override the set one
        raise C.ConfigError(f"{path}: sweep.arm {arm.name!r} both sets and searches {both}")
    return arm


def _tune(path, raw: dict) -> tuple:
    """The searched grid: [sweep.tune] (several keys), or tune_key with tune_values (one)."""
    table = raw.get("tune")
    if table is not None and raw.get("tune_key"):
        raise C.ConfigError(f"{path}: give either [sweep.tune] or tune_key/tune_values, not both")
    if table is None:
        key, values = raw.get("tune_key", ""), tuple(raw.get("tune_values", ()))
        return ((key, values),) if key and values else ()
    return _grid_table(path, "sweep.tune", table)


def _grid_table(path, where: str, table) -> tuple:
    """A ``{ key = [values], ... }`` table as ((key, values), ...), in the table's order."""
    if not isinstance(table, dict) or not table:
        raise C.ConfigError(f"{path}: {where} must be a table of key = [values]")
    for key, values in table.items():
        if not isinstance(values, list) or not values:
            raise C.ConfigError(f"{path}: {where}.{key} = {values!r}; expected a non-empty "
                                "list of values")
    return tuple((k, tuple(v)) for k, v in table.items())


def _check_equal_budget(path, spec: SweepSpec) -> None:
    """equal_budget: a search with more points is a better-tuned arm, so the comparison would
    be unfair; every arm's seed-0 search must have as many runs."""
    sizes = {a.name: len(spec.grid(a)) for a in spec.arms}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in sizes.items())
        raise C.ConfigError(f"{path}: sweep.equal_budget = true but the arms' searches differ "
                            f"in size (grid points: {listed})")


def arm_config(preset: str | Path, arm: Arm, seed: int, extra: dict | None = None) -> C.Config:
    """The preset's config with the arm's settings, the seed and tuned values applied."""
    overrides = dict(arm.sets) | {"seed": seed} | (extra or {})
    return C.resolve(preset, overrides)


def point_tag(point: tuple, keys: tuple = ()) -> str:
    """A grid point in a run folder's name: '-0.001' (one key, as before grids), '-0.5-auto';
    with keys (an arm's own grid) '-outer_lr=0.5-lr=0.002'."""
    if not keys:
        return "".join(f"-{fmt_value(v)}" for v in point)
    names = short_names(keys)
    return "".join(f"-{names[k]}={fmt_value(v)}" for k, v in zip(keys, point, strict=True))


def short_names(keys) -> dict[str, str]:
    """Keys without their 'algo.inner.'/'algo.' prefix ('algo.inner.lr' -> 'lr'), except where
    two keys would then read the same: those keep their full names."""
    short = {k: k.removeprefix("algo.inner.").removeprefix("algo.") for k in keys}
    clashes = {s for s in short.values() if list(short.values()).count(s) > 1}
    return {k: k if s in clashes else s for k, s in short.items()}


def point_label(point: tuple) -> str:
    """A grid point in tables and results.json: '0.001', or '0.5, auto' for several keys."""
    return ", ".join(fmt_value(v) for v in point) if point else "-"


def point_value(point: tuple):
    """What results.json keeps as the best: the value itself for one key, a list for several."""
    if not point:
        return None
    return point[0] if len(point) == 1 else list(point)


def seeds_words(seeds) -> str:
    """'seed 100', or 'seeds [100, 101] (mean)' for a search on several seeds."""
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {list(seeds)} (mean)"


def fmt_value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def spec_from_dict(d: dict) -> SweepSpec:
    """The spec a data file's header keeps (``spec_dict``), as the sweep had it."""
    d = dict(d)
    arms = tuple(Arm(a["name"], dict(a["sets"]), a["group"], a["role"], _frozen(a["tune"]))
                 for a in d.pop("arms"))
    tuples = {k: tuple(d[k]) for k in ("seeds", "tune_values", "tune_seeds")}
    return SweepSpec(**d | tuples | {"arms": arms, "tune": _frozen(d["tune"])})


def spec_dict(spec: SweepSpec) -> dict:
    """The spec as JSON keeps it (``spec_from_dict`` reads it back)."""
    d = dict(spec.__dict__)
    d["arms"] = [dict(a.__dict__) for a in spec.arms]
    return d


def _frozen(tune) -> tuple:
    return tuple((k, tuple(v)) for k, v in tune or ())


@dataclass
class ArmResult:
    """One arm's runs as the data file has them: its search (``tuning``, on the tune seeds),
    the mean final eval loss of each grid point over those seeds, the best point, and the runs
    of the reported seeds with it (``runs``)."""

    arm: Arm
    tuned: dict = field(default_factory=dict)       # grid point -> mean tune-seed final loss
    best: object = None
    runs: list = field(default_factory=list)        # data rows of the reported seeds
    tuning: list = field(default_factory=list)      # data rows of the search
