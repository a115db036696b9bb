"""Command line: parse, resolve the config, call one function, map errors to exit codes.

Exit codes (``exitcodes``): 0 success, 1 the run failed (a worker died, reported an error or
went silent), 2 bad input (also a run record that cannot be created), 3 the run diverged,
4 an internal error, 130 interrupted (Ctrl-C or SIGTERM).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from gasloc_emu import config as C
from gasloc_emu import exitcodes
from gasloc_emu.config import to_toml
from gasloc_emu.report.records import RecordError
from netem.measureplan import MeasureBounds

_MEASURE = MeasureBounds()   # the defaults of `netem measure`'s bounds

_BAD_INPUT = exitcodes.BAD_INPUT


def _fail(msg: str, code: int = _BAD_INPUT) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


# `run` and `simulate` go on from a record's checkpoints (run.checkpoint_every), in its folder
RESUME_OPTION = click.option(
    "--resume", type=click.Path(file_okay=False, exists=True), metavar="RUN_DIR",
    help="Continue a run record from the latest round every worker has a checkpoint of "
         "(run.checkpoint_every), with its own config, in its own folder; a run that was "
         "killed then ends as it would have. On several hosts, give each host its folder of "
         "the run (node k's is RUN_DIR.node<k>; RUN_DIR itself where they share a disk).")


def friendly_errors(fn):
    """Bad input becomes one line on stderr and exit 2, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            _fail("interrupted", exitcodes.INTERRUPTED)
        except Exception as exc:
            if isinstance(exc, _input_errors()):
                _fail(str(exc))
            raise
    return wrapper


# The errors that mean bad input, besides the config's and the record's: (module, class).
_INPUT_ERRORS = (("gasloc_emu.topology", "TopologyError"),
                 ("gasloc_emu.training.data", "DataError"),
                 ("gasloc_emu.training.tokens", "TokenError"),
                 ("gasloc_emu.cluster.roles", "ClusterError"),
                 ("netem.profiles", "ProfileError"),
                 ("netem.capabilities", "CapabilityError"),
                 ("netem.measureplan", "MeasureError"))


def _input_errors() -> tuple[type, ...]:
    """The errors that mean bad input, from the modules already imported: an exception of a
    class is raised only once its module is, and importing the others here would cost a bad
    command line a second of torch (the corpus's module imports it)."""
    loaded = (getattr(sys.modules[mod], name) for mod, name in _INPUT_ERRORS
              if mod in sys.modules)
    return (C.ConfigError, RecordError, *loaded)


def _local_steps(value: str | None):
    if value is None:
        return None
    try:
        parts = [int(v) for v in value.split(",")]
    except ValueError:
        raise C.ConfigError(f"--local-steps {value!r}: expected a number or a comma-separated "
                            "list with one number per worker") from None
    return parts[0] if len(parts) == 1 else parts


def _momentum(value: str | None):
    if value is None or C.auto_factor(value) is not None:
        return value
    try:
        return float(value)
    except ValueError:
        raise C.ConfigError(f"--momentum {value!r}: expected a number, 'auto' or 'auto*F' "
                            "(F in (0, 1])") from None


def _time_scale(value: str | None):
    if value is None or value == "auto":
        return value
    try:
        return float(value)
    except ValueError:
        raise C.ConfigError(f"--time-scale {value!r}: expected a number in [1.0, 1000.0] or "
                            "'auto'") from None


def _outer_lr(value: str | None):
    if value is None or value == C.ONE_MINUS_MOMENTUM:
        return value
    try:
        return float(value)
    except ValueError:
        raise C.ConfigError(f"--outer-lr {value!r}: expected a number or "
                            f"'{C.ONE_MINUS_MOMENTUM}'") from None


# ---------------------------------------------------------------- flags generated from the tree

