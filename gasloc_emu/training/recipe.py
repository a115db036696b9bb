"""The inner training recipe: the learning-rate schedule, which parameters decay, and the
forward pass's precision (docs/RECIPE.md).

Pure where it can be: ``LRSchedule`` is a function of the step alone, tested at known steps; the
worker asks it for the lr of each step it takes, on its own step counter (``Worker.step``), so a
worker that takes fewer steps per round (a budget, a slow worker) walks the same curve more
slowly. Everything here is off by default (constant lr, fp32), which keeps today's runs to the
bit.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
from dataclasses import dataclass

import torch

from gasloc_emu.config import ConfigError


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup over ``warmup_steps``, then ``decay`` (constant, cosine or linear) from
    ``lr`` to ``min_ratio * lr`` at step ``total_steps``; after it the floor.

    Step ``s`` counts the steps taken before (0 for the first). Warmup: lr * (s + 1) / warmup,
    so the first step is not wasted at lr 0 (nanoGPT's ``get_lr`` warms up linearly the same
    way). Cosine: the half period of Loshchilov & Hutter's SGDR (arXiv 1608.03983, eq. 5)
    without restarts, the decay GPT-3 (Brown et al. 2020, appendix B) and DiLoCo use."""

    lr: float
    decay: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    min_ratio: float = 0.1

    def __post_init__(self):
        if self.decay not in _DECAYS:
            raise ConfigError(f"algo.inner.schedule = {self.decay!r} is not allowed; expected "
                              f"one of {', '.join(_DECAYS)}")
        if self.decay != "constant" and self.total_steps <= self.warmup_steps:
            raise ConfigError(f"the inner lr schedule decays over {self.total_steps} steps, "
                              f"which is not longer than its {self.warmup_steps} warmup steps; "
                              "set algo.inner.schedule_steps larger")

    def factor(self, step: int) -> float:
        """lr(step) / lr."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        span = self.total_steps - self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_ratio + (1.0 - self.min_ratio) * _DECAYS[self.decay](progress)

    def lr_at(self, step: int) -> float:
        return self.lr * self.factor(step)


_DECAYS = {
    "constant": lambda p: 1.0,
    "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
    "linear": lambda p: 1.0 - p,
}


def schedule_for(icfg, planned_steps: int | None) -> LRSchedule | None:
    """The schedule of ``algo.inner`` for a worker that will take ``planned_steps`` inner steps
    (None: unknown before the run); None when the lr stays constant (today's runs)."""
    if not icfg.scheduled:
        return None
    total = icfg.schedule_steps or planned_steps
    if total is None and icfg.schedule != "constant":
        raise ConfigError("algo.inner.schedule decays over the run's inner steps, which a "
                          "budget filled with measured step times does not know before the "
                          "run; set algo.inner.schedule_steps")
    return LRSchedule(icfg.lr, icfg.schedule, icfg.warmup_steps, total or 0, icfg.min_lr_ratio)


# ---------------------------------------------------------------- weight decay

def decays(model: torch.nn.Module, icfg) -> list[bool]:
    """For each of ``model.parameters()`` (tied weights once), whether AdamW decays it: the
    matrices (dim >= 2), the embedding tables only with ``icfg.decay_embeddings`` (a table tied
    to the output head is an embedding), never biases or norms (dim 1), as nanoGPT's
    ``configure_optimizers`` groups them."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return [p.dim() >= 2 and (icfg.decay_embeddings or id(p) not in tables)
            for p in model.parameters()]


# ---------------------------------------------------------------- precision

@dataclass(frozen=True)
class Precision:
    """How the forward pass computes: an autocast dtype (None: float32) and whether the loss
    needs a gradient scaler (fp16's narrow exponent underflows small gradients; Micikevicius
    et al. 2018, "Mixed precision training"), which torch.amp offers on the GPU only."""

    name: str
    dtype: torch.dtype | None
    scaled: bool = False
    gpu_only: bool = False

    def autocast(self, device) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=self.dtype)

    def scaler(self, device) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(torch.device(device).type) if self.scaled else None


PRECISION = {p.name: p for p in (Precision("fp32", None),
                                 Precision("bf16", torch.bfloat16),
                                 Precision("fp16", torch.float16, scaled=True, gpu_only=True))}


def check_recipe(cfg, device: str) -> None:
    """The combinations that cannot work, refused before anything runs (one line each):
    fp16 without a GPU (``device``: the one the run's workers get), and what the batched
    simulator does not compute."""
    icfg = cfg.algo.inner
    if PRECISION[icfg.precision].gpu_only and torch.device(device).type != "cuda":
        raise ConfigError(f"algo.inner.precision = {icfg.precision!r} needs a GPU (torch.amp's "
                          "gradient scaler); on the CPU use bf16 or fp32")
    if icfg.compile and torch.device(device).type == "cpu" and not _cxx():
        raise ConfigError("algo.inner.compile = true on the CPU needs a C++ compiler (torch "
                          "inductor builds its kernels with one): install g++ or set CXX, or "
                          "drop --compile")
    if cfg.sim.batched:
        extra = [(icfg.micro_batches > 1, "gradient accumulation"),
                 (icfg.precision != "fp32", f"precision {icfg.precision}"),
                 (icfg.compile, "torch.compile")]
        why = [text for applies, text in extra if applies]
        if why:
            raise ConfigError(f"sim.batched = true computes one fp32 pass per AdamW step, not "
                              f"{' or '.join(why)}; set sim.batched = false")


def _cxx() -> str | None:
    """The C++ compiler torch inductor would use on the CPU: $CXX, else g++ or clang++."""
    return shutil.which(os.environ.get("CXX", "")) or shutil.which("g++") \
        or shutil.which("clang++")
