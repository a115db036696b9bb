"""The inner recipe: the lr schedule at known steps, gradient accumulation against one big
batch, bf16 training on tiny, which parameters decay, and the settings refused."""
from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.memory import Hub
from gasloc_emu.training import recipe as R
from gasloc_emu.training.worker import Worker, make_optimizer

# ---------------------------------------------------------------- the schedule (pure)


def test_cosine_with_warmup_at_known_steps():
    s = R.LRSchedule(1e-3, "cosine", warmup_steps=10, total_steps=110, min_ratio=0.1)
    assert s.lr_at(0) == pytest.approx(1e-4)          # (0 + 1) / 10 of the lr
    assert s.lr_at(4) == pytest.approx(5e-4)
    assert s.lr_at(9) == pytest.approx(1e-3)          # warmup's last step: the full lr
    assert s.lr_at(10) == pytest.approx(1e-3)         # decay's start: cos(0)
    assert s.lr_at(60) == pytest.approx(0.55e-3)      # half way: 0.1 + 0.9 * 0.5
    assert s.lr_at(35) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))))
    assert s.lr_at(110) == pytest.approx(1e-4)        # the floor
    assert s.lr_at(10_000) == pytest.approx(1e-4)     # and it stays there


def test_linear_and_constant_at_known_steps():
    lin = R.LRSchedule(2.0, "linear", warmup_steps=0, total_steps=100, min_ratio=0.0)
    assert [lin.lr_at(k) for k in (0, 25, 50, 100, 200)] == pytest.approx([2, 1.5, 1, 0, 0])
    const = R.LRSchedule(1.0, "constant", warmup_steps=4)
    assert [const.lr_at(k) for k in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])


@given(decay=st.sampled_from(["cosine", "linear"]), warmup=st.integers(0, 50),
       extra=st.integers(1, 500), floor=st.floats(0.0, 1.0))
def test_decay_never_rises_and_stays_between_floor_and_lr(decay, warmup, extra, floor):
    s = R.LRSchedule(1.0, decay, warmup, warmup + extra, floor)
    after = [s.factor(k) for k in range(warmup, warmup + extra + 3)]
    assert all(b <= a + 1e-12 for a, b in pairwise(after))
    assert all(floor - 1e-12 <= f <= 1.0 + 1e-12 for f in after)


def test_a_decay_no_longer_than_its_warmup_is_refused():
    with pytest.raises(C.ConfigError, match="schedule_steps"):
        R.LRSchedule(1.0, "cosine", warmup_steps=10, total_steps=10)


# ---------------------------------------------------------------- the worker's steps

TINY = {"workers": 2, "data.max_corpus_mb": 0.25, "data.eval_batches": 1, "data.batch_size": 2,
        "run.rounds": 2, "algo.local_steps": 3, "algo.name": "diloco"}


def _worker(**over) -> Worker:
    plan = build_plan(C.resolve(overrides=TINY | over))
    return Worker(plan, 0, Hub(2).transport(0))


class _Fixed:
    """A shard that hands out slices of one fixed batch, in order."""

    def __init__(self, x, y, size):
        self.x, self.y, self.size, self.at = x, y, size, 0
        self.batch_size, self.block_size = size, x.shape[1]

    def batch(self, device="cpu"):
        lo, self.at = self.at, self.at + self.size
        return self.x[lo:self.at], self.y[lo:self.at]


def _grad(worker: Worker) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in worker.gpt.parameters()])


def test_accumulated_micro_batches_give_the_big_batch_gradient():
    big = _worker(**{"algo.inner.grad_clip": 0.0})
    x, y = big.shard.batch()
    x, y = torch.cat([x] * 4) + 0, torch.cat([y] * 4)
    x[2:] = torch.randint(0, 256, x[2:].shape, generator=torch.Generator().manual_seed(1))
    big.shard = _Fixed(x, y, 8)
    loss_big = big.gradient()
    acc = _worker(**{"algo.inner.grad_clip": 0.0, "algo.inner.micro_batches": 4})
    acc.shard = _Fixed(x, y, 2)
    loss_acc = acc.gradient()
    assert acc.shard.at == 8                          # four passes of two sequences
    assert float(loss_acc) == pytest.approx(float(loss_big), rel=1e-6)
    err = (_grad(acc) - _grad(big)).abs().max().item()
    assert err <= 1e-6 * _grad(big).abs().max().item() + 1e-9, err
    # one micro batch alone is not the big batch's gradient: the check can fail
    one = _worker(**{"algo.inner.grad_clip": 0.0})
    one.shard = _Fixed(x, y, 2)
    one.gradient()
    assert (_grad(one) - _grad(big)).abs().max().item() > 1e-4