# One row per setting flag: (flag, dotted key[, short alias]). Help comes from the field's doc,
# choices and ranges from its metadata, the click type from its type hint, so a new setting gets
# a flag on run, simulate and config by adding one row here.
FLAGS: tuple[tuple[str, ...], ...] = (
    ("--algo", "algo.name"),
    ("--topology", "topology.name"),
    ("--workers", "workers", "-n"),
    ("--local-steps", "algo.local_steps", "-H"),
    ("--rounds", "run.rounds", "-R"),
    ("--model", "model.preset"),
    ("--seed", "seed"),
    ("--data", "data.path"),
    ("--outer-lr", "algo.outer_lr"),
    ("--momentum", "algo.momentum"),
    ("--overlap", "algo.overlap"),
    ("--lr", "algo.inner.lr"),
    ("--lr-schedule", "algo.inner.schedule"),
    ("--warmup-steps", "algo.inner.warmup_steps"),
    ("--micro-batches", "algo.inner.micro_batches"),
    ("--precision", "algo.inner.precision"),
    ("--compile", "algo.inner.compile"),
    ("--degree", "topology.degree"),
    ("--eval-every", "run.eval_every"),
    ("--checkpoint-every", "run.checkpoint_every"),
    ("--bw-profile", "net.bw_profile"),
    ("--shaper", "net.shaper"),
    ("--rate-mbit", "net.rate_mbit"),
    ("--latency-ms", "net.latency_ms"),
    ("--jitter-ms", "net.jitter_ms"),
    ("--loss-pct", "net.loss_pct"),
    ("--delay", "net.delay"),
    ("--tcp-cc", "tcp.congestion_control"),
    ("--compute-profile", "compute.profile"),
    ("--step-time-s", "compute.step_time_s"),
    ("--inner-budget-s", "compute.inner_budget_s"),
    ("--scenario", "run.scenario"),
    ("--link-trace", "net.link_trace"),
    ("--placement", "net.placement"),
    ("--cloud-rate", "net.cloud_rate"),
    ("--cloud-missing", "net.cloud_missing"),
    ("--codec", "comm.codec"),
    ("--codec-ratio", "comm.ratio"),
    ("--time-scale", "run.time_scale"),
)
# Rows only `run` has: probing needs real links, which simulate and config never build.
RUN_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--probe", "net.probe"),
    ("--require-faithful", "run.require_faithful"),
)
# Rows only `simulate` has: how the simulator computes, which `run` has no use for.
SIM_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--batched", "sim.batched"),
    ("--timing-only", "sim.timing_only"),
)
# Rows only `sweep` and `crossover` have: where an experiment's runs are made (the engine's
# settings, config.EngineConfig, which no run's config holds).
ENGINE_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--engine", "engine.name"),
    ("--cluster", "engine.cluster"),
    ("--partition", "engine.partition"),
    ("--time-limit-min", "engine.time_limit_min"),
    ("--cpus-per-task", "engine.cpus_per_task"),
    ("--gpus-per-task", "engine.gpus_per_task"),
    ("--mem-gb", "engine.mem_gb"),
    ("--array-parallelism", "engine.array_parallelism"),
    ("--engine-logs", "engine.log_dir"),
)
# Rows only `consensus` has: the per-worker quadratics that stand in for the model there.
CONSENSUS_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--dim", "surrogate.dim"),
    ("--heterogeneity", "surrogate.heterogeneity"),
    ("--surrogate-lr", "surrogate.lr"),
    ("--grad-noise", "surrogate.grad_noise"),
    ("--init-spread", "surrogate.init_spread"),
)
# The flags of FLAGS that `consensus` takes: the algorithm, its graph and H_i, no model or
# network.
CONSENSUS_SHARED = ("--algo", "--topology", "--workers", "--degree", "--local-steps", "--rounds",
                    "--seed", "--outer-lr", "--momentum", "--compute-profile", "--step-time-s",
                    "--inner-budget-s")
# The flags of FLAGS that `netem show` and `netem probe` take: a network needs no model.
NET_FLAGS = ("--bw-profile", "--workers", "--rate-mbit", "--latency-ms", "--seed", "--shaper",
             "--delay", "--placement", "--cloud-rate", "--cloud-missing")
# The flags `compute show` takes: speeds need no model or network.
COMPUTE_FLAGS = ("--compute-profile", "--step-time-s", "--inner-budget-s", "--workers", "--seed")

