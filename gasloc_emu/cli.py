"""Command line: parse, resolve the config, call one function, map errors to exit codes.

Exit codes: 0 success, 1 the run failed (a worker died, a link was lost), 2 bad input.
"""
from __future__ import annotations

import functools
import sys

import click

from . import config as C

_BAD_INPUT = 2


def _fail(msg: str, code: int = _BAD_INPUT) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


def friendly_errors(fn):
    """Bad input becomes one line on stderr and exit 2, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .data import DataError
        from .topology import TopologyError
        try:
            return fn(*args, **kwargs)
        except (C.ConfigError, TopologyError, DataError, *_netem_errors()) as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            _fail("interrupted", 130)
    return wrapper


def _netem_errors() -> tuple[type, ...]:
    from netem.capabilities import CapabilityError
    from netem.profiles import ProfileError
    return ProfileError, CapabilityError


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
    if value is None or value == "auto":
        return value
    try:
        return float(value)
    except ValueError:
        raise C.ConfigError(f"--momentum {value!r}: expected a number or 'auto'") from None


RUN_OPTIONS = [
    click.option("--config", "config_file", type=click.Path(dir_okay=False),
                 help="TOML file of settings (a preset in runs/)."),
    click.option("--algo", help="gasloc, diloco, dsgd or local-gossip."),
    click.option("--topology", help="ring, torus, exponential, expander, complete, matching, matching2."),
    click.option("--workers", "-n", type=int, help="Number of workers N."),
    click.option("--local-steps", "-H", help="Inner steps per round: N, or one per worker 10,5,..."),
    click.option("--rounds", "-R", type=int, help="Outer rounds."),
    click.option("--model", help="tiny, small or gpt2."),
    click.option("--seed", type=int, help="Seed for init, data, graphs and matchings."),
    click.option("--data", help="Text file, folder, or .bin uint16 token file (default: stdlib)."),
    click.option("--outer-lr", type=float, help="Outer learning rate eta."),
    click.option("--momentum", help="Outer momentum gamma, or 'auto' for gamma*."),
    click.option("--lr", type=float, help="Inner AdamW learning rate."),
    click.option("--degree", type=int, help="Expander degree d."),
    click.option("--eval-every", type=int, help="Evaluate every K rounds (0: only at the end)."),
    click.option("--bw-profile", help="uniform, skewed, two-cluster, lognormal, or a profile file."),
    click.option("--shaper", type=click.Choice(C.SHAPERS), help="How links are shaped."),
    click.option("--rate-mbit", type=float, help="Fast link rate, Mbit/s."),
    click.option("--latency-ms", type=float, help="One-way latency of every link, ms."),
    click.option("--out", type=click.Path(file_okay=False), help="Run record folder."),
    click.option("--no-dashboard", is_flag=True, help="Plain lines instead of the live dashboard."),
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                 help="Any setting, e.g. --set algo.inner.lr=3e-4 (repeatable)."),
]

_FLAG_KEYS = {
    "algo": "algo.name", "topology": "topology.name", "workers": "workers",
    "rounds": "run.rounds", "model": "model.preset", "seed": "seed", "data": "data.path",
    "outer_lr": "algo.outer_lr", "lr": "algo.inner.lr", "degree": "topology.degree",
    "eval_every": "run.eval_every", "bw_profile": "net.bw_profile", "shaper": "net.shaper",
    "rate_mbit": "net.rate_mbit", "latency_ms": "net.latency_ms",
}


def run_options(fn):
    for opt in reversed(RUN_OPTIONS):
        fn = opt(fn)
    return fn


def resolve_from_flags(kw: dict) -> C.Config:
    overrides = {key: kw.get(flag) for flag, key in _FLAG_KEYS.items()}
    overrides["algo.local_steps"] = _local_steps(kw.get("local_steps"))
    overrides["algo.momentum"] = _momentum(kw.get("momentum"))
    if kw.get("no_dashboard"):
        overrides["run.dashboard"] = "off"
    return C.resolve(kw.get("config_file"), overrides, kw.get("sets", ()))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gasloc-emu")
def main() -> None:
    """Emulate decentralized LLM pretraining (GASLoC, DiLoCo, gossip) over shaped networks."""


@main.command()
@run_options
@friendly_errors
def simulate(**kw) -> None:
    """Run all N workers in one process (in-memory transport, virtual clock)."""
    from .app import simulate_command
    sys.exit(simulate_command(resolve_from_flags(kw), kw.get("out")))


@main.command()
@run_options
@click.option("--probe/--no-probe", default=None,
              help="Measure every used link before training (default: on for shaped runs).")
@click.option("--dry-run", is_flag=True, help="Print the network commands and stop.")
@friendly_errors
def run(probe: bool, dry_run: bool, **kw) -> None:
    """Start N worker processes that train over a real (shaped) network."""
    from .app import run_command
    from .netplan import enter_userns_if_needed
    cfg = resolve_from_flags(kw)
    if probe is not None:
        cfg = C.replace(cfg, **{"net.probe": probe})
    enter_userns_if_needed(cfg, sys.argv[1:], dry_run)
    sys.exit(run_command(cfg, kw.get("out"), dry_run=dry_run))


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
    from .app import topo_command
    topo_command(**kw)


@main.command("config")
@run_options
@click.option("--fields", "list_fields", is_flag=True, help="List every setting with its doc.")
@friendly_errors
def config_cmd(list_fields: bool, **kw) -> None:
    """Print the resolved config as TOML (defaults < --config file < flags < --set)."""
    if list_fields:
        for key, default, doc in C.field_docs():
            click.echo(f"{key:28} {default!r:14} {doc}")
        return
    click.echo(C.to_toml(resolve_from_flags(kw)), nl=False)


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path())
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="Write loss against rounds and against seconds to this PNG.")
@click.option("--target-loss", type=float, help="Report the time to reach this eval loss.")
@friendly_errors
def compare(run_dirs: tuple[str, ...], plot_file: str | None, target_loss: float | None) -> None:
    """Compare run records side by side (table, and a plot with --plot)."""
    from .app import compare_command
    sys.exit(compare_command(run_dirs, plot_file, target_loss))


@main.command()
@click.argument("run_dir", type=click.Path())
@friendly_errors
def show(run_dir: str) -> None:
    """The summary of one run and its links (configured vs measured)."""
    from .app import show_command
    sys.exit(show_command(run_dir))


@main.command()
@click.argument("preset", type=click.Path(dir_okay=False, exists=True))
@click.option("--out", type=click.Path(file_okay=False),
              help="Where the runs go (default runs/sweep-<preset>); finished runs are reused.")
@click.option("--arm", "arms", multiple=True, help="Run only these arms (repeatable).")
@click.option("--report", type=click.Path(dir_okay=False),
              help="Write this experiment's section into a results page, e.g. docs/RESULTS.md.")
@friendly_errors
def sweep(preset: str, out: str | None, arms: tuple[str, ...], report: str | None) -> None:
    """Run every arm of a preset over its seeds, with the same tuning for each arm."""
    from .app import sweep_command
    sys.exit(sweep_command(preset, out, arms, report))


@main.group()
def netem() -> None:
    """Bandwidth profiles, link probes and cleanup of the emulated network."""


NET_OPTIONS = [
    click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings."),
    click.option("--bw-profile", help="uniform, skewed, skewed-worker, two-cluster, lognormal, or a file."),
    click.option("--workers", "-n", type=int, help="Number of workers N."),
    click.option("--rate-mbit", type=float, help="Fast link rate, Mbit/s."),
    click.option("--latency-ms", type=float, help="One-way latency of every link, ms."),
    click.option("--seed", type=int, help="Seed of seeded profiles."),
    click.option("--shaper", type=click.Choice(C.SHAPERS), help="How links are shaped."),
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Any setting."),
]


def net_options(fn):
    for opt in reversed(NET_OPTIONS):
        fn = opt(fn)
    return fn


@netem.command("show")
@net_options
@friendly_errors
def netem_show(**kw) -> None:
    """Print a profile's links (rate, latency, caps) and the shaper this machine would use."""
    from .app import netem_show_command
    netem_show_command(resolve_from_flags(kw))


@netem.command("probe")
@net_options
@click.option("--topology", help="Only the links this graph uses (default: every directed link).")
@click.option("--seconds", type=float, default=2.0, show_default=True, help="Per link.")
@friendly_errors
def netem_probe(seconds: float, **kw) -> None:
    """Build the shaped network and measure each link: configured vs measured."""
    from .app import netem_probe_command
    from .netplan import enter_userns_if_needed
    cfg = resolve_from_flags(kw)
    enter_userns_if_needed(cfg, sys.argv[1:], False)
    sys.exit(netem_probe_command(cfg, seconds, bool(kw.get("topology"))))


@netem.command("clean")
@click.option("--dry-run", is_flag=True, help="Only print what would be removed.")
def netem_clean(dry_run: bool) -> None:
    """Remove namespaces left by killed root-mode runs (user-namespace runs leave nothing)."""
    from netem.namespaces import clean_leftovers
    done = clean_leftovers(dry_run=dry_run, echo=click.echo)
    click.echo(f"{len(done)} commands {'would run' if dry_run else 'ran'}; "
               + ("nothing left behind" if not done else "leftovers removed"))


if __name__ == "__main__":  # pragma: no cover
    main()
