"""The batched simulator's parts alone: the grouped GPT forward equals the model's own, and the
stacked AdamW equals torch's AdamW row by row."""
from __future__ import annotations

import pytest
import torch

from gasloc_emu import config as C
from gasloc_emu.simulator import stacked_gpt
from gasloc_emu.simulator.batched import StackedAdamW
from gasloc_emu.training.model import build_model
from gasloc_emu.training.worker import make_optimizer

N = 3


def _views(net, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    views, offset = {}, 0
    for name, p in net.named_parameters():
        views[name] = flat[:, offset:offset + p.numel()].view(flat.shape[0], *p.shape)
        offset += p.numel()
    return views


@pytest.fixture(scope="module")
def workers():
    """N tiny GPTs with different weights, and one batch of tokens each."""
    mcfg = C.resolve(overrides={"model.preset": "tiny"}).model
    nets = [build_model(mcfg, seed) for seed in range(N)]
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (N, 4, 64), generator=gen)
    y = torch.randint(0, 256, (N, 4, 64), generator=gen)
    return nets, x, y


def test_grouped_forward_and_gradient_equal_each_workers_own(workers):
    nets, x, y = workers
    template = nets[0][0]
    theta = torch.stack([flat for _, flat in nets]).clone().requires_grad_(True)
    losses = stacked_gpt.stacked_loss(template, _views(template, theta), x, y)
    (grad,) = torch.autograd.grad(losses.sum(), theta)
    for k, (net, _) in enumerate(nets):
        net.zero_grad(set_to_none=True)
        _, own = net(x[k], y[k])
        own.backward()
        own_grad = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
        torch.testing.assert_close(losses[k], own.detach(), rtol=1e-6, atol=0)
        torch.testing.assert_close(grad[k], own_grad, rtol=1e-4, atol=1e-7)


def test_only_the_builtin_gpt_without_dropout_takes_the_grouped_forward():
    tiny = C.resolve(overrides={"model.preset": "tiny"}).model
    dropped = C.resolve(overrides={"model.preset": "tiny", "model.dropout": 0.1}).model
    assert stacked_gpt.supports(build_model(tiny, 0)[0])
    assert not stacked_gpt.supports(build_model(dropped, 0)[0])


def test_stacked_adamw_equals_torch_adamw_per_row_with_uneven_steps(workers):
    """Row k takes k + 2 steps on the same gradients torch's AdamW sees for worker k's model;
    weight decay on matrices only, as make_optimizer groups them."""
    nets, _, _ = workers
    icfg = C.resolve(overrides={"algo.inner.weight_decay": 0.5, "algo.inner.lr": 0.01}).algo.inner
    template = nets[0][0]
    decay = torch.cat([torch.full((p.numel(),), float(p.dim() >= 2))
                       for p in template.parameters()])
    theta = torch.stack([flat for _, flat in nets]).clone()
    stacked = StackedAdamW(N, decay, icfg)
    gen = torch.Generator().manual_seed(1)
    grads = torch.randn(N + 1, *theta.shape, generator=gen)
    for s in range(N + 1):
        rows = torch.tensor([k for k in range(N) if s < k + 2], dtype=torch.long)
        own = theta[rows]
        stacked.step(rows, own, grads[s][rows])
        theta[rows] = own
    for k, (net, _) in enumerate(nets):
        opt = make_optimizer(net, icfg)
        for s in range(k + 2):
            offset = 0
            for p in net.parameters():
                p.grad = grads[s][k, offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        torch.testing.assert_close(theta[k], flat, rtol=1e-6, atol=1e-7)
    assert stacked.steps == [2, 3, 4]


@pytest.mark.parametrize("tables", [True, False])
def test_the_stacked_weight_decay_follows_the_recipes_groups(tables):
    from gasloc_emu.simulator.batched import BatchedInner
    net, _ = build_model(C.ModelConfig(), seed=0)
    icfg = C.InnerConfig(decay_embeddings=tables)
    decay = BatchedInner(None, net, icfg, 2).opt.decay
    names = [n for n, _ in net.named_parameters()]   # the flat layout's order, tied once
    offset = 0
    for name, p in zip(names, net.parameters(), strict=True):
        part = decay[offset:offset + p.numel()]
        offset += p.numel()
        table = name in ("wte.weight", "wpe.weight")
        expected = icfg.weight_decay if p.dim() >= 2 and (tables or not table) else 0.0
        assert torch.all(part == expected), name
