"""One typed config tree: frozen dataclasses, a docstring per field, validated at construction.

Precedence is defaults < TOML file < CLI flags < ``--set section.key=value``. Every field
carries its documentation and its allowed range in ``dataclasses.field(metadata=...)`` so
that validation, error messages, the CLI flags and ``gasloc-emu config --fields`` share one
source.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, NamedTuple, Union, get_args, get_origin, get_type_hints

from gasloc_emu.params import Params
from netem import cloud as netem_cloud
from netem import delay as netem_delay
from netem import impair as netem_impair
from netem import lineproc as netem_lineproc
from netem import profiles as netem_profiles
from netem import shapers as netem_shapers
from netem import tcpsettings as netem_tcpsettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type or out of range."""


def setting(default: Any, doc: str, *, lo: float | None = None, hi: float | None = None,
            choices: tuple | None = None, names: tuple | None = None,
            group: str | None = None) -> Any:
    """A documented field, so that validation, errors, CLI help and ``config --fields`` agree.

    ``lo``/``hi`` are inclusive bounds, ``choices`` the only allowed values. ``names`` are the
    known words of a field that also takes something else (a profile file, a number); they are
    listed in help but not enforced here, unless ``group`` is given: then the field takes
    ``names``, a name an installed package registers under that entry-point group, or a
    ``package.module:Name`` path (which the registry that loads it checks further).
    """
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": choices, "names": names, "group": group}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def allowed(meta: Mapping[str, Any]) -> str:
    """What a setting accepts, in words; empty when anything of its type goes."""
    if meta.get("choices"):
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    if meta.get("group"):
        return ("one of " + ", ".join(repr(n) for n in meta["names"]) + ", a name registered "
                f"under the entry-point group {meta['group']}, or package.module:Name")
    parts = []
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None or hi is not None:
        parts.append(f"a value in [{lo if lo is not None else '-inf'}, "
                     f"{hi if hi is not None else 'inf'}]")
    parts.extend(repr(n) for n in meta.get("names") or ())
    return " or ".join(parts)


def _in_registry(value: Any, meta: Mapping[str, Any]) -> bool:
    """Whether a field with an entry-point ``group`` may take ``value``: a known name, a
    ``package.module:Name`` path, or a name an installed package registers under the group
    (the registry that loads it, above this module, says what a bad one is)."""
    group = meta.get("group")
    if not group or not isinstance(value, str) or value in meta["names"] or ":" in value:
        return True
    return value in registered_names(group)


@functools.cache
def registered_names(group: str) -> frozenset[str]:
    """The short names installed packages register under the entry-point ``group``
    (``plugins.registered`` loads them; this module only checks a setting's word)."""
    return frozenset(ep.name for ep in importlib_metadata.entry_points(group=group))


