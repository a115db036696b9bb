"""The bodies of the CLI commands: build what a command needs, run it, print the outcome."""
from __future__ import annotations

import contextlib
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from gasloc_emu import exitcodes
from gasloc_emu.config import Config, ConfigError, EngineConfig, to_dict
from gasloc_emu.emulator.network import open_network
from gasloc_emu.experiments import data as data_file
from gasloc_emu.experiments.engines import EngineError, make_engine
from gasloc_emu.experiments.page import markdown_section, update_results_page
from gasloc_emu.experiments.sweep import build_report, run_sweep
from gasloc_emu.netplan import shaped, shaping_decision, used_pairs
from gasloc_emu.report.compare import (
    CompareError,
    compare_table,
    links_table,
    load_run,
    plot,
    show_run,
)
from gasloc_emu.report.dashboard import LiveView
from gasloc_emu.report.dashboard_state import header_from_plan
from gasloc_emu.report.fmt import summary_lines
from gasloc_emu.report.records import check_resumable, new_run_dir, resume_point
from gasloc_emu.topology import Topology
from gasloc_emu.training.devices import simulator_device
from netem.probe import probe_links


class RoundPrinter:
    """Plain progress: one line per completed round (all workers reported), for logs and pipes."""

    def __init__(self, workers: int, rounds: int, echo=click.echo,
                 alive: Callable[[int], int] | None = None):
        """``alive(t)``: how many workers report round t (a scenario's departures and joins
        change it); default: all of them."""
        self.workers, self.rounds, self.echo = workers, rounds, echo
        self.alive = alive or (lambda t: workers)
        self.rows: dict[int, list[dict]] = defaultdict(list)

    def __call__(self, row: dict) -> None:
        if row.get("kind"):  # status, links, warnings: only the dashboard shows them
            if row["kind"] in ("warning", "event"):
                self.echo(f"{row['kind']}: {row['text']}")
            return
        rows = self.rows[row["round"]]
        rows.append(row)
        if len(rows) == self.alive(row["round"]):
            self.echo(format_round(self.rows.pop(row["round"]), self.rounds))

    def __enter__(self) -> RoundPrinter:  # used like the live dashboard
        return self

    def __exit__(self, *exc) -> None:
        return None


def format_round(rows: list[dict], rounds: int) -> str:
    loss = np.array([r["train_loss"] for r in rows], dtype=float)
    ev = [r["eval_loss"] for r in rows if r.get("eval_loss") is not None]
    parts = [f"round {rows[0]['round'] + 1}/{rounds}",
             f"step {max(r['step'] for r in rows)}",
             f"train {np.nanmean(loss):.4f} ± {np.nanstd(loss):.4f}" if not np.isnan(loss).all()
             else "train -",
             f"eval {np.mean(ev):.4f}" if ev else None,
             f"time {max(r.get('time_s', 0.0) for r in rows):.2f}s",
             f"wait {max(r['wait_s'] for r in rows):.2f}s",
             f"sent {sum(r['bytes_sent'] for r in rows) / 1e6:.2f}MB"]
    return "  ".join(p for p in parts if p)


def use_dashboard(cfg: Config) -> bool:
    mode = cfg.run.dashboard
    return mode == "on" or (mode == "auto" and sys.stdout.isatty())


def simulate_command(cfg: Config, out: str | None, overwrite: bool = False,
                     resume: str | None = None, replay=None) -> int:
    """``replay``: a run record's ``simulate.ReplaySource`` (``--replay``): its rounds for its
    timed leaves, joins and partitions, played instead of fixing them on the virtual clock,
    its random faults as drawn (not drawn again) and each worker's CPU threads; ``resume``: a
    run record whose checkpoints this simulation goes on from, in its folder (``--resume``)."""
    from gasloc_emu.simulator.simulate import simulate
    from gasloc_emu.training.worker import Diverged
    if cfg.sim.timing_only:
        return timing_command(cfg, out, overwrite, resume, replay)
    plan = _plan(cfg, faults=replay.faults if replay is not None else _recorded(resume))
    if replay is not None and (replay.fixings or replay.losses):
        replay.play(plan.world)   # with the hosts the run lost and took back, as decided
    if resume is not None:
        from gasloc_emu.plan import refuse_resume
        refuse_resume(plan, resume)
    point = resume_point(resume, cfg) if resume is not None else None
    path = Path(resume) if resume is not None else \
        new_run_dir(cfg, out, overwrite, plan.run_label())
    device = simulator_device(cfg.run.device)
    progress = make_progress(plan, devices=[device] * cfg.workers,
                             shaper="virtual clock" if plan.link_model else "none")
    try:
        with progress:
            summary = simulate(plan, path, progress=progress, device=device, resume=point,
                               threads=replay.threads if replay is not None else None,
                               dead=replay.dead if replay is not None else frozenset())
    except Diverged as exc:
        click.echo(f"error: {exc}; record: {path}", err=True)
        return exitcodes.DIVERGED
    except Exception as exc:  # noqa: BLE001 - a failed run is reported, its record kept
        click.echo(f"error: simulation failed: {exc}; record: {path}", err=True)
        return exitcodes.RUN_FAILED
    _echo_lines(summary_lines(summary, path))
    return exitcodes.OK