# Settings whose flag has its own syntax: (parser, metavar). Parsing happens in
# resolve_from_flags, inside friendly_errors, so a bad value is one line like any other.
_PARSERS = {
    "algo.local_steps": (_local_steps, "H|H1,H2,..."),
    "algo.momentum": (_momentum, "GAMMA|auto|auto*F"),
    "algo.outer_lr": (_outer_lr, "ETA|1-momentum"),
    "run.time_scale": (_time_scale, "K|auto"),
}
# Flags that set a setting without naming it as a value, for `config --fields`.
_OTHER_FLAGS = {"run.dashboard": "--no-dashboard (off)"}


class _BadFlag(click.ClickException):
    """A flag value click rejected, shown like all bad input: one line on stderr, exit 2."""

    exit_code = _BAD_INPUT

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class _SettingType:
    """Mixin for the click type of a setting flag.

    A rejected value gets the message ``--set`` would give (key, value, what is allowed) on one
    line, instead of click's usage block, so every way of giving a setting fails alike.
    """

    def __init__(self, key: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.key = key

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            raise _BadFlag(_setting_message(self.key, value, exc)) from None


def _setting_message(key: str, value, exc: click.BadParameter) -> str:
    """The config's own message for ``value``; click's if the config would accept it."""
    try:
        C.check_setting(key, value)
    except C.ConfigError as err:
        return str(err)
    return exc.format_message()


class _Choice(_SettingType, click.Choice):
    pass


class _Int(_SettingType, click.types.IntParamType):
    pass


class _Float(_SettingType, click.types.FloatParamType):
    pass


_TYPES = {int: _Int, float: _Float}


def _dest(flag: str) -> str:
    """The keyword a flag's value arrives under: --rate-mbit -> rate_mbit."""
    return flag.lstrip("-").replace("-", "_")


def _brackets(spec: C.SettingSpec, *, choices: bool) -> str:
    """What a setting accepts, as ' [one of: ...]', ' [range: lo..hi]' and ' [names: ...]'."""
    meta, out = spec.meta, ""
    if choices and meta.get("choices"):
        out += " [one of: " + ", ".join(map(str, meta["choices"])) + "]"
    if meta.get("lo") is not None or meta.get("hi") is not None:
        lo = meta["lo"] if meta["lo"] is not None else "-inf"
        hi = meta["hi"] if meta["hi"] is not None else "inf"
        out += f" [range: {lo}..{hi}]"
    if meta.get("names"):
        out += " [names: " + ", ".join(meta["names"]) + "]"
    return out


def _spelled(flag: str, spec: C.SettingSpec) -> str:
    """A bool setting is a --x/--no-x pair; every other flag takes a value."""
    if spec.hint is bool and spec.key not in _PARSERS:
        return f"{flag}/--no-{flag[2:]}"
    return flag


def _setting_option(flag: str, key: str, short: str | None = None):
    """The click option of one table row; a TypeError names a row the generator cannot type."""
    spec = C.setting_spec(key)
    decls = [d for d in (_spelled(flag, spec), short) if d]
    kwargs = {"default": None, "help": spec.doc + _brackets(spec, choices=False)}
    if key in _PARSERS:
        kwargs["metavar"] = _PARSERS[key][1]
    elif spec.meta.get("choices"):
        kwargs["type"] = _Choice(key, spec.meta["choices"])
    elif spec.hint in _TYPES:
        kwargs["type"] = _TYPES[spec.hint](key)
    elif spec.hint not in (str, bool):
        raise TypeError(f"{flag}: {key} is {spec.hint}; give it a parser in _PARSERS")
    return click.option(*decls, _dest(flag), **kwargs)


def flag_names() -> dict[str, str]:
    """Dotted key -> how to set it on the command line, for `config --fields`."""
    names = dict(_OTHER_FLAGS)
    for rows, where in ((FLAGS, ""), (RUN_FLAGS, " (run)"), (SIM_FLAGS, " (simulate)"),
                        (CONSENSUS_FLAGS, " (consensus)")):
        for flag, key, *short in rows:
            names[key] = ", ".join([*short, _spelled(flag, C.setting_spec(key))]) + where
    return names


def _flag_value(key: str, value):
    parse = _PARSERS.get(key, (None,))[0]
    return parse(value) if parse else value


def _apply(options):
    """One decorator from a list of click options, first option first in --help."""
    def decorate(fn):
        for opt in reversed(options):
            fn = opt(fn)
        return fn
    return decorate


_ROWS = {row[0]: row for row in FLAGS}

RUN_OPTIONS = [
    click.option("--config", "config_file", type=click.Path(dir_okay=False),
                 help="TOML file of settings (a preset in runs/)."),
    *[_setting_option(*row) for row in FLAGS],
    click.option("--out", type=click.Path(file_okay=False), help="Run record folder."),
    click.option("--overwrite", is_flag=True,
                 help="Replace the run record already in --out (else such an --out is refused)."),
    click.option("--no-dashboard", is_flag=True, help="Plain lines instead of the live dashboard."),
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                 help="Any setting, e.g. --set algo.inner.lr=3e-4 (repeatable)."),
]

