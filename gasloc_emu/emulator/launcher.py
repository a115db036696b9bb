"""Spawn one process per worker, pin devices, supervise, stop, collect the run record.

The launcher owns the control plane (ipc:// sockets in the run directory). It never touches the
data plane: workers bind the addresses it hands out and talk to each other directly.
Failure handling: a worker that exits early, reports an error, or is silent for
``run.heartbeat_timeout_s`` stops the run; every worker is stopped, then killed after a grace
period; the metrics written so far stay, and summary.json records the failure.
"""
from __future__ import annotations

import json
import signal
import sys
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from gasloc_emu import exitcodes
from gasloc_emu.config import Config
from gasloc_emu.emulator.errors import Interrupted, RunDiverged, RunFailed
from gasloc_emu.emulator.network import open_network
from gasloc_emu.emulator.processes import remove_stale_socket_dirs
from gasloc_emu.emulator.supervisor import Supervisor
from gasloc_emu.emulator.tally import link_bytes
from gasloc_emu.emulator.zygote import Zygote
from gasloc_emu.netplan import used_pairs
from gasloc_emu.plan import RunPlan
from gasloc_emu.report import fidelity, records
from gasloc_emu.report.fmt import stolen
from gasloc_emu.training.checkpoint import ResumePoint
from gasloc_emu.training.devices import worker_devices

Log = Callable[[str], None]  # one line for the user (stderr in the CLI)


class SigTerm:
    """Turn SIGTERM into an exception in the main thread, so cleanup runs as for Ctrl-C."""

    def __enter__(self):
        self.prev = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise Interrupted("SIGTERM")

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self.prev)


@dataclass
class LaunchResult:
    """What ``launch`` hands back to the command layer, which prints it."""

    code: int                       # one of gasloc_emu.exitcodes
    summary: dict = field(default_factory=dict)
    record: Path | None = None      # the run folder (None for a dry run)
    dry_run_text: str | None = None  # the network commands a dry run would execute

    @property
    def error(self) -> str | None:
        return self.summary.get("error")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def launch(plan: RunPlan, path: Path | None, *, dry_run: bool = False,
           progress_factory=None, log: Log = _stderr,
           zygote: Zygote | None = None, resume: ResumePoint | None = None) -> LaunchResult:
    """``gasloc-emu run`` of a ``RunPlan``: build the network, run the workers, keep the
    record in ``path`` (made by ``records.new_run_dir``; unused for a dry run).

    ``zygote``: the workers' zygote, when the caller started it early (else the supervisor
    starts one); ``resume``: go on from the checkpoints in ``path`` at that point. Whatever
    goes wrong once the record exists (a worker, the launcher itself, Ctrl-C, a full disk)
    ends with a summary.json that has a status and the error, where the disk allows.
    """
    with ExitStack() as stack:
        cfg = plan.cfg
        network = stack.enter_context(open_network(cfg, plan.link_plan, plan.world, dry_run,
                                                    plan.time_scale))
        if dry_run:
            return LaunchResult(exitcodes.OK, dry_run_text=network.dry_run_text())
        remove_stale_socket_dirs()
        rec = stack.enter_context(records.RunRecord(
            path, cfg, resume.round if resume is not None else None))
        rec.faults(plan.world)   # before any worker starts: they play what is written
        try:
            code, summary = _launch(plan, path, rec, network, stack, progress_factory, log,
                                    zygote, resume)
        except BaseException as exc:  # noqa: BLE001 - whatever it was, the record says so
            code, summary = outcome(exc)
            _last_words(rec, summary | {"mode": "run"} | network.describe_summary())
    return LaunchResult(code, summary, path)


def shaper_label(network) -> str:
    """The shaper and how its delay reaches the packets, for the dashboard's header: a delay
    TCP does not see is said so there, where the user looks."""
    session = getattr(network, "session", None)
    decision = getattr(network, "decision", None) or getattr(session, "decision", None)
    plan = getattr(network, "plan", None) or getattr(session, "plan", None)
    if decision is None or plan is None or not plan.shaped or not plan.max_of("latency_ms"):
        return network.shaper
    mode = decision.delay_mode
    return f"{network.shaper}, delay {mode.name}" + (
        "" if mode.faithful_to_tcp else " (not seen by TCP)")