def timing_command(cfg: Config, out: str | None, overwrite: bool, resume: str | None,
                   replay) -> int:
    """``simulate --timing-only``: the run's timeline without training (``simulator.timing``);
    what it does not time is refused (exit 2) before a run folder exists."""
    from gasloc_emu.simulator import timing
    if resume is not None or replay is not None:
        raise ConfigError("simulate --timing-only: --resume and --replay go on from or replay "
                          "a training run's record; give neither")
    plan = _plan(cfg, data=False)
    timing.check(plan)
    path = new_run_dir(cfg, out, overwrite, plan.run_label())
    try:
        summary = timing.simulate_timing(plan, path)
    except Exception as exc:  # noqa: BLE001 - a failed run is reported, its record kept
        click.echo(f"error: timing simulation failed: {exc}; record: {path}", err=True)
        return exitcodes.RUN_FAILED
    _echo_lines(summary_lines(summary, path))
    return exitcodes.OK


def _recorded(resume: str | None):
    """A resumed run's random faults as its record has them (faults.json), not drawn again;
    None for a new run or a record without."""
    if resume is None:
        return None
    from gasloc_emu.plan import recorded_faults
    return recorded_faults(resume)


def _plan(cfg: Config, data: bool = True, faults=None):
    """The run plan (every bad input refused here), its warnings printed."""
    from gasloc_emu.plan import build_plan
    plan = build_plan(cfg, data=data, faults=faults)
    for text in plan.warnings:
        click.echo(f"warning: {text}", err=True)
    return plan


def plan_command(cfg: Config, settings_toml: str, as_json: bool) -> None:
    """The settings and what they make of the run (``RunPlan.describe``): every bad input is
    refused as ``run`` would refuse it, before anything is built."""
    from gasloc_emu.report.plan_view import plan_lines
    plan = _plan(cfg, data=False)
    described = plan.describe()
    if as_json:
        click.echo(json.dumps({"settings": to_dict(cfg), "plan": described}, indent=2))
        return
    click.echo(settings_toml, nl=False)
    click.echo()
    _echo_lines(plan_lines(described, used_pairs(cfg, plan.topology)))


def _echo_lines(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)


def make_progress(plan, devices=(), shaper: str | None = None):
    """The live dashboard on a TTY (unless switched off), else one plain line per round."""
    cfg = plan.cfg
    if use_dashboard(cfg):
        return LiveView(header_from_plan(plan, devices=devices, shaper=shaper))
    return RoundPrinter(cfg.workers, cfg.run.rounds, alive=_alive_counts(plan))


def _alive_counts(plan) -> Callable[[int], int] | None:
    """How many workers take part in each round, when a scenario changes it."""
    world = plan.world
    if world is None or not world.churns or world.fixer is not None:
        return None   # by time: not known before the run
    counts = [len(world.alive(t)) for t in range(plan.cfg.run.rounds)]
    return counts.__getitem__


def run_command(cfg: Config, out: str | None, dry_run: bool = False,
                overwrite: bool = False, role=None, secret_file: str | None = None,
                resume: str | None = None) -> int:
    """``resume``: a run record whose checkpoints this run goes on from, in its folder."""
    from gasloc_emu.emulator.zygote import Zygote
    if role is not None and role.multi:
        return _run_node(cfg, out, dry_run, overwrite, role, secret_file, resume)
    # the workers' zygote imports torch on another core while this process plans the run
    with contextlib.nullcontext() if dry_run else Zygote() as zygote:
        from gasloc_emu.emulator.launcher import launch
        plan = _plan(cfg, data=not dry_run, faults=_recorded(resume))
        # refused before anything runs
        if resume is not None:
            from gasloc_emu.plan import refuse_resume
            refuse_resume(plan, resume)
        point = resume_point(resume, cfg) if resume is not None else None
        path = Path(resume) if resume is not None else \
            None if dry_run else new_run_dir(cfg, out, overwrite, plan.run_label())
        result = launch(plan, path, dry_run=dry_run, zygote=zygote, resume=point,
                        progress_factory=lambda devices, shaper: make_progress(plan, devices,
                                                                               shaper),
                        log=lambda line: click.echo(line, err=True))
    return _report(result)