NET_OPTIONS = [
    click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings."),
    *[_setting_option(*_ROWS[flag]) for flag in NET_FLAGS],
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Any setting."),
]

run_options = _apply(RUN_OPTIONS)
net_options = _apply(NET_OPTIONS)
run_only_options = _apply([_setting_option(*row) for row in RUN_FLAGS])
sim_only_options = _apply([_setting_option(*row) for row in SIM_FLAGS])
engine_options = _apply([_setting_option(*row) for row in ENGINE_FLAGS])


def engine_from_flags(kw: dict, from_data: str | None) -> C.EngineConfig:
    """The engine's settings from its flags (popped from ``kw``); none with --from-data, which
    makes no run."""
    given = {key: kw.pop(_dest(flag), None) for flag, key, *_ in ENGINE_FLAGS}
    if from_data and any(v is not None for v in given.values()):
        flags = [flag for flag, key, *_ in ENGINE_FLAGS if given[key] is not None]
        raise click.UsageError(f"{', '.join(flags)} choose where runs are made; --from-data "
                               "runs nothing")
    return C.resolve_engine(given)


def resolve_from_flags(kw: dict) -> C.Config:
    """Defaults < --config file < flags < --set; a flag not given (None) keeps the file's value."""
    overrides = {key: _flag_value(key, kw.get(_dest(flag)))
                 for flag, key, *_ in (*FLAGS, *RUN_FLAGS, *SIM_FLAGS, *CONSENSUS_FLAGS)}
    if kw.get("no_dashboard"):
        overrides["run.dashboard"] = "off"
    return C.resolve(kw.get("config_file"), overrides, kw.get("sets", ()))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gasloc-emu")
def main() -> None:
    """Emulate decentralized LLM pretraining (GASLoC, DiLoCo, gossip) over shaped networks."""


@main.command()
@run_options
@sim_only_options
@click.option("--replay", type=click.Path(file_okay=False, exists=True), metavar="RUN_DIR",
              help="Simulate a run record again with its config and the rounds its timed "
                   "leaves, joins and partitions landed on: that run's losses.")
@RESUME_OPTION
@friendly_errors
def simulate(replay: str | None, resume: str | None, **kw) -> None:
    """Run all N workers in one process (in-memory transport, virtual clock)."""
    from gasloc_emu.commands.app import simulate_command
    from gasloc_emu.simulator.simulate import replay_source
    if replay is not None and resume is not None:
        raise click.UsageError("--replay and --resume are two different runs; give one")
    source = None
    if replay is not None:
        source = replay_source(_record_only("--replay", replay, kw))
        cfg = source.cfg
        cfg = _dashboard_flag(cfg, kw)
    elif resume is not None:
        cfg = _dashboard_flag(C.resolve(Path(_record_only("--resume", resume, kw, ("out",)))
                                        / "config.toml"), kw)
    else:
        cfg = resolve_from_flags(kw)
    sys.exit(simulate_command(cfg, kw.get("out"), kw.get("overwrite", False), resume=resume,
                              replay=source))


def _record_only(flag: str, run_dir: str, kw: dict, also: tuple[str, ...] = ()) -> str:
    """``run_dir``, when no flag besides the record's own was given with ``flag``."""
    allowed = {"out", "overwrite", "no_dashboard"} - set(also)
    given = sorted(k for k, v in kw.items()
                   if v not in (None, (), False) and k not in allowed)
    if given:
        raise click.UsageError(f"{flag} takes the run's own config; drop {given}")
    return run_dir