def _check_value(key: str, value: Any, meta: dict) -> None:
    items = value if isinstance(value, tuple) else (value,)
    for v in items:
        if meta["choices"] and v not in meta["choices"] or not _in_registry(v, meta):
            raise ConfigError(f"{key} = {value!r} is not allowed; expected {allowed(meta)}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            bad = (isinstance(v, float) and not math.isfinite(v)) \
                or (meta["lo"] is not None and v < meta["lo"]) \
                or (meta["hi"] is not None and v > meta["hi"])
            if bad:
                raise ConfigError(f"{key} = {value!r} is out of range; expected {allowed(meta)}")


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
    preset: str = setting("tiny", "Named size: tiny (~0.1M params, CI), small (~1M), "
                                  "gpt2 (124M, GPU); or a model of your own: "
                                  "package.module:factory, or a name registered under the "
                                  "entry-point group gasloc_emu.models (docs/EXTENDING.md).",
                          names=("tiny", "small", "gpt2"))
    n_layer: int = setting(0, "Transformer blocks; 0 takes the preset's value.", lo=0, hi=96)
    n_head: int = setting(0, "Attention heads; 0 takes the preset's value.", lo=0, hi=64)
    n_embd: int = setting(0, "Embedding width; 0 takes the preset's value.", lo=0, hi=8192)
    block_size: int = setting(0, "Context length in tokens; 0 takes the preset's value.",
                              lo=0, hi=8192)
    vocab_size: int = setting(0, "Vocabulary; 0 takes the tokenizer's of a prepared corpus "
                                 "(data.path), else the preset's (256 byte tokens; 50304 for "
                                 "gpt2).", lo=0, hi=1 << 20)
    dropout: float = setting(0.0, "Dropout probability (0 keeps runs deterministic).",
                             lo=0.0, hi=0.9)


@dataclass(frozen=True)
class DataConfig(_Validated):
    _section = "data."
    path: str = setting("", "Text file, folder of text files, .bin file of uint16 tokens, a "
                            "folder made by gasloc-emu data prepare (subword tokens), or a "
                            "built-in corpus: stdlib (the running Python's sources) or "
                            "pydoc-topics (the Python reference's English help texts); empty: "
                            "the model preset's (tiny: stdlib; small, gpt2: pydoc-topics).",
                        names=("stdlib", "pydoc-topics"))
    batch_size: int = setting(8, "Sequences per inner step per worker.", lo=1, hi=4096)
    val_fraction: float = setting(0.05, "Share of the corpus held out for evaluation.",
                                  lo=0.001, hi=0.5)
    eval_batches: int = setting(8, "Batches of the validation split per evaluation.",
                                lo=1, hi=10000)
    max_corpus_mb: float = setting(8.0, "Cap on the text corpus read from disk, in MiB.",
                                   lo=0.01, hi=65536)


LR_SCHEDULES = ("constant", "cosine", "linear")
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class InnerConfig(_Validated):
    _section = "algo.inner."
    lr: float = setting(1e-3, "Inner AdamW learning rate.", lo=0.0, hi=10.0)
    beta1: float = setting(0.9, "AdamW beta1.", lo=0.0, hi=0.99999)
    beta2: float = setting(0.95, "AdamW beta2.", lo=0.0, hi=0.99999)
    weight_decay: float = setting(0.1, "AdamW decoupled weight decay.", lo=0.0, hi=10.0)
    grad_clip: float = setting(1.0, "Clip the gradient norm to this value; 0 disables.",
                               lo=0.0, hi=1e6)
    decay_embeddings: bool = setting(True, "Weight decay also on the embedding tables (the "
                                           "token table, tied to the output head, and the "
                                           "positions), as nanoGPT does; off: only the other "
                                           "matrices decay. Biases and norms never decay "
                                           "(docs/RECIPE.md).")
    schedule: str = setting("constant", "Inner lr after the warmup: constant, cosine or linear "
                                        "decay to algo.inner.min_lr_ratio * lr at the end of "
                                        "the schedule (docs/RECIPE.md).",
                            choices=LR_SCHEDULES)
    warmup_steps: int = setting(0, "Inner steps of linear warmup from lr/warmup_steps to lr, "
                                   "counted on each worker's own step counter.",
                                lo=0, hi=100_000_000)
    schedule_steps: int = setting(0, "Length of the schedule in inner steps (warmup "
                                     "included); 0: run.rounds * H_i as the plan knows it "
                                     "before the run (required under a budget with measured "
                                     "step times). Later steps stay at the floor.",
                                  lo=0, hi=1_000_000_000)
    min_lr_ratio: float = setting(0.1, "The decay's floor as a share of the inner lr.",
                                  lo=0.0, hi=1.0)
    micro_batches: int = setting(1, "Gradient accumulation: forward/backward passes of "
                                    "data.batch_size sequences per inner step, each loss scaled "
                                    "by 1/micro_batches, so a step's gradient is the mean over "
                                    "data.batch_size * micro_batches sequences.",
                                 lo=1, hi=65536)
    precision: str = setting("fp32", "Forward pass precision: fp32, bf16 (autocast; CPU and "
                                     "GPU) or fp16 (autocast with a gradient scaler; GPU "
                                     "only). Parameters, optimizer state and the wire stay "
                                     "float32.", choices=PRECISIONS)
    compile: bool = setting(False, "torch.compile the model's forward pass (needs a C++ "
                                   "compiler on the CPU; not with sim.batched).")

    def _check(self) -> None:
        if self.warmup_steps and self.schedule_steps and self.warmup_steps > self.schedule_steps:
            raise ConfigError(f"algo.inner.warmup_steps = {self.warmup_steps} is longer than "
                              f"algo.inner.schedule_steps = {self.schedule_steps}")

    @property
    def scheduled(self) -> bool:
        """Whether the lr changes over the run (else the constant lr of today's runs)."""
        return self.schedule != "constant" or self.warmup_steps > 0


# The built-in algorithms' names, for help texts; any name registered under the entry-point
# group gasloc_emu.algorithms, or package.module:Class, is taken (algorithms.registry)
ALGORITHMS = ("gasloc", "diloco", "dsgd", "local-gossip", "a2cid2")


# algo.outer_lr = "1-momentum": eta = 1 - gamma, so the heavy ball's step on the mean,
# eta / (1 - gamma), stays 1 and only the gossip is accelerated (docs/ALGORITHM.md, "gamma")
ONE_MINUS_MOMENTUM = "1-momentum"


def auto_factor(momentum: str) -> float | None:
    """F of 'auto' (1) or 'auto*F' (a fraction of the graph's gamma*); None if neither."""
    if momentum == "auto":
        return 1.0
    head, star, tail = momentum.partition("*")
    if head != "auto" or not star:
        return None
    try:
        f = float(tail)
    except ValueError:
        return None
    return f if 0.0 < f <= 1.0 else None


@dataclass(frozen=True)
class AlgoConfig(_Validated):
    _section = "algo."
    name: str = setting("gasloc", "Algorithm: gasloc, diloco, dsgd, local-gossip or a2cid2 "
                                  "(asynchronous pairwise gossip with a continuous momentum; "
                                  "run.rounds counts its gradient steps per worker).",
                        names=ALGORITHMS)
    local_steps: int | tuple = setting(0, "Inner steps H per round: one number, or one per "
                                          "worker (slow workers do fewer); 0 takes the "
                                          "algorithm's default (dsgd 1, the others 10).",
                                       lo=0, hi=1_000_000)
    outer_lr: float | str = setting(0.7, "Outer learning rate eta (DiLoCo's outer SGD lr), or "
                                         "'1-momentum' (gasloc: eta = 1 - gamma, which keeps "
                                         "the step on the mean at 1).",
                                    lo=0.0, hi=10.0, names=(ONE_MINUS_MOMENTUM,))
    momentum: float | str = setting(0.9, "Outer momentum gamma (Nesterov mu for DiLoCo), or "
                                         "'auto' for the graph's critical gamma*, or 'auto*F' "
                                         "for F times it (F in (0, 1], e.g. auto*0.5).",
                                    lo=0.0, hi=0.999, names=("auto", "auto*F"))
    alpha: float = setting(1.0, "Gossip step alpha in W = I - alpha * Laplacian.",
                           lo=0.0, hi=1.0)
    overlap: int = setting(0, "Rounds communication may lag behind compute: 0 (communicate, "
                              "then compute) or 1 (gasloc: the neighbours' z of round t are "
                              "mixed in at the end of round t+1; diloco: round t's All-Reduce "
                              "runs during round t+1 and its outer step lands one round late). "
                              "With gasloc, search algo.alpha below 1 with the outer lr: the "
                              "lag's cost depends on it (docs/ALGORITHM.md).",
                           lo=0, hi=1)
    continuous_momentum: bool = setting(True, "a2cid2: the paper's continuous momentum, with "
                                              "its constants from the graph; off, plain "
                                              "asynchronous pairwise gossip.")
    rate_com: float = setting(1.0, "a2cid2: pairwise communications per gradient step, made "
                                   "while the steps go on (the authors' rate_com): a whole "
                                   "number 1..8, or 1/m (one every m steps).", lo=1 / 64, hi=8)
    pseudo_grad_mean: str = setting("plain", "DiLoCo's average of pseudo-gradients when workers "
                                             "took unequal step counts H_i: plain (mean over "
                                             "workers, as DiLoCo) or steps (weighted by H_i).",
                                    choices=("plain", "steps"))
    params: Params = setting(Params(), "The algorithm's own settings (a plugin's, "
                                       "algo.params.KEY = VALUE), validated by its Settings "
                                       "dataclass when the run is planned.")
    inner: InnerConfig = field(default_factory=InnerConfig, metadata={})

    def _check(self) -> None:
        """The rules every algorithm shares; each algorithm states its own about these
        settings (``OuterAlgorithm.check_settings``), checked when the run is planned."""
        m = self.momentum
        if isinstance(m, str) and auto_factor(m) is None:
            raise ConfigError(f"algo.momentum = {m!r} is not allowed; expected a number "
                              "in [0, 0.999], 'auto' or 'auto*F' with F in (0, 1]")
        if isinstance(self.outer_lr, str) and self.outer_lr != ONE_MINUS_MOMENTUM:
            raise ConfigError(f"algo.outer_lr = {self.outer_lr!r} is not allowed; expected a "
                              "number in [0, 10] or '1-momentum'")
        h = self.local_steps
        if isinstance(h, tuple) and min(h) < 1:
            raise ConfigError(f"algo.local_steps = {list(h)} is out of range; per-worker values "
                              "must be at least 1")

    def steps_for(self, worker: int, default: int) -> int:
        """H for one worker; ``default`` (the algorithm's) when local_steps is 0."""
        h = self.local_steps
        if isinstance(h, tuple):
            return h[worker]
        return h or default


# the built-in graphs' names, for help texts (the topology module's NAMES, which sits above
# config; a unit test keeps the two equal); any family registered under the entry-point group
# gasloc_emu.topologies, or package.module:Class, is allowed too (``topology.family``)
TOPOLOGIES = ("ring", "torus", "exponential", "expander", "complete", "matching", "matching2",
              "fastest")


@dataclass(frozen=True)
class TopologyConfig(_Validated):
    _section = "topology."
    name: str = setting("ring", "Graph: ring, torus, exponential, expander (random d-regular), "
                                "complete, matching (random one-peer per round), matching2 "
                                "(two matchings), fastest (degree <= d on the fastest "
                                "measured links of the bandwidth profile, connected), a "
                                "family registered under the entry-point group "
                                "gasloc_emu.topologies or package.module:Class.",
                         names=TOPOLOGIES, group="gasloc_emu.topologies")
    degree: int = setting(4, "Degree d of the expander graph; the most peers of fastest.",
                          lo=1, hi=4096)
    base: str = setting("complete", "Base graph whose edges the random matchings are drawn from.",
                        choices=("complete", "ring", "torus", "exponential", "expander"))
    rate_slack: float = setting(0.0, "fastest: links added for mixing beyond its spanning tree "
                                     "may be this much slower than the tree's slowest edge "
                                     "(0: the bottleneck stays the tree's; 0.2: down to 0.8 x "
                                     "it).", lo=0.0, hi=0.99)


# The network's names are their registries' (netem sits below config and imports nothing of
# gasloc_emu): the shapers, the delay modes, netem's jitter distributions, the congestion
# controls a link may ask for ("" = the host's) and the named bandwidth profiles.
SHAPERS = netem_shapers.REQUESTS
DELAY_MODES = netem_delay.REQUESTS
JITTER_DISTS = netem_impair.JITTER_DISTS
CONGESTION_CONTROLS = ("", *netem_tcpsettings.CONGESTION_CONTROLS)
BW_PROFILES = netem_profiles.NAMED


@dataclass(frozen=True)
class NetConfig(_Validated):
    _section = "net."
    shaper: str = setting("auto", "How links are shaped: auto (best available), tc (namespaces "
                                  "+ tc), userspace (sender pacing + release queue), none, a "
                                  "shaper registered under the entry-point group "
                                  "gasloc_emu.shapers, or package.module:Class.",
                          names=SHAPERS)
    bw_profile: str = setting("", "Bandwidth profile: a name (skewed: a few slow links; "
                                  "skewed-worker: one slow worker; two-cluster: slow between two "
                                  "halves; lognormal: seeded per-worker rates) or a .toml/.json "
                                  "file; empty means unshaped.", names=BW_PROFILES)
    rate_mbit: float = setting(50.0, "Fast link rate in Mbit/s (uniform rate; fast links of "
                                     "other profiles).", lo=0.001, hi=100_000.0)
    slow_rate_mbit: float = setting(5.0, "Slow link rate in Mbit/s for skewed, skewed-worker and "
                                         "two-cluster.", lo=0.001, hi=100_000.0)
    latency_ms: float = setting(0.0, "One-way latency added to every link, in ms.",
                                lo=0.0, hi=10_000.0)
    jitter_ms: float = setting(0.0, "Latency jitter in ms (netem or the packet line); at most "
                                     "the latency unless net.reorder_pct > 0.",
                               lo=0.0, hi=10_000.0)
    jitter_dist: str = setting("normal", "Distribution of the jitter's draws (netem's tables).",
                               choices=JITTER_DISTS)
    loss_pct: float = setting(0.0, "Random packet loss in percent, below 100 (netem or the "
                                   "packet line).", lo=0.0, hi=100.0)
    reorder_pct: float = setting(0.0, "Share of packets in percent sent at once, overtaking the "
                                      "delayed ones (0: packets keep their order).",
                                 lo=0.0, hi=100.0)
    ge_p_pct: float = setting(0.0, "Bursty loss (Gilbert-Elliott): per-packet chance in percent "
                                   "of going from the good state to the bad one (0: off).",
                              lo=0.0, hi=100.0)
    ge_r_pct: float = setting(0.0, "Bursty loss: per-packet chance in percent of leaving the "
                                   "bad state.", lo=0.0, hi=100.0)
    ge_bad_loss_pct: float = setting(100.0, "Bursty loss: share of packets lost in the bad "
                                            "state.", lo=0.0, hi=100.0)
    queue_pkts: int = setting(1000, "Bottleneck queue of every link in packets (the shaper's "
                                    "leaf queue; tail drop).", lo=1, hi=1_000_000)
    delay: str = setting("auto", "How delay, jitter and loss act on packets: auto (netem where "
                                 "the kernel has it, else the packet line), netem, packet-line "
                                 "(a userspace delay line between the namespaces: TCP sees the "
                                 "delay), release-queue (the receiver holds messages: TCP does "
                                 "not see the delay; not faithful to TCP).", choices=DELAY_MODES)
    line_priority: str = setting("auto", "The packet line's CPU before the workers': realtime "
                                         "(SCHED_FIFO for the line, where permitted), nice "
                                         "(the workers at a lower priority, always permitted), "
                                         "auto (realtime where permitted, else nice), none "
                                         "(the line shares the cores as any process).",
                                 choices=netem_lineproc.PRIORITIES)
    probe: bool = setting(True, "Measure every link training uses before it starts (shaped "
                                "runs); configured vs measured goes into links.json.")
    tcp_sample_s: float = setting(1.0, "Sample the senders' TCP (ss: RTT, cwnd, retransmits, who "
                                        "held them back) in every worker namespace this often "
                                        "during training (tc runs); 0: off.", lo=0.0, hi=60.0)
    mtu: int = setting(1500, "MTU of the emulated links.", lo=576, hi=65535)
    link_trace: str = setting("", "Link trace (CSV: time_s,src,dst,rate_mbit[,latency_ms]) "
                                  "replayed over the run: measured bandwidth over time; empty: "
                                  "none.")
    placement: str = setting("", "bw_profile cloud: the region of each worker, "
                                 "cloud:region,... (region*count repeats one; e.g. "
                                 "aws:us-east-1*2,gcp:asia-east1), or a preset: aws8 (eight AWS "
                                 "regions), two-cloud (four AWS, four GCP); links as measured "
                                 "between the regions (docs/NETWORK.md).",
                             names=tuple(netem_cloud.PRESETS))
    cloud_rate: str = setting("capacity", "bw_profile cloud: which measured rate a link gets: "
                                          "capacity (64 TCP streams, the path's) or "
                                          "single-stream (one TCP connection, small VMs).",
                              choices=netem_cloud.RATES)
    cloud_missing: str = setting("error", "bw_profile cloud, a region pair the data lack: "
                                          "error (name it and the nearest measured pairs), "
                                          "reverse (the other direction's measurement), nearest "
                                          "(the measured pair whose far end is nearest in RTT); "
                                          "fills are named in the link plan's note.",
                                 choices=netem_cloud.MISSING)

    def _check(self) -> None:
        """The cloud profile has a placement, and a placement's regions are in the table (other
        profiles do not read it); the shaper is one the registry knows (``netem.shapers``: a
        plugin is loaded and checked here)."""
        try:
            netem_shapers.check_request(self.shaper)
        except netem_shapers.ShaperError as exc:
            raise ConfigError(str(exc)) from None
        if self.bw_profile == "cloud" and not self.placement:
            raise ConfigError("net.bw_profile = 'cloud' needs net.placement: regions like "
                              "aws:us-east-1,gcp:asia-east1 or a preset: "
                              f"{', '.join(netem_cloud.PRESETS)}")
        if self.placement:
            try:
                netem_cloud.parse_placement(self.placement)
            except netem_cloud.CloudError as exc:
                raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class TcpConfig(_Validated):
    """The senders' TCP on every link (a profile's [tcp] table and links override it where
    these are left at their defaults)."""

    _section = "tcp."
    congestion_control: str = setting("", "Congestion control of every sender: cubic, reno, bbr "
                                          "('' keeps the host's; set per route, so any the "
                                          "kernel has).", choices=CONGESTION_CONTROLS)
    slow_start_after_idle: int = setting(-1, "tcp_slow_start_after_idle in every worker's "
                                             "namespace: 1 (the kernel's default) restarts the "
                                             "window after an idle RTO, 0 keeps it, -1 leaves the "
                                             "namespace's default.", choices=(-1, 0, 1))
    rmem_max_bytes: int = setting(0, "The largest receive buffer TCP autotuning may use "
                                     "(tcp_rmem's maximum; 0: the default).",
                                  lo=0, hi=2**31 - 1)
    wmem_max_bytes: int = setting(0, "The largest send buffer (tcp_wmem's maximum; 0: the "
                                     "default).", lo=0, hi=2**31 - 1)
    init_cwnd: int = setting(0, "Initial congestion window in segments (the route's initcwnd; "
                                "0: the kernel's 10).", lo=0, hi=1000)


@dataclass(frozen=True)
class ExecConfig(_Validated):
    _section = "run."
    name: str = setting("", "Run name; empty derives it from algorithm and topology.")
    out_dir: str = setting("runs", "Folder under which run records are created.")
    rounds: int = setting(20, "Outer rounds.", lo=1, hi=10_000_000)
    eval_every: int = setting(0, "Evaluate the averaged model every this many rounds; 0 only at "
                                 "the end.", lo=0, hi=10_000_000)
    device: str = setting("auto", "auto (each worker pinned to one visible GPU, round-robin; "
                                  "else the CPU), cpu or cuda.", choices=("auto", "cpu", "cuda"))
    threads_per_worker: int = setting(0, "Torch CPU threads per worker process; 0 divides the "
                                         "cores.", lo=0, hi=1024)
    heartbeat_timeout_s: float = setting(30.0, "Stop the run when a worker is silent this long.",
                                         lo=0.5, hi=86_400.0)
    dashboard: str = setting("auto", "Live dashboard: auto (on a TTY), on, off.",
                             choices=("auto", "on", "off"))
    security: str = setting("auto", "Who may connect to the data and control planes: auto (plain "
                                    "on one host, curve across hosts), plain (ZAP PLAIN: "
                                    "authenticated, no per-message cost), curve (authenticated "
                                    "and encrypted).", choices=("auto", "plain", "curve"))
    scenario: str = setting("", "Scenario file (TOML): a timeline of link, partition, speed, "
                                "pause, leave and join events (docs/NETWORK.md, \"Scenarios\"); "
                                "empty: nothing changes during the run.")
    on_worker_loss: str = setting("auto", "What a lost worker does to the run: continue (the "
                                          "others carry on without it: a scenario's "
                                          "departures, a host lost without warning in a "
                                          "multi-node run, and a worker process killed by a "
                                          "signal), fail (the run ends), auto "
                                          "(continue for departures the scenario declares, "
                                          "fail for any other death).",
                                  choices=("auto", "continue", "fail"))
    failure_detect_s: float = setting(2.0, "Seconds a departed worker's peers spend noticing "
                                           "it is gone (a heartbeat timeout) before mixing "
                                           "without it.", lo=0.0, hi=3600.0)
    checkpoint_every: int = setting(0, "Write every worker's whole state to the record's "
                                       "checkpoints/ folder every this many rounds (atomic, "
                                       "checksummed; older ones removed once every worker has "
                                       "two newer ones), so that --resume RUN_DIR can continue "
                                       "the run; 0: never.", lo=0, hi=10_000_000)
    time_scale: float | str = setting(
        1.0, "Time dilation K (Gupta et al., NSDI 2006): every rate / K and every delay, "
             "jitter, nominal step time, scenario time and timeout x K, so the machine carries K "
             "times fewer frames a second while every bandwidth-delay product and "
             "compute-to-communication ratio stays; records report emulated time (wall / K). "
             "'auto' picks the smallest K whose peak frame rate the packet line measured here "
             "carries.", lo=1.0, hi=1000.0, names=("auto",))
    require_faithful: bool = setting(False, "End a run whose fidelity verdict is degraded "
                                            "(the network or the machine did not emulate "
                                            "what was asked) with its own exit code and one "
                                            "line naming the worst link.")

    def _check(self) -> None:
        k = self.time_scale
        if isinstance(k, str) and k != "auto":
            raise ConfigError(f"run.time_scale = {k!r} is not allowed; expected a number in "
                              "[1.0, 1000.0] or 'auto'")


# The named compute profiles; training.compute.NAMED is the list it builds (a unit test keeps
# the two equal).
COMPUTE_PROFILES = ("uniform", "straggler", "two-speed", "lognormal")


@dataclass(frozen=True)
class ComputeConfig(_Validated):
    _section = "compute."
    step_time_s: float = setting(0.0, "Nominal seconds of one inner step at full speed; every "
                                      "step then takes exactly step_time_s / speed (the "
                                      "emulator sleeps the rest). 0: as measured on this "
                                      "machine.", lo=0.0, hi=3600.0)
    profile: str = setting("", "Worker speeds: uniform (all 1), straggler (the last worker at "
                               "slow_speed), two-speed (the second half at slow_speed), "
                               "lognormal (seeded spread sigma, fastest at 1), or a .toml file "
                               "([default] speed, [[worker]] id, speed); empty: all at 1.",
                       names=COMPUTE_PROFILES)
    slow_speed: float = setting(0.25, "Speed of the slow workers of straggler and two-speed "
                                      "(1 = full speed).", lo=0.001, hi=1.0)
    sigma: float = setting(0.5, "Log-space standard deviation of the lognormal profile.",
                           lo=0.0, hi=5.0)
    inner_budget_s: float = setting(0.0, "Compute seconds per round: each worker takes inner "
                                         "steps while the next one fits in the budget (at least "
                                         "one), so slow workers take fewer (the paper's H_i); "
                                         "0: fixed H (algo.local_steps).", lo=0.0, hi=1e6)


@dataclass(frozen=True)
class SimConfig(_Validated):
    _section = "sim."
    batched: bool = setting(False, "simulate only: each round's inner steps of every worker as "
                                   "one batched computation; faster, equal to the per-worker "
                                   "path to float rounding (not to the bit, so not to run).")
    timing_only: bool = setting(False, "simulate only: the run's timeline without training "
                                       "(compute, sends, link queues, receives on the virtual "
                                       "clock; simulate's times to the float), for many "
                                       "workers; needs compute.step_time_s > 0 and refuses "
                                       "what it does not time; its record has no loss.")
    jitter: float = setting(0.0, "simulate, algorithms without rounds (a2cid2): each step and "
                                 "each transfer takes its modelled time times (1 + jitter * u), "
                                 "u uniform in [0, 1) from the run's seed, as on a real host; 0: "
                                 "exact times, whose ties pair workers as no host does "
                                 "(docs/ALGORITHM.md).", lo=0.0, hi=1.0)


@dataclass(frozen=True)
class SurrogateConfig(_Validated):
    """``gasloc-emu consensus``: the algorithms' outer rules on per-worker quadratics instead of
    a model (``experiments/consensus.py``); the other commands ignore it."""

    _section = "surrogate."
    dim: int = setting(16, "consensus: dimension d of every worker's quadratic "
                           "f_i(x) = 1/2 |A_i x - b_i|^2.", lo=1, hi=1024)
    rows: int = setting(32, "consensus: rows of A_i (entries N(0, 1/rows), so A_i^T A_i is "
                            "near the identity when rows >> dim).", lo=1, hi=4096)
    heterogeneity: float = setting(1.0, "consensus: distance of each worker's own optimum from "
                                        "the common centre (b_i = A_i x_i*, |x_i* - c| ~ this); "
                                        "0: every worker has the same optimum.", lo=0.0, hi=1e3)
    lr: float = setting(0.1, "consensus: step size of the inner gradient steps on f_i.",
                        lo=0.0, hi=1.0)
    grad_noise: float = setting(0.0, "consensus: standard deviation of Gaussian noise added "
                                     "to each coordinate of each inner gradient (0: exact "
                                     "gradients).", lo=0.0, hi=1e3)
    init_spread: float = setting(0.0, "consensus: each worker starts at x_0 + this x N(0, I/d) "
                                      "(0: all start at the same point, as the algorithms' "
                                      "workers do); with algo.outer_lr = 0 the run is pure "
                                      "gossip averaging of these starts.", lo=0.0, hi=1e3)


CODECS = ("none", "bf16", "int8", "int4", "topk", "randk")


@dataclass(frozen=True)
class CommConfig(_Validated):
    _section = "comm."
    codec: str = setting("none", "What messages carry: none (float32 values), bf16, int8 or int4 "
                                 "(block-wise scales), topk or randk (comm.ratio of the values), "
                                 "a codec registered under the entry-point group "
                                 "gasloc_emu.codecs or package.module:Class; lossy codecs keep "
                                 "error feedback (docs/ALGORITHM.md).",
                         names=CODECS)
    ratio: float = setting(0.01, "topk and randk: the share of values a message carries.",
                           lo=1e-6, hi=1.0)
    block_size: int = setting(256, "int8 and int4: values per block sharing one float32 "
                                   "scale.", lo=8, hi=65536)
    gossip_step: float = setting(1.0, "Gossip with a lossy codec: CHOCO's consensus step s in "
                                      "theta = z + s * sum_j W_ij (copy_j - copy_i).",
                                 lo=1e-6, hi=1.0)
    feedback_decay: float = setting(1.0, "The All-Reduce's error feedback: the residual is "
                                         "multiplied by this each round (1 loses nothing; "
                                         "SparseLoCo's beta < 1 with algo.momentum = 0).",
                                    lo=0.0, hi=1.0)


FAULT_MODES = ("raise", "exit", "hang", "poison")


@dataclass(frozen=True)
class FaultConfig(_Validated):
    _section = "fault."
    worker: int = setting(-1, "Inject a failure into this worker (-1: none), to see how a run "
                              "fails.", lo=-1, hi=4095)
    round: int = setting(0, "The round whose first communication fails.", lo=0, hi=10_000_000)
    mode: str = setting("raise", "How it fails: raise (an exception), exit (the process ends "
                                 "with fault.exit_code), hang (stops dead, heartbeat included), "
                                 "poison (from then on sends NaN: its peers diverge).",
                        choices=FAULT_MODES)
    exit_code: int = setting(3, "Exit status of an injected exit.", lo=1, hi=255)


@dataclass(frozen=True)
class Config(_Validated):
    """The whole resolved configuration of one run."""

    seed: int = setting(0, "Seed for model init, data order, graphs, matchings and seeded "
                           "bandwidth profiles.", lo=0, hi=2**63 - 1)
    workers: int = setting(4, "Number of workers N.", lo=1, hi=4096)
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata={})
    topology: TopologyConfig = field(default_factory=TopologyConfig, metadata={})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={})
    data: DataConfig = field(default_factory=DataConfig, metadata={})
    net: NetConfig = field(default_factory=NetConfig, metadata={})
    tcp: TcpConfig = field(default_factory=TcpConfig, metadata={})
    compute: ComputeConfig = field(default_factory=ComputeConfig, metadata={})
    run: ExecConfig = field(default_factory=ExecConfig, metadata={})
    comm: CommConfig = field(default_factory=CommConfig, metadata={})
    sim: SimConfig = field(default_factory=SimConfig, metadata={})
    surrogate: SurrogateConfig = field(default_factory=SurrogateConfig, metadata={})
    fault: FaultConfig = field(default_factory=FaultConfig, metadata={})

    def _check(self) -> None:
        if self.fault.worker >= self.workers:
            raise ConfigError(f"fault.worker = {self.fault.worker} is out of range; expected "
                              f"-1 (none) or a worker in [0, {self.workers - 1}]")
        h = self.algo.local_steps
        if isinstance(h, tuple) and len(h) != self.workers:
            raise ConfigError(f"algo.local_steps has {len(h)} entries; expected one per worker "
                              f"({self.workers})")


