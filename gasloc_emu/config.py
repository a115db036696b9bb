"""One typed config tree: frozen dataclasses, a docstring per field, validated at construction.

Precedence is defaults < TOML file < CLI flags < ``--set section.key=value``. Every field
carries its documentation and its allowed range in ``dataclasses.field(metadata=...)`` so
that validation, error messages and ``gasloc-emu config --help-fields`` share one source.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type or out of range."""


def F(default: Any, doc: str, *, lo: float | None = None, hi: float | None = None,
      choices: tuple | None = None) -> Any:
    """A documented field; ``lo``/``hi`` are inclusive bounds, ``choices`` the allowed values."""
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _allowed(meta: dict) -> str:
    if meta["choices"]:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    lo, hi = meta["lo"], meta["hi"]
    return f"a value in [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"


def _check_value(key: str, value: Any, meta: dict) -> None:
    items = value if isinstance(value, tuple) else (value,)
    for v in items:
        if meta["choices"] and v not in meta["choices"]:
            raise ConfigError(f"{key} = {value!r} is not allowed; expected {_allowed(meta)}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            bad = (isinstance(v, float) and not math.isfinite(v)) \
                or (meta["lo"] is not None and v < meta["lo"]) \
                or (meta["hi"] is not None and v > meta["hi"])
            if bad:
                raise ConfigError(f"{key} = {value!r} is out of range; expected {_allowed(meta)}")


class _Validated:
    """Mixin: check every field against its metadata when the dataclass is built."""

    _section = ""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            if f.metadata:
                _check_value(f"{self._section}{f.name}", getattr(self, f.name), dict(f.metadata))
        self._check()

    def _check(self) -> None:
        """Cross-field checks; overridden where a section has them."""


@dataclass(frozen=True)
class ModelConfig(_Validated):
    _section = "model."
    preset: str = F("tiny", "Named size: tiny (~0.1M params, CI), small (~1M), gpt2 (124M, GPU).",
                    choices=("tiny", "small", "gpt2"))
    n_layer: int = F(0, "Transformer blocks; 0 takes the preset's value.", lo=0, hi=96)
    n_head: int = F(0, "Attention heads; 0 takes the preset's value.", lo=0, hi=64)
    n_embd: int = F(0, "Embedding width; 0 takes the preset's value.", lo=0, hi=8192)
    block_size: int = F(0, "Context length in tokens; 0 takes the preset's value.", lo=0, hi=8192)
    vocab_size: int = F(0, "Vocabulary; 0 takes the preset's (256 byte tokens; 50304 for gpt2).",
                        lo=0, hi=1 << 20)
    dropout: float = F(0.0, "Dropout probability (0 keeps runs deterministic).", lo=0.0, hi=0.9)


@dataclass(frozen=True)
class DataConfig(_Validated):
    _section = "data."
    path: str = F("", "Text file, folder of text files, or .bin file of uint16 tokens; "
                      "empty uses the running Python's standard library sources.")
    batch_size: int = F(8, "Sequences per inner step per worker.", lo=1, hi=4096)
    val_fraction: float = F(0.05, "Share of the corpus held out for evaluation.", lo=0.001, hi=0.5)
    eval_batches: int = F(8, "Batches of the validation split per evaluation.", lo=1, hi=10000)
    max_corpus_mb: float = F(8.0, "Cap on the text corpus read from disk, in MiB.", lo=0.01, hi=65536)


@dataclass(frozen=True)
class InnerConfig(_Validated):
    _section = "algo.inner."
    lr: float = F(1e-3, "Inner AdamW learning rate.", lo=0.0, hi=10.0)
    beta1: float = F(0.9, "AdamW beta1.", lo=0.0, hi=0.99999)
    beta2: float = F(0.95, "AdamW beta2.", lo=0.0, hi=0.99999)
    weight_decay: float = F(0.1, "AdamW decoupled weight decay.", lo=0.0, hi=10.0)
    grad_clip: float = F(1.0, "Clip the gradient norm to this value; 0 disables.", lo=0.0, hi=1e6)


ALGORITHMS = ("gasloc", "diloco", "dsgd", "local-gossip")


@dataclass(frozen=True)
class AlgoConfig(_Validated):
    _section = "algo."
    name: str = F("gasloc", "Algorithm: gasloc, diloco, dsgd or local-gossip.", choices=ALGORITHMS)
    local_steps: Union[int, tuple] = F(0, "Inner steps H per round: one number, or one per worker "
                                          "(slow workers do fewer); 0 takes the algorithm's "
                                          "default (dsgd 1, the others 10).", lo=0, hi=1_000_000)
    outer_lr: float = F(0.7, "Outer learning rate eta (DiLoCo's outer SGD lr).", lo=0.0, hi=10.0)
    momentum: Union[float, str] = F(0.9, "Outer momentum gamma (Nesterov mu for DiLoCo), or "
                                         "'auto' for the graph's critical gamma*.")
    alpha: float = F(1.0, "Gossip step alpha in W = I - alpha * Laplacian.", lo=0.0, hi=1.0)
    inner: InnerConfig = field(default_factory=InnerConfig, metadata={})

    def _check(self) -> None:
        m = self.momentum
        if isinstance(m, str):
            if m != "auto":
                raise ConfigError(f"algo.momentum = {m!r} is not allowed; expected a number "
                                  "in [0, 0.999] or 'auto'")
        elif not (0.0 <= m <= 0.999):
            raise ConfigError(f"algo.momentum = {m!r} is out of range; expected [0, 0.999] or 'auto'")

        if self.name == "diloco" and m == "auto":
            raise ConfigError("algo.momentum = 'auto' needs a gossip graph; diloco takes a "
                              "number in [0, 0.999]")
        h = self.local_steps
        if isinstance(h, tuple) and min(h) < 1:
            raise ConfigError(f"algo.local_steps = {list(h)} is out of range; per-worker values "
                              "must be at least 1")
        if self.name == "dsgd" and h not in (0, 1) and set(h if isinstance(h, tuple) else ()) != {1}:
            raise ConfigError(f"algo.local_steps = {h!r} is not allowed for dsgd, which takes one "
                              "step per communication; use local-gossip for H > 1")

    def steps_for(self, worker: int) -> int:
        """H for one worker (the algorithm's default when local_steps is 0)."""
        h = self.local_steps
        if isinstance(h, tuple):
            return h[worker]
        return h or (1 if self.name == "dsgd" else 10)


TOPOLOGIES = ("ring", "torus", "exponential", "expander", "complete", "matching", "matching2")


@dataclass(frozen=True)
class TopologyConfig(_Validated):
    _section = "topology."
    name: str = F("ring", "Graph: ring, torus, exponential, expander (random d-regular), complete, "
                          "matching (random one-peer per round), matching2 (two matchings).",
                  choices=TOPOLOGIES)
    degree: int = F(4, "Degree d of the expander graph.", lo=1, hi=4096)
    base: str = F("complete", "Base graph whose edges the random matchings are drawn from.",
                  choices=("complete", "ring", "torus", "exponential", "expander"))


SHAPERS = ("auto", "tc", "userspace", "none")


@dataclass(frozen=True)
class NetConfig(_Validated):
    _section = "net."
    shaper: str = F("auto", "How links are shaped: auto (best available), tc (namespaces + tc), "
                            "userspace (sender pacing + release queue), none.", choices=SHAPERS)
    bw_profile: str = F("", "Bandwidth profile: uniform, skewed (a few slow links), skewed-worker "
                            "(one slow worker), two-cluster, lognormal, or a .toml/.json file; "
                            "empty means unshaped.")
    rate_mbit: float = F(50.0, "Fast link rate in Mbit/s (uniform rate; fast links of other profiles).",
                         lo=0.001, hi=100_000.0)
    slow_rate_mbit: float = F(5.0, "Slow link rate in Mbit/s for skewed and two-cluster.",
                              lo=0.001, hi=100_000.0)
    latency_ms: float = F(0.0, "One-way latency added to every link, in ms.", lo=0.0, hi=10_000.0)
    jitter_ms: float = F(0.0, "Latency jitter in ms (netem only).", lo=0.0, hi=10_000.0)
    loss_pct: float = F(0.0, "Packet loss in percent (netem only).", lo=0.0, hi=100.0)
    probe: bool = F(True, "Measure every link training uses before it starts (shaped runs); "
                          "configured vs measured goes into links.json.")
    mtu: int = F(1500, "MTU of the emulated links.", lo=576, hi=65535)


@dataclass(frozen=True)
class ExecConfig(_Validated):
    _section = "run."
    name: str = F("", "Run name; empty derives it from algorithm and topology.")
    out_dir: str = F("runs", "Folder under which run records are created.")
    rounds: int = F(20, "Outer rounds.", lo=1, hi=10_000_000)
    eval_every: int = F(0, "Evaluate the averaged model every this many rounds; 0 only at the end.",
                        lo=0, hi=10_000_000)
    device: str = F("auto", "auto (cuda:k round-robin when GPUs are visible), cpu or cuda.",
                    choices=("auto", "cpu", "cuda"))
    threads_per_worker: int = F(0, "Torch CPU threads per worker process; 0 divides the cores.",
                                lo=0, hi=1024)
    heartbeat_timeout_s: float = F(30.0, "Stop the run when a worker is silent this long.",
                                   lo=0.5, hi=86_400.0)
    dashboard: str = F("auto", "auto (on a TTY), on, off.", choices=("auto", "on", "off"))


@dataclass(frozen=True)
class Config(_Validated):
    """The whole resolved configuration of one run."""

    seed: int = F(0, "Seed for model init, data order, graphs and matchings.", lo=0, hi=2**63 - 1)
    workers: int = F(4, "Number of workers N.", lo=1, hi=4096)
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata={})
    topology: TopologyConfig = field(default_factory=TopologyConfig, metadata={})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={})
    data: DataConfig = field(default_factory=DataConfig, metadata={})
    net: NetConfig = field(default_factory=NetConfig, metadata={})
    run: ExecConfig = field(default_factory=ExecConfig, metadata={})

    def _check(self) -> None:
        h = self.algo.local_steps
        if isinstance(h, tuple) and len(h) != self.workers:
            raise ConfigError(f"algo.local_steps has {len(h)} entries; expected one per worker "
                              f"({self.workers})")