def _dashboard_flag(cfg, kw: dict):
    return C.replace(cfg, **{"run.dashboard": "off"} if kw.get("no_dashboard") else {})


# One node agent per host, named as torchrun names them; under torchrun or Slurm they come from
# the environment instead (cluster.resolve_role). Node-local, so not settings of the config.
NODE_OPTIONS = [
    click.option("--nnodes", type=click.IntRange(1, 4096),
                 help="Hosts in the run (one `gasloc-emu run` per host)."),
    click.option("--node-rank", type=click.IntRange(0, 4095),
                 help="This host's node rank; node 0 keeps the record."),
    click.option("--master-addr", help="Node 0's address: the store and the control plane."),
    click.option("--master-port", type=click.IntRange(1, 65535),
                 help="The store's port on node 0 (default 29400)."),
    click.option("--nproc-per-node", type=click.IntRange(1, 4096),
                 help="Workers on this host (default: GPUs visible, else an even share)."),
    click.option("--secret-file", type=click.Path(dir_okay=False),
                 help="File with the run's shared secret, readable on every host (else "
                      "GASLOC_SECRET); the keys of both planes derive from it."),
]
_NODE_KEYS = ("nnodes", "node_rank", "master_addr", "master_port", "nproc_per_node")


@main.command()
@run_options
@run_only_options
@_apply(NODE_OPTIONS)
@click.option("--dry-run", is_flag=True, help="Print the network commands and stop.")
@RESUME_OPTION
@friendly_errors
def run(dry_run: bool, resume: str | None, **kw) -> None:
    """Start N worker processes that train over a real (shaped) network, on one host or many."""
    import os

    from gasloc_emu.cluster.roles import resolve_role
    from gasloc_emu.commands.app import run_command
    from gasloc_emu.emulator.network import enter_userns_if_needed
    role = resolve_role({k: kw.get(k) for k in _NODE_KEYS}, os.environ)
    if resume is not None:
        if dry_run:
            raise click.UsageError("--resume continues a run; drop --dry-run")
        if role.multi:   # this host's folder of the run: node k's is <record>.node<k>
            from gasloc_emu.cluster.roles import resume_folder
            resume = str(resume_folder(resume, role.node_rank))
            if not Path(resume, "config.toml").is_file():
                raise click.UsageError(f"--resume: {resume} holds no run of node "
                                       f"{role.node_rank} (no config.toml)")
        cfg = _dashboard_flag(C.resolve(Path(_record_only(
            "--resume", resume, {k: v for k, v in kw.items()
                                 if k not in (*_NODE_KEYS, "secret_file")},
            ("out", "overwrite"))) / "config.toml"), kw)
    else:
        cfg = resolve_from_flags(kw)
    if kw.get("secret_file") and not role.multi:
        # a single-host run draws a fresh secret that never leaves its own processes; taking
        # one from a file instead would be weaker, and ignoring the flag would be silent
        raise click.UsageError(f"--secret-file {kw['secret_file']} is for runs on several "
                               "hosts (--nnodes > 1); a run on one host draws its own secret. "
                               "Drop --secret-file")
    if not role.multi:
        enter_userns_if_needed(cfg, sys.argv[1:], dry_run)
    sys.exit(run_command(cfg, kw.get("out"), dry_run=dry_run,
                         overwrite=kw.get("overwrite", False), role=role,
                         secret_file=kw.get("secret_file"), resume=resume))


@main.command()
@click.option("--topology", required=True, help="Graph name.")
@click.option("--workers", "-n", required=True, type=int, help="Number of workers N.")
@click.option("--degree", type=int, default=4, show_default=True, help="Expander degree d.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--alpha", type=float, default=1.0, show_default=True)
@click.option("--base", default="complete", show_default=True, help="Base graph of matchings.")
@click.option("--round", "round_idx", type=int, default=0, show_default=True,
              help="Which round's matching to show.")
@friendly_errors
def topo(**kw) -> None:
    """Print a graph's neighbours, mixing matrix, lambda_2, spectral gap and gamma*."""
    from gasloc_emu.commands.app import topo_command
    topo_command(**kw)