# Where an experiment's runs are made (`gasloc-emu sweep` and `crossover`); the engines
# themselves are in experiments/engines.py, whose registry a unit test keeps equal to this.
ENGINES = ("local", "submitit")
ENGINE_SECTION = "engine."


@dataclass(frozen=True)
class EngineConfig(_Validated):
    """Where the runs of a sweep or a crossover map are made. Not part of a run's Config: a run
    is the same run wherever it was made, so its record (and the reuse of finished runs, which
    compares records' configs) does not change with the engine."""

    _section = ENGINE_SECTION
    name: str = setting("local", "Where an experiment's runs are made: local (one after "
                                 "another in this process) or submitit (each run one job of a "
                                 "job array through submitit: Slurm, or processes on this "
                                 "machine); finished runs are reused either way.",
                        choices=ENGINES)
    cluster: str = setting("slurm", "submitit: slurm (sbatch job arrays) or local (every job "
                                    "a process on this machine, all at once).",
                           choices=("slurm", "local"))
    partition: str = setting("", "submitit on slurm: the partition; empty: the cluster's "
                                 "default.")
    time_limit_min: int = setting(60, "submitit: each job's time limit in minutes (Slurm's "
                                      "--time); a run still going then is killed and reported.",
                                  lo=1, hi=60 * 24 * 30)
    cpus_per_task: int = setting(1, "submitit on slurm: CPU cores of each job (Slurm's "
                                    "--cpus-per-task).", lo=1, hi=1024)
    gpus_per_task: int = setting(0, "submitit: GPUs of each job (Slurm's --gpus-per-node, one "
                                    "task per job; on the local cluster, CUDA_VISIBLE_DEVICES).",
                                 lo=0, hi=64)
    mem_gb: float = setting(0.0, "submitit on slurm: memory of each job in GB (Slurm's --mem); "
                                 "0: the partition's default.", lo=0.0, hi=1e5)
    array_parallelism: int = setting(64, "submitit on slurm: at most this many jobs of one "
                                         "array run at once (the %N of --array).",
                                     lo=1, hi=100_000)
    log_dir: str = setting("engine-logs", "submitit: the folder of its job files and each "
                                          "job's stdout/stderr logs, inside the experiment's "
                                          "folder (--out).")