def _launch(plan, path, rec, network, stack, progress_factory, log,
            zygote, resume=None) -> tuple[int, dict]:
    cfg = plan.cfg
    devices = worker_devices(cfg.run.device, cfg.workers)
    warnings = _probe_links(plan, network, log) if _probes(cfg, network) else []
    network.training_starts()   # the line's lateness from here is training's (the verdict's)
    network.watch_tcp()     # from here to links.json: the senders' TCP during training
    prog = None
    if progress_factory is not None:
        prog = stack.enter_context(progress_factory([d.label for d in devices],
                                                    shaper_label(network)))
        for text in warnings:
            prog({"kind": "warning", "text": text})
    return supervise(Supervisor(plan, path, rec, network, devices, prog, zygote=zygote,
                                resume=resume))


def outcome(exc: BaseException) -> tuple[int, dict]:
    """Exit code and summary fields for a run that ended by ``exc``."""
    if isinstance(exc, (KeyboardInterrupt, Interrupted)):
        why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc)
        return exitcodes.INTERRUPTED, {"status": "stopped", "error": why}
    if isinstance(exc, RunDiverged):
        return exitcodes.DIVERGED, {"status": "diverged", "error": str(exc),
                                    "diverged_at": exc.where}
    if isinstance(exc, (RunFailed, records.RecordError)):
        return exitcodes.RUN_FAILED, {"status": "failed", "error": str(exc)}
    # a bug of ours: where it happened, for the report (the summary says what it was)
    traceback.print_exception(exc, file=sys.stderr)
    return exitcodes.INTERNAL, {"status": "error",
                                "error": f"internal error: {type(exc).__name__}: {exc}"}


def _last_words(rec: records.RunRecord, summary: dict) -> str | None:
    """Write the summary if the disk lets us; the reason it did not, else None."""
    try:
        rec.summary(summary)
    except records.RecordError as exc:
        return str(exc)
    return None


def _probes(cfg: Config, network) -> bool:
    """Probe shaped links; not a network that starts unshaped (``ScenarioNetwork``: a link
    event's rate applies later, and an unshaped link has no target to miss)."""
    return cfg.net.probe and network.kind.shapes and not network.unshaped_start


PROBE_S = 2.0   # each link's pre-run probe, emulated seconds


def _probe_links(plan: RunPlan, network, log: Log) -> list[str]:
    """Measure the links training will use; a warning for each that misses its target by >10%."""
    pairs = used_pairs(plan.cfg, plan.topology)
    log(f"probing {len(pairs)} links ...")
    # K times longer under dilation: the played link's slow start takes K times as long, and
    # 2 s of wall is 2 / K emulated seconds (at K = 4 a 50 Mbit/s, 50 ms link read 30 %)
    rows = network.probe(pairs, PROBE_S * plan.time_scale)
    warnings = [f"link {r['src']}->{r['dst']} measured {r['measured_mbit']:.2f} Mbit/s, "
                f"{r['measured_latency_ms']} ms; configured {r['configured_mbit']:.2f} Mbit/s, "
                f"{r['configured_latency_ms']} ms{_steal_note(r)}" for r in rows if not r["ok"]]
    for text in warnings:
        log(f"warning: {text}")
    return warnings


def _steal_note(row: dict) -> str:
    """Why a link may read short: the hypervisor took the host's CPUs (docs/NETWORK.md)."""
    phrase = stolen(row.get("host_steal"))
    if phrase is None:
        return ""
    return f" ({phrase} meanwhile: a shaper whose timers run late falls behind its rate)"


def supervise(sup: Supervisor) -> tuple[int, dict]:
    code, summary = exitcodes.OK, {}
    try:
        with SigTerm():
            summary = sup.run()
    except BaseException as exc:  # noqa: BLE001 - every ending is recorded, then stops the rest
        code, summary = outcome(exc)
        summary["last_rounds"] = [s.round for s in sup.slots]
        summary |= sup.drops_so_far()
        sup.stop_all()
    finally:
        sup.close()
    summary |= {"mode": "run"} | sup.network.describe_summary()
    # links.json's record first: the verdict is made of it, and summary.json carries the verdict
    try:
        links = sup.network.links_record(link_bytes(sup.slots))
        sup.goodput.add_to(links["links"])
    except BaseException:
        _last_words(sup.rec, summary)   # the summary stands, however links.json failed
        raise
    code, summary = _judged(sup, links, code, summary)
    problem = _last_words(sup.rec, summary)
    if problem is None:
        problem = _write_links(sup, links)
    if problem is not None and code == exitcodes.OK:
        code, summary = exitcodes.RUN_FAILED, summary | {"status": "failed", "error": problem}
    return code, summary


