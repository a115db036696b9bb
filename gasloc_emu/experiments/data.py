"""A sweep's data file: everything its results section is computed from, one JSON line per run.

The first line describes the sweep (``kind = "sweep"``: its spec, the machine, how long it took,
the command that made it); each further line is one run (``kind = "run"``): its arm, whether it
was a tuning or a reported run, the seed and grid point, its status, final eval loss, consensus
distance, bytes sent, clock (wall-clock measured by the emulator, or the simulator's predicted
time), how long it took to run, and its eval curve as [round, time_s, loss] triples. The file
sits beside the section's plots in docs/results/, so a reader can check every number of the
section without running anything, and ``gasloc-emu sweep --from-data`` rebuilds the section
from it alone.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from gasloc_emu.report.compare import load_run

TUNE, REPORT = "tune", "report"   # a run of the search, or one of the reported seeds


def run_row(run_dir: Path, arm, phase: str, seed: int, point: tuple, mode: str) -> dict:
    """One run's line, from its record folder."""
    run = load_run(run_dir)
    s = run.summary
    clock = s.get("wall_s") if mode == "run" else run.clock_s
    curve = [[p.round, _num(p.time_s), _num(p.value)] for p in run.series("eval_loss")]
    return {"kind": "run", "arm": arm.name, "phase": phase, "seed": seed, "point": list(point),
            "status": s.get("status", "ok"), "final_eval_loss": _num(s.get("final_eval_loss")),
            "consensus_distance": _num(s.get("consensus_distance")),
            "bytes_sent_total": _num(s.get("bytes_sent_total")), "clock_s": _num(clock),
            "rounds": s.get("rounds"), "run_wall_s": _num(s.get("wall_s")), "curve": curve,
            **({"faults": f} if (f := _faults(run_dir, s, clock)) is not None else {})}


def _faults(run_dir: Path, summary, clock) -> dict | None:
    """What a run's random faults did (None without a [faults] section, i.e. faults.json):
    ``due``, the leaves (crashes) whose time came before the run's clock ended, fired or not;
    ``left`` and ``joined``, the leaves and joins that fired (an event at a time lands on a
    round no worker has started, after its own worker's change before it, so a crash due in
    the run's last round never fires: ``membership.not_fired``); ``alive_at_end``; ``drops``, the
    data-plane messages dropped."""
    if not (run_dir / "faults.json").exists():   # scenario.faults.FAULTS_FILE
        return None
    end = clock if isinstance(clock, (int, float)) else math.inf
    membership = summary.get("membership") or {}
    changes = membership.get("changes") or []
    left = sum(c.get("type") == "leave" for c in changes)
    late = sum(n.get("type") == "leave" and (n.get("at_s") or 0.0) < end
               for n in membership.get("not_fired") or ())
    return {"due": left + late, "left": left,
            "joined": sum(c.get("type") == "join" for c in changes),
            "alive_at_end": len(membership.get("alive_at_end") or ()),
            "drops": (summary.get("drops") or {}).get("total")}


def _num(v) -> float | None:
    """A finite float, else None (JSON has no NaN or infinity)."""
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def write(path: Path, header: dict, rows: list[dict], kind: str = "sweep") -> None:
    """The data file: the header line (``kind``: a sweep's, or the crossover map's), then the
    runs in the order they were made."""
    lines = [json.dumps({"kind": kind, **header}, sort_keys=True)]
    lines += [json.dumps(r, sort_keys=True, separators=(",", ":")) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def read(path: Path, kind: str = "sweep") -> tuple[dict, list[dict]]:
    """(header, runs) of a data file whose header is of ``kind``; a file that is not one is an
    error naming the line."""
    lines = Path(path).read_text().splitlines()
    items = []
    for n, line in enumerate(lines, 1):
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not a JSON line ({exc.msg})") from None
    if not items or items[0].get("kind") != kind:
        raise ValueError(f"{path}: the first line is not a {kind} header")
    runs = items[1:]
    bad = next((n for n, r in enumerate(runs, 2) if r.get("kind") != "run"), None)
    if bad is not None:
        raise ValueError(f"{path}:{bad}: not a run line")
    header = dict(items[0])
    header.pop("kind")
    return header, runs


FINISHED = ("ok", "diverged")   # how a run ends by itself; any other status ended it from outside


def finished_record(run_dir: Path) -> bool:
    """Whether a run folder holds a run that ended by itself (ok, or diverged: what its settings
    do), which a sweep reuses; not one a failure ended (a timeout, a killed worker, a full disk,
    Ctrl-C), which says nothing about its settings and is run again."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status") in FINISHED
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


class KeptRows:
    """A sweep's finished runs as data rows, one JSON line each, appended as each run ends
    (``docs/results/<name>.partial.jsonl`` beside the page): a sweep cut short, or carried to a
    fresh checkout where its run folders are gone, resumes from them. A row is reused only for
    the same run (its folder tag and phase) with the same resolved config (``config_sha``), and
    only if it ended by itself (``FINISHED``); the file goes when the sweep's data file is
    written. A line cut short by a kill is skipped."""

    def __init__(self, path: Path | None):
        self.path, self.rows = path, {}
        if path is None or not path.exists():
            return
        for line in path.read_text().splitlines():
            try:
                d = json.loads(line)
                if d["row"].get("status", "ok") in FINISHED:
                    self.rows[(d["tag"], d["phase"], d["config_sha"])] = d["row"]
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue

    def get(self, tag: str, phase: str, sha: str) -> dict | None:
        return self.rows.get((tag, phase, sha))

    def add(self, tag: str, phase: str, sha: str, row: dict) -> None:
        self.rows[(tag, phase, sha)] = row
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps({"tag": tag, "phase": phase, "config_sha": sha, "row": row},
                               sort_keys=True, separators=(",", ":")) + "\n")

    def remove(self) -> None:
        if self.path is not None and self.path.exists():
            self.path.unlink()


def config_sha(config_text: str, mode: str, predict: bool) -> str:
    """What a kept row must match: the run's resolved config (as TOML), its mode, and whether
    the simulator's prediction was taken beside it."""
    return hashlib.sha256(f"{mode}|{predict}|{config_text}".encode()).hexdigest()[:20]
