"""A run record's metrics where users look: a CSV file (one row per worker per round, the columns
of metrics.jsonl) and TensorBoard scalars, each with tokens per second and model FLOPs
utilisation per worker (``gasloc-emu export RUN``).

MFU (model FLOPs utilisation; Chowdhery et al. 2022, PaLM, appendix B): the FLOPs the model needs
per token times the tokens per second, over the device's peak FLOP/s. Per token, a forward and
backward pass over a dense transformer costs 6N (2N multiply-adds forward, twice that backward,
N the parameters) plus 12 * n_layer * n_embd * T for attention over a context of T (the
attention scores and their weighted sum; PaLM's 12LHQT with H * Q = n_embd), as nanoGPT's
``estimate_mfu`` computes it. Rematerialisation is not counted (that is hardware FLOPs
utilisation). A user's model (a plugin) counts 6N only.

Tokens per second are over the round's compute seconds (``compute_s``): as measured, or the
nominal time where ``compute.step_time_s`` sets it (the emulated machine's speed, not this
host's).
"""
from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from gasloc_emu.config import ConfigError, ModelConfig, build_section
from gasloc_emu.report.compare import Run
from gasloc_emu.report.schema import MetricRow
from gasloc_emu.training import model

# One CPU core's fp32 peak by default: two 256-bit FMA units, 8 lanes each, 2 FLOP per FMA, at
# 2.5 GHz = 80 GFLOP/s (an AVX2 server core; give --peak-tflops for a GPU: an A100's bf16 dense
# peak is 312 TFLOP/s, the figure nanoGPT's estimate_mfu uses).
DEFAULT_PEAK_TFLOPS = 0.08
DERIVED = ("tokens_per_s", "mfu")
COLUMNS = tuple(f.name for f in fields(MetricRow)) + DERIVED
# what TensorBoard gets per worker: the numeric columns worth a curve
SCALARS = ("train_loss", "eval_loss", "lr", "compute_s", "comm_s", "wait_s", "bytes_sent",
           "bytes_recv", "steps", "tokens", "tokens_per_s", "mfu")


class ExportError(ValueError):
    """The record cannot be exported: no rows, an unknown model, TensorBoard not installed."""


@dataclass(frozen=True)
class FlopModel:
    """FLOPs per trained token of a record's model, and the peak it is compared with."""

    params: int
    attention: int          # 12 * n_layer * n_embd * T, 0 for a user's model
    peak_flops: float

    @property
    def per_token(self) -> int:
        return 6 * self.params + self.attention

    def mfu(self, tokens_per_s: float | None) -> float | None:
        if tokens_per_s is None:
            return None
        return self.per_token * tokens_per_s / self.peak_flops


def flop_model(config: dict, peak_tflops: float = DEFAULT_PEAK_TFLOPS) -> FlopModel:
    """The FLOP model of a record's ``config.toml`` (its ``model`` table)."""
    if not (isinstance(peak_tflops, (int, float)) and math.isfinite(peak_tflops)
            and peak_tflops > 0):
        raise ExportError(f"--peak-tflops {peak_tflops!r} is out of range; expected a number > 0")
    try:
        mcfg = build_section(ModelConfig, config.get("model", {}), "model.")
        params = model.count_parameters(mcfg)
        shape = model.shape_from_config(mcfg)
    except (ConfigError, ImportError) as exc:
        raise ExportError(f"the record's model cannot be sized: {exc}") from None
    attention = 0 if model.is_plugin(mcfg) else 12 * shape.n_layer * shape.n_embd * \
        shape.block_size
    return FlopModel(params, attention, peak_tflops * 1e12)


def tokens_per_s(row: MetricRow) -> float | None:
    """The round's tokens over its compute seconds; None where either is not recorded."""
    tokens, secs = row.get("tokens"), row.get("compute_s")
    if tokens is None or secs is None or not math.isfinite(secs) or secs <= 0:
        return None
    return tokens / secs


def table(run: Run, flops: FlopModel) -> list[dict]:
    """One dict per row of metrics.jsonl, in its order: every column of ``COLUMNS``."""
    if not run.rows:
        raise ExportError(f"{run.path}: no metrics rows to export")
    out = []
    for row in run.rows:
        tps = tokens_per_s(row)
        cells = {name: getattr(row, name) for name in COLUMNS[:-len(DERIVED)]}
        out.append(cells | {"tokens_per_s": tps, "mfu": flops.mfu(tps)})
    return out


def write_csv(rows: Iterable[dict], path: Path) -> int:
    """The rows as CSV (an empty cell: not recorded; lists and maps as JSON); how many."""
    n = 0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for row in rows:
            w.writerow([_cell(row[c]) for c in COLUMNS])
            n += 1
    return n


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return repr(value) if isinstance(value, float) else str(value)


def write_tensorboard(rows: Iterable[dict], log_dir: Path) -> int:
    """Scalars ``worker<k>/<column>`` at step = round, one event file in ``log_dir``; how many
    scalars. Needs the ``tensorboard`` package (the optional 'tensorboard' extra)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ExportError("--tensorboard needs the tensorboard package: pip install "
                          "'gasloc-emu[tensorboard]'") from None
    n = 0
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for row in rows:
            for name in SCALARS:
                value = row.get(name)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    writer.add_scalar(f"worker{row['worker']}/{name}", value, row["round"])
                    n += 1
    finally:
        writer.close()
    return n