@main.command("config")
@run_options
@click.option("--fields", "list_fields", is_flag=True, help="List every setting with its doc.")
@click.option("--plan", "show_plan", is_flag=True,
              help="Also print the derived run plan (algorithm, graph, compute, links, the "
                   "model simulate times them by, scenario) as comments after the settings.")
@click.option("--plan-json", "plan_json", is_flag=True,
              help="Print the settings and the derived plan as one JSON object instead.")
@friendly_errors
def config_cmd(list_fields: bool, show_plan: bool, plan_json: bool, **kw) -> None:
    """Print the resolved config as TOML (defaults < --config file < flags < --set)."""
    if list_fields:
        _list_fields()
        return
    cfg = resolve_from_flags(kw)
    if show_plan or plan_json:
        from gasloc_emu.commands.app import plan_command
        plan_command(cfg, to_toml(cfg), as_json=plan_json)
        return
    click.echo(to_toml(cfg), nl=False)


def _list_fields() -> None:
    """Every setting: key, flag (where one exists), default, doc and what it accepts."""
    flags = flag_names()
    specs = C.setting_specs()
    width = max(26, *(len(spec.key) for spec in specs))
    click.echo(f"{'KEY (--set KEY=VALUE)':{width}} {'FLAG':24} {'DEFAULT':12} DOC [ALLOWED]")
    for spec in specs:
        click.echo(f"{spec.key:{width}} {flags.get(spec.key, '-'):24} {spec.default!r:12} "
                   f"{spec.doc}{_brackets(spec, choices=True)}")


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path())
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="Write loss against rounds and against seconds to this PNG.")
@click.option("--target-loss", type=float, help="Report the time to reach this eval loss.")
@friendly_errors
def compare(run_dirs: tuple[str, ...], plot_file: str | None, target_loss: float | None) -> None:
    """Compare run records side by side (table, and a plot with --plot)."""
    from gasloc_emu.commands.app import compare_command
    sys.exit(compare_command(run_dirs, plot_file, target_loss))


@main.command()
@click.argument("run_dir", type=click.Path())
@friendly_errors
def show(run_dir: str) -> None:
    """The summary of one run and its links (configured vs measured)."""
    from gasloc_emu.commands.app import show_command
    sys.exit(show_command(run_dir))


@main.command()
@click.argument("run_dir", type=click.Path())
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False),
              help="Write the rows here (default RUN/metrics.csv when --tensorboard is not "
                   "given).")
@click.option("--tensorboard", "tb_dir", type=click.Path(file_okay=False),
              help="Write TensorBoard scalars (worker<k>/<column> by round) into this folder "
                   "(needs the 'tensorboard' extra).")
@click.option("--peak-tflops", type=float, default=0.08, show_default=True,
              help="One worker's peak TFLOP/s for MFU (default: one AVX2 CPU core's fp32 "
                   "peak; e.g. 312 for an A100's bf16, 989 for an H100 SXM's).")
@friendly_errors
def export(run_dir: str, csv_file: str | None, tb_dir: str | None, peak_tflops: float) -> None:
    """A run's metrics as CSV or TensorBoard, one row per worker per round, with tokens per
    second and model FLOPs utilisation (MFU)."""
    from gasloc_emu.commands.app import export_command
    sys.exit(export_command(run_dir, csv_file, tb_dir, peak_tflops))


def _report_options(example: str):
    """--report and --from-data, as the experiment commands share them."""
    return _apply([
        click.option("--report", type=click.Path(dir_okay=False),
                     help="Write the experiment's section (with its plots and data file) into "
                          "a results page, e.g. docs/RESULTS.md."),
        click.option("--from-data", type=click.Path(dir_okay=False, exists=True),
                     help=f"Rebuild the report (tables, plots, verdicts) from its data file, "
                          f"e.g. {example}, without running anything.")])


@main.command()
@click.argument("preset", type=click.Path(dir_okay=False, exists=True), required=False)
@click.option("--out", type=click.Path(file_okay=False),
              help="Where the runs go (default runs/sweep-<preset>); a finished run with the "
                   "same settings is reused.")