def _run_node(cfg: Config, out: str | None, dry_run: bool, overwrite: bool, role,
              secret_file: str | None, resume: str | None = None) -> int:
    """One node of a multi-node run; node 0 keeps the record and shows the dashboard.
    ``resume``: this host's folder of the run to go on from (``cluster.resume_folder``); the
    nodes choose the round together once they have met."""
    from gasloc_emu.emulator.zygote import Zygote
    if dry_run:
        from gasloc_emu.cluster.multinode import describe_role
        click.echo(describe_role(_plan(cfg, data=False), role))
        return exitcodes.OK
    with Zygote() as zygote:   # imports torch while this node plans and meets the others
        from gasloc_emu.cluster.multinode import launch_cluster
        plan = _plan(cfg, data=True)
        if resume is not None:
            from gasloc_emu.plan import refuse_resume
            refuse_resume(plan, resume)   # refused before anything runs
            check_resumable(resume, cfg)
            path = Path(resume) if role.is_master else None
        else:
            path = new_run_dir(cfg, out, overwrite, plan.run_label()) if role.is_master \
                else None
        factory = (lambda labels, shaper: make_progress(plan, labels, shaper)) \
            if role.is_master else None
        result = launch_cluster(plan, path, role, secret_file=secret_file, out=out,
                                progress_factory=factory, zygote=zygote,
                                log=lambda line: click.echo(line, err=True),
                                resume_dir=Path(resume) if resume is not None else None)
    if not role.is_master:  # node 0 has the record and prints the summary
        return result.code
    return _report(result)


def _report(result) -> int:
    # after the dashboard has stopped, so that these lines stay below it
    if result.dry_run_text is not None:
        click.echo(result.dry_run_text)
    elif result.code == exitcodes.OK:
        _echo_lines(summary_lines(result.summary, result.record))
    else:
        click.echo(f"error: {result.error}; record: {result.record}", err=True)
    return result.code


def topo_command(topology: str, workers: int, degree: int, seed: int, alpha: float, base: str,
                 round_idx: int) -> None:
    topo = Topology(topology, workers, degree, seed, base, alpha)
    w = topo.mixing_matrix(round_idx)
    click.echo(f"topology {topology}  N = {workers}"
               + (f"  (round {round_idx} of a random {topology} over {base})"
                  if topo.time_varying else ""))
    for i, peers in enumerate(topo.neighbors(round_idx)):
        click.echo(f"  worker {i:3d}: peers {peers}")
    if workers <= 16:
        click.echo("mixing matrix W:")
        for row in w:
            click.echo("  " + " ".join(f"{v:5.3f}" for v in row))
    kind = "E[W] over rounds" if topo.time_varying else "W"
    click.echo(f"lambda2 ({kind}) = {topo.lambda2:.6f}")
    click.echo(f"spectral gap     = {topo.spectral_gap:.6f}")
    click.echo(f"gamma*           = {topo.gamma_star:.6f}")
    click.echo(f"symmetric: {np.allclose(w, w.T)}  doubly stochastic: "
               f"{np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1)}")


def compare_command(run_dirs, plot_file: str | None, target_loss: float | None) -> int:
    try:
        runs = [load_run(d) for d in run_dirs]
        _warn_damage(runs)
        _console(160).print(
            compare_table(runs, target_loss=target_loss))
        if plot_file:
            plot(runs, plot_file)
            click.echo(f"plot: {plot_file}")
    except CompareError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    return 0


def show_command(run_dir: str) -> int:
    try:
        run = load_run(run_dir)
    except CompareError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    _warn_damage([run])
    _console(120).print(show_run(run))
    return 0