def _judged(sup: Supervisor, links: dict, code: int, summary: dict) -> tuple[int, dict]:
    """The summary with the run's fidelity verdict (report.fidelity); a finished run that is
    degraded under run.require_faithful ends with UNFAITHFUL, its error naming the worst link."""
    plan = sup.plan
    step_time_s = plan.compute.record().get("step_time_s")
    rows = _metric_rows(sup.rec.path / "metrics.jsonl")
    _add_model_times(plan, links, rows)
    verdict = fidelity.of_links_record(links, step_time_s=step_time_s,
                                       step_ratios=_step_ratios(rows),
                                       time_scale=plan.time_scale)
    extra = {"fidelity": verdict.to_json(),
             "time_scale": plan.time_scale}
    if links.get("packet_line") and verdict.thresholds.lateness_limit_ms is not None:
        extra["delay_faithful_measured"] = not verdict.line_late
        if verdict.line_late:
            # the delay mode can give TCP its delay; this run's line did not
            extra["delay_faithful_to_tcp"] = False
    out = summary | extra   # summary: a RunSummary or, for a run that ended early, a dict
    if code == exitcodes.OK and not verdict.faithful and plan.cfg.run.require_faithful:
        worst = verdict.worst_link
        where = "" if worst is None else f" (worst link {worst['src']}->{worst['dst']})"
        line = f"run not faithful{where}: {verdict.reasons[0].text}"
        # the command's one ending line on stderr is the summary's error (commands.app)
        return exitcodes.UNFAITHFUL, out | {"status": "degraded", "error": line}
    return code, out


def _add_model_times(plan: RunPlan, links: dict, rows: list[dict]) -> None:
    """Each training link's ``tcp_model_message_s`` in links.json: what simulate's TCP model
    (the plan's ``TcpLinkModel``) says one of its messages takes over the asked link, offered
    after the rows' median compute time idle (emulated seconds, as the link's own
    ``training_transfer_s``), and its ``training_message_s_median`` from the rows. Nothing
    where the plan has no TCP model (unshaped, no delay)."""
    message_s = getattr(plan.link_model, "message_s", None)
    if message_s is None:
        return
    computes = [r["compute_s"] for r in rows
                if isinstance(r.get("compute_s"), (int, float)) and r["compute_s"] >= 0]
    idle_s = _median(computes) or 1.0
    medians = _median_messages(rows)
    for row in links.get("links") or ():
        n, nbytes = row.get("training_messages") or 0, row.get("bytes") or 0
        if n > 0 and nbytes > 0:
            row["tcp_model_message_s"] = round(
                message_s(row["src"], row["dst"], max(1, round(nbytes / n)), idle_s), 6)
            if (row["src"], row["dst"]) in medians:
                row["training_message_s_median"] = round(medians[(row["src"], row["dst"])], 6)


def _median_messages(rows: list[dict]) -> dict[tuple[int, int], float]:
    """Each link's median over rounds of a message's transfer time (the receivers' rows'
    ``recv_links``: transfer_s / messages). A median, as the verdict's: a link's first message
    also waits for its connection (TCP's and ZeroMQ's handshakes, a few round trips) that
    no model of the message has."""
    per: dict[tuple[int, int], list[float]] = {}
    for row in rows:
        links = row.get("recv_links")
        if not isinstance(links, dict) or not isinstance(row.get("worker"), int):
            continue
        for src, obs in links.items():
            n = obs.get("messages") if isinstance(obs, dict) else None
            if isinstance(n, int) and n > 0 and isinstance(obs.get("transfer_s"), (int, float)) \
                    and str(src).isdigit():
                per.setdefault((int(src), row["worker"]), []).append(obs["transfer_s"] / n)
    return {k: _median(v) for k, v in per.items()}


def _median(values: list[float]) -> float | None:
    """The upper median (an observed value, as the line's percentiles are); None when empty."""
    return sorted(values)[len(values) // 2] if values else None


def _metric_rows(path) -> list[dict]:
    """metrics.jsonl's rows (objects), read once for the verdict; a line cut short by a full
    disk is not a row, and an unreadable file has none."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    out.append(row)
    except OSError:
        return []
    return out


def _step_ratios(rows: list[dict]) -> list[float]:
    """Each worker-round's worst real / nominal step time (metrics.jsonl's overrun_ratio)."""
    return [float(v) for v in (r.get("overrun_ratio") for r in rows)
            if isinstance(v, (int, float)) and v > 0]


def _write_links(sup: Supervisor, record: dict) -> str | None:
    try:
        sup.rec.write_json("links.json", record)
    except records.RecordError as exc:
        return str(exc)
    return None