# ---------------------------------------------------------------- building from dicts

def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Convert a TOML/CLI value to the field's type or raise a ConfigError naming the key."""
    if is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table of settings, got {value!r}")
        return _build(hint, value, key + ".")
    options = get_args(hint) if get_origin(hint) is Union else (hint,)
    for opt in options:
        ok, out = _try_coerce(value, opt)
        if ok:
            return out
    names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    raise ConfigError(f"{key} = {value!r} has the wrong type; expected {names}")


def _try_coerce(value: Any, typ: Any) -> tuple[bool, Any]:
    if typ is bool:
        return isinstance(value, bool), value
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if typ is str:
        return isinstance(value, str), value
    if typ is tuple:
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value) and len(value) > 0
        return ok, tuple(value) if ok else value
    return False, value


def _build(cls: type, data: dict, prefix: str = "") -> Any:
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            allowed = ", ".join(sorted(known))
            raise ConfigError(f"unknown setting {prefix}{key!s}; known in this section: {allowed}")
        kwargs[key] = _coerce(prefix + key, value, hints[key])
    return cls(**kwargs)


def _set_path(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {part} is a value, not a section")
        node = nxt
    node[parts[-1]] = value


def parse_set(item: str) -> tuple[str, Any]:
    """``section.key=value`` with value read as TOML (numbers, booleans, lists), else a string."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    key, raw = (s.strip() for s in item.split("=", 1))
    if not key:
        raise ConfigError(f"--set {item!r}: the key is empty")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def load_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None


def resolve(file: str | Path | None = None, overrides: dict[str, Any] | None = None,
            sets: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults < TOML file < ``overrides`` (CLI flags, dotted keys) < ``--set`` items."""
    tree: dict = load_toml(file) if file else {}
    tree.pop("sweep", None)  # presets may carry a [sweep] table for `gasloc-emu sweep`
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_path(tree, key, value)
    for item in sets:
        _set_path(tree, *parse_set(item))
    return _build(Config, tree)


def replace(cfg: Config, **dotted: Any) -> Config:
    """A copy of ``cfg`` with dotted keys changed, e.g. ``replace(cfg, **{"algo.name": "dsgd"})``."""
    tree = to_dict(cfg)
    for key, value in dotted.items():
        _set_path(tree, key, value)
    return _build(Config, tree)


# ---------------------------------------------------------------- writing

def to_dict(obj: Any) -> Any:
    if is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple):
        return list(obj)
    return obj


def _toml_char(c: str) -> str:
    """One character of a TOML basic string: quotes, backslashes and control codes escaped."""
    if c in '"\\':
        return "\\" + c
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\u{ord(c):04x}"
    return c


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + "".join(_toml_char(c) for c in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML that ``resolve(file=...)`` reads back to an equal Config."""
    lines: list[str] = []
    _emit_table(to_dict(cfg), "", lines)
    return "\n".join(lines).strip() + "\n"


def _emit_table(table: dict, name: str, lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    if name:
        lines.append(f"\n[{name}]")
    lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
    for k, v in table.items():
        if isinstance(v, dict):
            _emit_table(v, f"{name}.{k}" if name else k, lines)


def field_docs(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, doc) for every setting, for ``gasloc-emu config --fields``."""
    out = []
    for f in fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if is_dataclass(default):
            out.extend(field_docs(type(default), f"{prefix}{f.name}."))
        else:
            out.append((prefix + f.name, default, f.metadata.get("doc", "")))
    return out