def test_the_scheduled_lr_reaches_the_optimizer_and_the_row():
    w = _worker(**{"algo.inner.schedule": "linear", "algo.inner.warmup_steps": 2,
                   "algo.inner.min_lr_ratio": 0.0})
    assert w.schedule.total_steps == 6                 # rounds * H
    seen = []
    for _ in range(4):
        w.train_step()
        seen.append(w.opt.param_groups[0]["lr"])
    assert seen == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3 * 0.75])
    assert w.current_lr() == pytest.approx(0.75e-3)


def test_constant_lr_leaves_the_optimizer_alone():
    w = _worker()
    assert w.schedule is None and w.current_lr() is None
    w.train_step()
    assert w.opt.param_groups[0]["lr"] == 1e-3


def test_bf16_training_lowers_the_loss_on_tiny():
    w = _worker(**{"algo.inner.precision": "bf16", "data.batch_size": 8})
    seen = []
    w.gpt.blocks[0].mlp[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    batches = [w.eval_set[0]]
    from gasloc_emu.training.data import evaluate
    before = evaluate(w.gpt, batches)
    losses = [float(w.train_step()) for _ in range(30)]
    assert math.isfinite(losses[-1])
    assert evaluate(w.gpt, batches) < before - 0.5, (before, losses[-5:])
    assert w.theta.dtype == torch.float32              # parameters stay float32
    assert seen.count(torch.bfloat16) == 30            # the training passes ran under autocast
    assert seen[0] == seen[-1] == torch.float32       # evaluation did not


def test_weight_decay_groups():
    w = _worker()
    names = {id(p): n for n, p in w.gpt.named_parameters()}
    decayed = {names[id(p)] for p in make_optimizer(w.gpt, C.InnerConfig()).param_groups[0]
               ["params"]}
    assert "wte.weight" in decayed and "wpe.weight" in decayed   # nanoGPT's rule: tables decay
    assert "blocks.0.attn.qkv.weight" in decayed
    assert not any(n.endswith("bias") or ".ln" in n or n.startswith("ln_f") for n in decayed)
    no_tables = make_optimizer(w.gpt, C.InnerConfig(decay_embeddings=False))
    decayed = {names[id(p)] for p in no_tables.param_groups[0]["params"]}
    assert "wte.weight" not in decayed and "wpe.weight" not in decayed
    assert "blocks.0.mlp.0.weight" in decayed


# ---------------------------------------------------------------- refused, one line each

@pytest.mark.parametrize("over, words", [
    ({"algo.inner.precision": "fp16", "run.device": "cpu"}, "needs a GPU"),
    ({"algo.inner.precision": "bf16", "sim.batched": True, "compute.step_time_s": 0.01},
     "not precision bf16"),
    ({"algo.inner.micro_batches": 2, "sim.batched": True, "compute.step_time_s": 0.01},
     "gradient accumulation"),
    ({"algo.inner.schedule": "cosine", "compute.inner_budget_s": 1.0}, "schedule_steps"),
    ({"algo.inner.schedule": "cosine", "algo.inner.warmup_steps": 6}, "warmup"),
    ({"algo.inner.warmup_steps": 9, "algo.inner.schedule_steps": 5}, "longer than"),
    ({"algo.inner.precision": "fp8"}, "one of 'fp32', 'bf16', 'fp16'"),
])
def test_settings_that_cannot_work_are_refused_in_one_line(over, words):
    with pytest.raises(C.ConfigError) as err:
        build_plan(C.resolve(overrides=TINY | over), data=False)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_registries_are_the_configs_choices():
    assert tuple(R.PRECISION) == C.PRECISIONS
    assert tuple(R._DECAYS) == C.LR_SCHEDULES


def test_compile_on_the_cpu_without_a_compiler_is_refused(monkeypatch):
    monkeypatch.setattr(R.shutil, "which", lambda name: None)
    with pytest.raises(C.ConfigError, match="needs a C.. compiler"):
        build_plan(C.resolve(overrides=TINY | {"algo.inner.compile": True,
                                               "run.device": "cpu"}), data=False)
