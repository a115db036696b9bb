"""Run records: one folder per run with the resolved config, metrics as they come, and a summary.

    <dir>/config.toml     the resolved config (reads back into an equal Config)
    <dir>/metrics.jsonl   one JSON object per worker per round, flushed line by line
    <dir>/summary.json    final numbers, written at the end (also when the run failed)
    <dir>/links.json      configured vs measured links (emulator runs)
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

from .config import Config, to_toml


def default_name(cfg: Config) -> str:
    if cfg.run.name:
        return cfg.run.name
    name = cfg.algo.name if cfg.algo.name == "diloco" else f"{cfg.algo.name}-{cfg.topology.name}"
    return f"{name}-n{cfg.workers}"


def new_run_dir(cfg: Config, out: str | os.PathLike | None = None) -> Path:
    """``out`` when given, else ``<run.out_dir>/<name>-<timestamp>`` (never reusing a folder)."""
    if out is not None:
        path = Path(out)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", default_name(cfg))
        path = Path(cfg.run.out_dir) / f"{safe}-{stamp}"
        k = 1
        while path.exists():
            k += 1
            path = Path(cfg.run.out_dir) / f"{safe}-{stamp}-{k}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _clean(obj):
    """JSON without NaN/Infinity (they become null), which strict readers reject."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


class RunRecord:
    """Writes one run's folder; metrics are flushed per line so a killed run keeps them."""

    def __init__(self, path: Path, cfg: Config):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.toml").write_text(to_toml(cfg))
        self._metrics = open(self.path / "metrics.jsonl", "a", buffering=1)

    def metric(self, row: dict) -> None:
        self._metrics.write(json.dumps(_clean(row)) + "\n")

    def write_json(self, name: str, obj) -> None:
        tmp = self.path / (name + ".tmp")
        tmp.write_text(json.dumps(_clean(obj), indent=2) + "\n")
        tmp.replace(self.path / name)  # atomic: readers never see half a summary

    def summary(self, obj: dict) -> None:
        self.write_json("summary.json", obj)

    def close(self) -> None:
        if not self._metrics.closed:
            self._metrics.close()

    def __enter__(self) -> "RunRecord":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