def export_command(run_dir: str, csv_file: str | None, tb_dir: str | None,
                   peak_tflops: float) -> int:
    """A record's metrics as CSV (default: RUN/metrics.csv) and, with ``tb_dir``, TensorBoard
    scalars; tokens per second and MFU added per worker (``report.export``)."""
    from gasloc_emu.report import export
    try:
        run = load_run(run_dir)
        _warn_damage([run])
        rows = export.table(run, export.flop_model(run.config, peak_tflops))
        if csv_file or not tb_dir:
            path = Path(csv_file) if csv_file else run.path / "metrics.csv"
            click.echo(f"csv: {path} ({export.write_csv(rows, path)} rows)")
        if tb_dir:
            n = export.write_tensorboard(rows, Path(tb_dir))
            click.echo(f"tensorboard: {tb_dir} ({n} scalars; tensorboard --logdir {tb_dir})")
    except (CompareError, export.ExportError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    return 0


def data_prepare_command(corpus: str, out: str, vocab_size: int, val_fraction: float,
                         max_mb: float) -> None:
    """Tokenise a corpus (``training.tokens.prepare``) and say what was written."""
    from gasloc_emu.training import tokens
    head = tokens.prepare(corpus, Path(out), vocab_size, val_fraction, max_mb)
    total = sum(head.tokens.values())
    click.echo(f"corpus {head.source}: {head.documents} documents, {head.source_chars} "
               f"characters")
    click.echo(f"tokenizer: byte-level BPE, {head.vocab_size} ids "
               f"({head.source_chars / max(total, 1):.2f} characters per token)")
    click.echo(f"tokens: {head.tokens['train']} train, {head.tokens['val']} held out "
               f"({head.dtype}) in {out}")
    click.echo(f"train on it: gasloc-emu run --data {out} (model.vocab_size follows the "
               "tokenizer)")


def _console(pipe_width: int):
    """A rich console: the terminal's width on a TTY, ``pipe_width`` columns into a pipe or file."""
    return Console(width=None if sys.stdout.isatty() else pipe_width)


def _warn_damage(runs) -> None:
    for r in runs:
        for w in r.warnings:
            click.echo(f"warning: {r.name}: {w}", err=True)


def sweep_command(preset: str | None, out: str | None, arms, report: str | None,
                  from_data: str | None = None, engine: EngineConfig | None = None) -> int:
    """Run a preset's sweep (or, ``from_data``, rebuild its report from a data file without
    running anything); with ``report``, write its section, plots and data into that page.
    ``engine``: where its runs are made (default: one after another here)."""
    name = Path(from_data or preset).stem
    out_dir = Path(out) if out else Path("runs") / f"sweep-{name}"
    # with a page, finished runs are kept beside it until the data file is written, so that a
    # sweep can be committed part-way and resumed in another checkout
    kept = Path(report).parent / "results" / f"{name}.partial.jsonl" if report else None
    if from_data:
        header, rows = data_file.read(Path(from_data))
        result = build_report(header, rows, out_dir)
    else:
        try:
            result = run_sweep(preset, out_dir, log=click.echo, arms=tuple(arms),
                               command=_sweep_line(preset, out, arms, report),
                               kept=None if arms else kept,
                               engine=make_engine(engine or EngineConfig(), out_dir))
        except EngineError as exc:
            return _engine_failed(exc)
    click.echo(f"results: {out_dir / 'results.json'}  plot: {out_dir / 'plot.png'}")
    if report:
        page = Path(report)
        _copy_results(result, out_dir, page.parent / "results", name, from_data)
        command = result.get("command") or _sweep_line(result["preset"], out, arms, report)
        update_results_page(page, name, markdown_section(name, result, command,
                                                         f"results/{name}.png"))
        if kept is not None and not from_data and not arms:
            kept.unlink(missing_ok=True)   # its rows are in the data file now
        click.echo(f"report: {page}")
    return 0


def _sweep_line(preset, out, arms, report: str | None) -> str:
    """The command that runs the sweep, as its section shows it (a rebuild shows the one its
    data file keeps)."""
    return f"gasloc-emu sweep {preset}" + (f" --out {out}" if out else "") + \
        "".join(f" --arm {a}" for a in arms) + (f" --report {report}" if report else "")


def _copy_results(result: dict, out_dir: Path, folder: Path, name: str, from_data) -> None:
    """The plot, the search's heat maps and the data file beside the results page."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.png").write_bytes((out_dir / "plot.png").read_bytes())
    if result.get("tuning_plot"):
        (folder / f"{name}-tuning.png").write_bytes(Path(result["tuning_plot"]).read_bytes())
    source = Path(from_data) if from_data else out_dir / "data.jsonl"
    target = folder / f"{name}.jsonl"
    if source.resolve() != target.resolve():
        target.write_bytes(source.read_bytes())


def _engine_failed(exc: EngineError) -> int:
    """Runs whose jobs failed: each named with its log on stderr, exit 1. The runs that
    finished are kept in their folders and reused by the next call."""
    for line in exc.failures:
        click.echo(f"error: {line}", err=True)
    return exitcodes.RUN_FAILED


def crossover_command(preset: str | None, out: str | None, report: str | None,
                      from_data: str | None, engine: EngineConfig | None = None) -> int:
    """Make the crossover map (or rebuild it from its data file); with ``report``, write its
    section, map and data file beside that page. ``engine``: where its runs are made."""
    from gasloc_emu.experiments import crossover as X
    name = Path(from_data or preset).stem
    out_dir = Path(out) if out else Path("runs") / f"crossover-{name}"
    if from_data:
        header, rows = data_file.read(Path(from_data), kind=X.KIND)
    else:
        try:
            header, rows = X.run_crossover(preset, out_dir, log=click.echo,
                                           engine=make_engine(engine or EngineConfig(),
                                                              out_dir))
        except EngineError as exc:
            return _engine_failed(exc)
        data_file.write(out_dir / "data.jsonl", header, rows, kind=X.KIND)
    out_dir.mkdir(parents=True, exist_ok=True)
    X.plot_map(header["spec"], rows, out_dir / "map.png")
    click.echo(f"map: {out_dir / 'map.png'}")
    if report:
        page = Path(report)
        folder = page.parent / "results"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.png").write_bytes((out_dir / "map.png").read_bytes())
        if not from_data:
            (folder / f"{name}.jsonl").write_bytes((out_dir / "data.jsonl").read_bytes())
        update_results_page(page, name, X.section(header, rows))
        click.echo(f"report: {page}")
    return 0


def compute_show_command(cfg: Config) -> None:
    from gasloc_emu.training.compute import profile_lines
    _echo_lines(profile_lines(cfg, _plan(cfg, data=False).compute))


_OPTIONAL_COLUMNS = (("jitter_ms", "jitter ms"), ("loss_pct", "loss %"),
                     ("reorder_pct", "reorder %"), ("ge_p_pct", "burst p %"),
                     ("ge_r_pct", "burst r %"), ("queue_pkts", "queue pkts"))


def netem_show_command(cfg: Config) -> None:
    plan, decision = _plan(cfg, data=False).link_plan, shaping_decision(cfg)
    table = Table(title=f"profile {plan.profile!r}, {plan.workers} workers"
                        + (f" ({plan.note})" if getattr(plan, "note", "") else ""))
    rows = plan.table()
    # a column for each impairment some link has, so a plain profile shows four columns
    extra = [(k, name) for k, name in _OPTIONAL_COLUMNS if any(k in r and r[k] for r in rows)]
    tcp = any("tcp" in r for r in rows)
    for col in ("link", "rate Mbit/s", "effective Mbit/s", "latency ms",
                *(name for _, name in extra), *(("tcp",) if tcp else ())):
        table.add_column(col, justify="right")
    for row in rows:
        cells = [f"{row.get(k, 0):g}" for k, _ in extra]
        tcp_cell = [", ".join(f"{k} {v}" for k, v in row.get("tcp", {}).items())] if tcp else []
        table.add_row(f"{row['src']}→{row['dst']}", f"{row['rate_mbit']:g}",
                      f"{row['effective_mbit']:g}", f"{row['latency_ms']:g}", *cells, *tcp_cell)
    console = _console(120)
    console.print(table)
    for k, c in sorted(plan.caps.items()):
        console.print(f"worker {k}: up {c.up_mbit or '-'} Mbit/s, down {c.down_mbit or '-'} Mbit/s")
    faithful = "" if decision.delay_mode.faithful_to_tcp else " - not faithful to TCP"
    console.print(f"shaper here: {decision.shaper} (delay: {decision.delay}{faithful}) - "
                  f"{decision.reason}")


def netem_probe_command(cfg: Config, seconds: float, topology_only: bool) -> int:
    if not shaped(cfg):
        click.echo("error: nothing to probe: give a --bw-profile (and a shaper other than none)",
                   err=True)
        return 2
    plan = _plan(cfg, data=False)
    with open_network(cfg, plan.link_plan, plan.world) as network:
        pairs = used_pairs(cfg, plan.topology) if topology_only else None
        rows = probe_links(network.session, pairs, seconds_per_link=seconds)
    _console(120).print(links_table(rows))
    missed = [r for r in rows if not r["ok"]]
    click.echo(f"{len(rows) - len(missed)} of {len(rows)} links within 10% of their target")
    return 1 if missed else 0


def netem_measure_command(kw: dict) -> int:
    """``netem measure`` on this host: its role, the secret and the bounds, then the
    measurement (``cluster.measuring``); node 0 writes ``--out``."""
    import os

    from gasloc_emu.cluster.measuring import check_out, measure_hosts, resolve_allowlist
    from gasloc_emu.cluster.roles import load_secret, resolve_role
    from netem.measureplan import MeasureBounds
    bounds = MeasureBounds(kw["max_bytes_per_pair"], kw["max_seconds_per_pair"],
                           kw["max_seconds"], kw["pings"])
    role = resolve_role({k: kw.get(k) for k in ("nnodes", "node_rank", "master_addr",
                                                "master_port")}, os.environ)
    secret = load_secret(kw.get("secret_file"), os.environ)
    out = check_out(kw["out"], kw["overwrite"]) if role.is_master else None
    hosts = [h.strip() for h in (kw.get("allow_hosts") or "").split(",") if h.strip()]
    allowlist = resolve_allowlist(hosts) if hosts else None
    return measure_hosts(role, secret, bounds, out=out, allowlist=allowlist,
                         loss_from=kw["loss_from"], placement=kw["worker_placement"],
                         log=lambda line: click.echo(line, err=line.startswith("error")))


def consensus_command(cfg: Config, out_file: str | None, csv_file: str | None) -> int:
    """The surrogate run of ``experiments.consensus``: a row at rounds 0, 1, 2, 5, 10, 20, ...
    and the last, then the rates, and the data files asked for."""
    from gasloc_emu.experiments.consensus import run_consensus
    from gasloc_emu.plan import build_plan
    plan = build_plan(cfg, data=False)
    for line in plan.warnings:
        click.echo(f"warning: {line}", err=True)
    shown = _log_rounds(cfg.run.rounds)

    def row(t: int, consensus: float, gap: float) -> None:
        if t == 0:   # after the surrogate has accepted the settings
            click.echo(f"{'round':>7} {'consensus':>12} {'f(xbar)-f*':>12}")
        if t in shown:
            click.echo(f"{t:7d} {consensus:12.4e} {gap:12.4e}")

    res = run_consensus(plan, row)
    click.echo(_consensus_summary(res))
    if out_file:
        Path(out_file).write_text(res.to_json())
        click.echo(f"data: {out_file}")
    if csv_file:
        res.write_csv(Path(csv_file))
        click.echo(f"rows: {csv_file}")
    bad = next((t for t, v in enumerate(res.consensus) if not np.isfinite(v)), None)
    if bad is not None:
        click.echo(f"error: diverged: the consensus distance is not finite from round {bad}",
                   err=True)
        return exitcodes.DIVERGED
    return exitcodes.OK


def _log_rounds(rounds: int) -> set[int]:
    """0, 1, 2, 5, 10, 20, 50, ... up to ``rounds``, and ``rounds``."""
    out, scale = {0, rounds}, 1
    while scale <= rounds:
        out |= {m * scale for m in (1, 2, 5) if m * scale <= rounds}
        scale *= 10
    return out


def _consensus_summary(res) -> str:
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.6f}"
    lines = [
        f"{res.algorithm} on {res.topology}, N = {res.workers}, H = "
        f"{_steps_text(res.local_steps)}, eta = {res.eta:g}, gamma = {res.gamma:g}, "
        f"{res.rounds} rounds in {res.seconds:.2f} s",
        f"lambda2 (W)                   {num(res.lambda2)}",
        f"consensus rate, predicted     {num(res.predicted_rate)}"
        + ("  (only for pure gossip, outer lr 0, on a fixed graph)"
           if res.predicted_rate is None else "  (momentum_growth(gamma)^2)"),
        f"consensus rate, measured      {num(res.measured_rate)}",
        f"final consensus distance      {res.consensus[-1]:.4e}",
        f"final f(xbar) - f*            {res.loss_gap[-1]:.4e}",
        f"final mean_i f(x_i) - f*      {res.worker_gap[-1]:.4e}",
    ]
    return "\n".join(lines)


def _steps_text(steps: list[int]) -> str:
    return str(steps[0]) if len(set(steps)) == 1 else f"{min(steps)}..{max(steps)}"