@click.option("--arm", "arms", multiple=True, help="Run only these arms (repeatable).")
@_report_options("docs/results/h1-search.jsonl")
@engine_options
@friendly_errors
def sweep(preset: str | None, out: str | None, arms: tuple[str, ...], report: str | None,
          from_data: str | None, **kw) -> None:
    """Run every arm of a preset over its seeds, with the same tuning for each arm."""
    if (preset is None) == (from_data is None):
        raise click.UsageError("give a PRESET to run, or --from-data FILE to rebuild from")
    if from_data and arms:
        raise click.UsageError("--arm chooses arms to run; --from-data runs nothing")
    engine = engine_from_flags(kw, from_data)
    from gasloc_emu.commands.app import sweep_command
    sys.exit(sweep_command(preset, out, arms, report, from_data, engine))


@main.command()
@click.argument("preset", type=click.Path(dir_okay=False, exists=True), required=False)
@click.option("--out", type=click.Path(file_okay=False),
              help="Where the runs go (default runs/crossover-<preset>); a finished run with "
                   "the same settings is reused.")
@_report_options("docs/results/crossover.jsonl")
@engine_options
@friendly_errors
def crossover(preset: str | None, out: str | None, report: str | None,
              from_data: str | None, **kw) -> None:
    """At each link rate and step time of a preset's grid, which of its algorithms reaches the
    target loss first, each against a baseline (simulated; a few points checked in the
    emulator)."""
    if (preset is None) == (from_data is None):
        raise click.UsageError("give a PRESET to run, or --from-data FILE to rebuild from")
    engine = engine_from_flags(kw, from_data)
    from gasloc_emu.commands.app import crossover_command
    sys.exit(crossover_command(preset, out, report, from_data, engine))


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings.")
@_apply([_setting_option(*_ROWS[flag]) for flag in CONSENSUS_SHARED])
@_apply([_setting_option(*row) for row in CONSENSUS_FLAGS])
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Any setting, e.g. --set algo.alpha=0.5 (repeatable).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="Write the run here as versioned JSON: settings, lambda_2, predicted and "
                   "measured rates, and every round's consensus distance and loss gaps.")
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False),
              help="Write one row per round here: round, consensus, loss_gap, worker_gap.")
@friendly_errors
def consensus(out_file: str | None, csv_file: str | None, **kw) -> None:
    """Consensus distance and loss of the algorithms' outer rules on per-worker quadratics,
    all workers as one array (thousands in seconds), with the rate W's spectrum predicts."""
    from gasloc_emu.commands.app import consensus_command
    sys.exit(consensus_command(resolve_from_flags(kw), out_file, csv_file))


@main.group()
def data() -> None:
    """Tokenised corpora: a subword tokenizer trained here, memory-mapped token files."""


@data.command("prepare")
@click.option("--corpus", default="pydoc-topics", show_default=True,
              help="What to tokenise: pydoc-topics (the Python reference's English help texts, "
                   "shipped with Python), stdlib (its sources), or a text file or folder.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="The folder to write (meta.json, tokenizer.json, train.bin, val.bin); "
                   "then --data FOLDER.")
@click.option("--vocab-size", type=int, default=4096, show_default=True,
              help="Token ids of the byte-level BPE tokenizer trained on the corpus.")
@click.option("--val-fraction", type=float, default=0.05, show_default=True,
              help="Share of the tokens held out for evaluation.")
@click.option("--max-corpus-mb", type=float, default=64.0, show_default=True,
              help="Cap on the text read, in MiB.")
@friendly_errors
def data_prepare(corpus: str, out: str, vocab_size: int, val_fraction: float,
                 max_corpus_mb: float) -> None:
    """Train a byte-level BPE tokenizer on a local corpus and write its tokens (uint16, or
    uint32 past 65536 ids) with a held-out split and a JSON header."""
    from gasloc_emu.commands.app import data_prepare_command
    data_prepare_command(corpus, out, vocab_size, val_fraction, max_corpus_mb)


@main.group()
def compute() -> None:
    """Worker speed profiles of the compute model."""


@compute.command("show")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings.")
@_apply([_setting_option(*_ROWS[flag]) for flag in COMPUTE_FLAGS])
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Any setting.")
@friendly_errors
def compute_show(**kw) -> None:
    """Print each worker's speed and nominal step time under a compute profile."""
    from gasloc_emu.commands.app import compute_show_command
    compute_show_command(resolve_from_flags(kw))