def engine_specs() -> list[SettingSpec]:
    """The engine's settings, keyed engine.<name> (the flags of sweep and crossover)."""
    return setting_specs(EngineConfig, ENGINE_SECTION)


def resolve_engine(overrides: Mapping[str, Any] | None = None) -> EngineConfig:
    """The engine's settings from dotted keys (engine.name, ...); a value of None is unset."""
    given = {k.removeprefix(ENGINE_SECTION): v for k, v in (overrides or {}).items()
             if v is not None}
    return _build(EngineConfig, given, ENGINE_SECTION)


# ---------------------------------------------------------------- building from dicts

_UNIONS = (Union, types.UnionType)  # ``int | tuple`` hints are types.UnionType, not Union


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Convert a TOML/CLI value to the field's type or raise a ConfigError naming the key."""
    if is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table of settings, got {value!r}")
        return _build(hint, value, key + ".")
    options = get_args(hint) if get_origin(hint) in _UNIONS else (hint,)
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
    if typ is Params:
        ok = isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
        return ok, Params(value) if ok else value
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
            allowed = ", ".join(sorted(known)) or "none (it has no settings)"
            raise ConfigError(f"unknown setting {prefix}{key!s}; known in this section: {allowed}")
        kwargs[key] = _coerce(prefix + key, value, hints[key])
    return cls(**kwargs)


