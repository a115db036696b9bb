"""Run records: one folder per run with the resolved config, metrics as they come, and a summary.

    <dir>/config.toml     the resolved config (reads back into an equal Config)
    <dir>/metrics.jsonl   one JSON object per worker per round, flushed line by line
    <dir>/summary.json    final numbers, written at the end (also when the run failed)
    <dir>/links.json      configured vs measured links (emulator runs)
    <dir>/faults.json     a scenario's random faults as drawn, written before the run starts

Their schemas (keys, versions, how older records read) are ``report.schema``'s, documented in
docs/RECORDS.md.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from gasloc_emu.config import Config, ConfigError, to_toml
from gasloc_emu.report.schema import MetricRow, RunSummary, links_document
from gasloc_emu.training.checkpoint import CheckpointError, Checkpoints, ResumePoint


def default_name(cfg: Config, label: str) -> str:
    """``run.name``, else ``label`` (the algorithm's ``run_label``) and the worker count."""
    return cfg.run.name or f"{label}-n{cfg.workers}"


RECORD_FILES = ("config.toml", "metrics.jsonl", "summary.json", "links.json", "workers.json",
                "launch.json", "faults.json")   # the last: scenario.faults.FAULTS_FILE


class RecordError(Exception):
    """The run record cannot be written: a reused folder, a read-only disk, a full disk."""


def new_run_dir(cfg: Config, out: str | os.PathLike | None = None,
                overwrite: bool = False, label: str = "run") -> Path:
    """``out`` when given, else ``<run.out_dir>/<name>-<timestamp>`` (never reusing a folder).

    An ``out`` that already holds a record is refused unless ``overwrite``, which clears it
    first: two runs' metrics in one file would read as one run.
    """
    path = Path(out) if out is not None else fresh_path(cfg, label)
    if out is not None and holds_record(path):
        if not overwrite:
            raise RecordError(f"{path} already holds a run record; choose another --out or "
                              "pass --overwrite to replace it")
        _clear(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecordError(f"cannot create the run record {path}: {exc.strerror or exc}") from None
    return path


def fresh_path(cfg: Config, label: str = "run") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", default_name(cfg, label))
    path = Path(cfg.run.out_dir) / f"{safe}-{stamp}"
    k = 1
    while path.exists():
        k += 1
        path = Path(cfg.run.out_dir) / f"{safe}-{stamp}-{k}"
    return path


def holds_record(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in RECORD_FILES)


def _clear(path: Path) -> None:
    """Remove what a run record consists of (and nothing else a user may keep there)."""
    try:
        for name in RECORD_FILES:
            (path / name).unlink(missing_ok=True)
        shutil.rmtree(path / "workers", ignore_errors=True)
    except OSError as exc:
        raise RecordError(f"cannot clear {path} for --overwrite: {exc.strerror or exc}") from None


def _clean(obj):
    """JSON without NaN/Infinity (they become null), which strict readers reject."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


RESERVE = ".summary-reserve"   # space held at the start for the summary of a disk that fills
RESERVE_BYTES = 256 * 1024


class RunRecord:
    """Writes one run's folder. Each metrics line is written whole, with one system call, as
    it comes (a killed run keeps every finished line), or not at all: a line cut short by a
    full disk is taken back, so metrics.jsonl never ends in half a line. Space for the summary
    is held from the start (``RESERVE``, given back when a summary does not fit), so a run
    whose disk fills still says so in summary.json. Every OSError is a ``RecordError`` naming
    the file."""

    def __init__(self, path: Path, cfg: Config, resume_from: int | None = None):
        """``resume_from``: a resumed run's last round from before; the rows of later rounds
        (written before the run stopped, and to be made again) are taken out."""
        self.path = Path(path)
        self._fd = -1
        self.uncommitted: dict[int, list[int]] = {}   # rows that say so, for the summary
        self._guard("config.toml", lambda: self._start(cfg))
        if resume_from is not None:
            self.resume_from(resume_from)

    def resume_from(self, last_round: int) -> None:
        """A resumed run goes on after ``last_round``: the rows of later rounds (written
        before the run stopped, and to be made again) are taken out."""
        self._guard("metrics.jsonl", lambda: self._keep_rows_upto(last_round))

    def _start(self, cfg: Config) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / RESERVE).write_bytes(b"\0" * RESERVE_BYTES)
        (self.path / "config.toml").write_text(to_toml(cfg))
        self._fd = os.open(self.path / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                           0o644)
        self._size = os.fstat(self._fd).st_size

    def metric(self, row: MetricRow | Mapping) -> None:
        """One metrics.jsonl line: a ``MetricRow`` (what every runner writes, built and
        checked where it is made), or a mapping written as it is."""
        obj = row.to_json() if isinstance(row, MetricRow) else _clean(row)
        line = (json.dumps(obj) + "\n").encode()
        self._guard("metrics.jsonl", lambda: self._append(line))
        if obj.get("uncommitted"):
            self.uncommitted.setdefault(obj["worker"], []).append(obj["round"])

    def _append(self, line: bytes) -> None:
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"only {written} of {len(line)} bytes written")
        except OSError:
            os.ftruncate(self._fd, self._size)  # whole lines or nothing
            raise
        self._size += written

    def _keep_rows_upto(self, last_round: int) -> None:
        """metrics.jsonl without the rows of rounds after ``last_round`` (and without a line
        cut short by a kill), replaced atomically; new rows append after them."""
        kept = [line for line in (self.path / "metrics.jsonl").read_text().splitlines(True)
                if line.endswith("\n") and _row_round(line) is not None
                and _row_round(line) <= last_round]
        self._replace("metrics.jsonl", "".join(kept))
        os.close(self._fd)
        self._fd = os.open(self.path / "metrics.jsonl", os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size

    def event(self, rec: dict) -> None:
        """One scenario event that fired, appended to events.jsonl."""
        line = json.dumps(_clean(rec)) + "\n"
        self._guard("events.jsonl", lambda: self._append_to("events.jsonl", line))

    def _append_to(self, name: str, line: str) -> None:
        with open(self.path / name, "a") as f:
            f.write(line)

    def write_json(self, name: str, obj) -> None:
        """``name`` replaced atomically by ``obj``; links.json's rows are ``LinkRow``s, with
        the schema's version beside them."""
        if name == "links.json":
            obj = links_document(obj)
        text = json.dumps(_clean(obj), indent=2) + "\n"
        self._guard(name, lambda: self._replace(name, text))

    def _replace(self, name: str, text: str) -> None:
        tmp = self.path / (name + ".tmp")
        try:
            tmp.write_text(text)
            tmp.replace(self.path / name)  # atomic: readers never see half a summary
        finally:
            tmp.unlink(missing_ok=True)

    def faults(self, world) -> None:
        """faults.json: the random faults of ``world``'s scenario as drawn (each with its
        outcome) and the events they became; nothing without a [faults] section. Written
        before the run starts: workers and ``simulate --replay`` play what is written."""
        timeline = getattr(getattr(world, "scenario", None), "faults", None)
        if timeline is not None:
            self.write_json(timeline.file, timeline.to_json())

    def summary(self, obj: RunSummary | Mapping) -> None:
        """summary.json: ``obj``, or the ``RunSummary`` of its keys; when the disk is full,
        the held space is given back and it is written again."""
        obj = obj if isinstance(obj, RunSummary) else RunSummary.of(obj)
        if self.uncommitted:   # a run that lost rounds cannot pass for an undisturbed one
            obj = obj.replace(uncommitted={
                "total": sum(map(len, self.uncommitted.values())),
                "by_worker": {str(w): sorted(t) for w, t in sorted(self.uncommitted.items())}})
        obj = obj.to_json()
        try:
            self.write_json("summary.json", obj)
        except RecordError:
            reserve = self.path / RESERVE
            if not reserve.exists():
                raise
            reserve.unlink()
            self.write_json("summary.json", obj)
        (self.path / RESERVE).unlink(missing_ok=True)

    def _guard(self, name: str, write) -> None:
        try:
            write()
        except OSError as exc:
            raise RecordError(f"cannot write {self.path / name}: {exc.strerror or exc}") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RunRecord:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _row_round(line: str) -> int | None:
    try:
        value = json.loads(line).get("round")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def rows_by_round(path: Path) -> dict[int, dict[int, float]]:
    """{round: {worker: time_s}} of a record's whole metrics rows (a line cut short by a kill
    is not a row)."""
    out: dict[int, dict[int, float]] = {}
    p = Path(path) / "metrics.jsonl"
    for line in p.read_text().splitlines(True) if p.is_file() else ():
        try:
            row = json.loads(line) if line.endswith("\n") else None
            r, w, t = row["round"], row["worker"], float(row.get("time_s", 0.0))
        except (ValueError, TypeError, KeyError):
            continue
        out.setdefault(r, {})[w] = t
    return out


def check_resumable(run_dir: str | os.PathLike, cfg: Config) -> None:
    """A ConfigError when ``run_dir``'s run took no checkpoints to go on from."""
    if cfg.run.checkpoint_every == 0:
        raise ConfigError(f"--resume {run_dir}: its run took no checkpoints "
                          "(run.checkpoint_every = 0)")


def _hosts_of(path: Path) -> int:
    """How many hosts a record's run had (``workers.json``'s nodes; 1 when it does not say)."""
    try:
        rows = json.loads((path / "workers.json").read_text())
        return len({row.get("node", 0) for row in rows}) or 1
    except (OSError, ValueError, TypeError, AttributeError):
        return 1


def resume_point(run_dir: str | os.PathLike, cfg: Config) -> ResumePoint:
    """Where ``--resume RUN_DIR`` goes on from: the latest round of which every worker has a
    whole checkpoint and a row in the record; a ConfigError naming why when there is none."""
    check_resumable(run_dir, cfg)
    hosts = _hosts_of(Path(run_dir))
    if hosts > 1:
        raise ConfigError(f"--resume {run_dir}: a run on {hosts} hosts keeps each host's "
                          "checkpoints on that host; resume it with `gasloc-emu run --resume` "
                          "on every host, with its --nnodes and --node-rank")
    try:
        return Checkpoints(Path(run_dir)).latest_common(range(cfg.workers),
                                                        rows_by_round(Path(run_dir)))
    except CheckpointError as exc:
        raise ConfigError(f"--resume {run_dir}: {exc}") from None