@main.group()
def netem() -> None:
    """Bandwidth profiles, link probes and cleanup of the emulated network."""


@netem.command("show")
@net_options
@friendly_errors
def netem_show(**kw) -> None:
    """Print a profile's links (rate, latency, caps) and the shaper this machine would use."""
    from gasloc_emu.commands.app import netem_show_command
    netem_show_command(resolve_from_flags(kw))


@netem.command("probe")
@net_options
@click.option("--topology", help="Only the links this graph uses (default: every directed link).")
@click.option("--seconds", type=float, default=2.0, show_default=True, help="Per link.")
@friendly_errors
def netem_probe(seconds: float, **kw) -> None:
    """Build the shaped network and measure each link: configured vs measured."""
    from gasloc_emu.commands.app import netem_probe_command
    from gasloc_emu.emulator.network import enter_userns_if_needed
    cfg = resolve_from_flags(kw)
    enter_userns_if_needed(cfg, sys.argv[1:], False)
    sys.exit(netem_probe_command(cfg, seconds, bool(kw.get("topology"))))


@netem.command("measure")
@_apply([opt for key, opt in zip((*_NODE_KEYS, "secret_file"), NODE_OPTIONS, strict=True)
         if key != "nproc_per_node"])
@click.option("--out", default="measured-profile.json", show_default=True,
              type=click.Path(dir_okay=False),
              help="The profile file node 0 writes (JSON), for --bw-profile.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--max-bytes-per-pair", type=int, default=_MEASURE.max_bytes_per_pair,
              show_default=True, help="At most this many bytes per directed pair's transfer.")
@click.option("--max-seconds-per-pair", type=float,
              default=_MEASURE.max_seconds_per_pair, show_default=True,
              help="At most this long per directed pair (pings, transfer and report).")
@click.option("--max-seconds", type=float, default=_MEASURE.max_seconds,
              show_default=True, help="At most this long for all pairs together.")
@click.option("--pings", type=int, default=_MEASURE.pings, show_default=True,
              help="Request/response pings per pair (for the RTT).")
@click.option("--hosts", "allow_hosts", help="Comma-separated allowlist of host names or "
              "addresses: refuse to measure if a node publishes an address not on it.")
@click.option("--loss-from", type=click.Choice(["zero", "retransmits"]), default="zero",
              show_default=True, help="What the file's loss_pct is: zero (the retransmit "
              "share is recorded beside it) or the sender's retransmit share.")
@click.option("--worker-placement", "worker_placement", type=click.Choice(["cycle", "blocks"]),
              default="cycle", show_default=True, help="How the file maps a run's workers to "
              "the hosts: worker i on host i mod N (cycle), or in blocks.")
@friendly_errors
def netem_measure(**kw) -> None:
    """Measure every directed pair of the hosts this runs on (one per host, launched like a
    multi-node run) and write a profile file for --bw-profile."""
    from gasloc_emu.commands.app import netem_measure_command
    sys.exit(netem_measure_command(kw))


@netem.command("clean")
@click.option("--dry-run", is_flag=True, help="Only print what would be removed.")
def netem_clean(dry_run: bool) -> None:
    """Remove what killed runs left: root-mode namespaces, and the tc roots that multi-node runs
    put on this host's interfaces (user-namespace runs leave nothing)."""
    from netem.hosttc import clean_host_leftovers
    from netem.namespaces import clean_leftovers
    done = clean_leftovers(dry_run=dry_run, echo=click.echo)
    done += clean_host_leftovers(dry_run=dry_run, echo=click.echo)
    click.echo(f"{len(done)} commands {'would run' if dry_run else 'ran'}; "
               + ("nothing left behind" if not done else "leftovers removed"))


def run_cli(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code; Ctrl-C anywhere in it is exit 130.

    click's own handling would print "Aborted!" and exit 1 for a Ctrl-C outside a command
    (while it parses, or imports what a command needs); interrupted is 130 everywhere.
    """
    try:
        rv = main.main(args=argv, prog_name="gasloc-emu", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("error: interrupted", err=True)
        return exitcodes.INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return rv if isinstance(rv, int) else exitcodes.OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_cli())