def build_section(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """A dataclass section (a plugin's settings, say) from a table of values, checked as the
    config tree's sections are: unknown keys, types and ``setting`` ranges, one error each."""
    out = _build(cls, dict(data), prefix)
    if not isinstance(out, _Validated):   # a plugin's plain dataclass: its ranges checked here
        for f in fields(out):
            if f.metadata.get("doc") is not None:
                _check_value(f"{prefix}{f.name}", getattr(out, f.name), dict(f.metadata))
    return out


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


def load_toml(path: str | Path, what: str = "config file",
              error: type[ConfigError] = ConfigError) -> dict:
    """A TOML file's table; a missing or unparsable file is one ``error`` naming ``what``."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} {str(p)!r} does not exist")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{what} {str(p)!r} is not valid TOML: {exc}") from None


def resolve(file: str | Path | None = None, overrides: dict[str, Any] | None = None,
            sets: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults < TOML file < ``overrides`` (CLI flags, dotted keys) < ``--set`` items."""
    tree: dict = load_toml(file) if file else {}
    for table in ("sweep", "crossover"):  # a preset's table for `gasloc-emu sweep` or `crossover`
        tree.pop(table, None)
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_path(tree, key, value)
    for item in sets:
        _set_path(tree, *parse_set(item))
    return _build(Config, tree)


def replace(cfg: Config, **dotted: Any) -> Config:
    """A copy of ``cfg`` with dotted keys changed and re-validated.

    E.g. ``replace(cfg, **{"algo.name": "dsgd"})``.
    """
    tree = to_dict(cfg)
    for key, value in dotted.items():
        _set_path(tree, key, value)
    return _build(Config, tree)


# ---------------------------------------------------------------- writing

def to_dict(obj: Any) -> Any:
    if is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Params):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return list(obj)
    return obj

# -- the tree written back as TOML (run records, ``config --show``), read back by ``resolve``
# to an equal Config: the same format both ways, so the round trip lives with the reader


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


class SettingSpec(NamedTuple):
    """One leaf of the tree as the CLI and ``config --fields`` see it."""

    key: str
    hint: Any
    default: Any
    meta: Mapping[str, Any]

    @property
    def doc(self) -> str:
        return self.meta.get("doc", "")


def setting_specs(cls: type = Config, prefix: str = "") -> list[SettingSpec]:
    """Every setting of the tree in declaration order, so flags and listings follow the tree."""
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if is_dataclass(default):
            out.extend(setting_specs(type(default), f"{prefix}{f.name}."))
        else:
            out.append(SettingSpec(prefix + f.name, hints[f.name], default, f.metadata))
    return out


@functools.cache
def _specs_by_key() -> dict[str, SettingSpec]:
    """The tree's specs by key, and the engine's (engine.<name>), built once: the CLI looks up
    every flag row at import."""
    return {spec.key: spec for spec in (*setting_specs(), *engine_specs())}


def setting_spec(key: str) -> SettingSpec:
    """The spec of one dotted key; a ConfigError for a key the tree does not have."""
    try:
        return _specs_by_key()[key]
    except KeyError:
        raise ConfigError(f"unknown setting {key}") from None


def check_setting(key: str, value: Any) -> Any:
    """``value`` coerced and checked as if given by ``--set``, for messages that match it."""
    spec = setting_spec(key)
    out = _coerce(key, value, spec.hint)
    _check_value(key, out, dict(spec.meta))
    return out


def field_docs(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, doc) for every setting, for ``gasloc-emu config --fields``."""
    return [(s.key, s.default, s.doc) for s in setting_specs(cls, prefix)]
