"""The built-in GPT (``training.model.GPT``) over N workers' parameters at once.

The same network as ``GPT.forward``, written with grouped matrix products: every weight has a
leading worker dimension, a linear layer is one ``baddbmm`` over the workers, and attention
folds the workers into the batch so that PyTorch's fused causal attention runs once. This is
what ``torch.func.vmap`` of ``functional_call`` computes too, but without its per-worker
fallback for fused attention and its extra copies; other models (plugins, dropout) take the
vmap path (``simulator.batched``). A unit test holds the two forwards equal.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gasloc_emu.training.model import GPT


def supports(net: torch.nn.Module) -> bool:
    """Whether ``stacked_loss`` computes ``net``: the built-in GPT without dropout."""
    return type(net) is GPT and net.shape.dropout == 0.0


def stacked_loss(net: GPT, params: dict[str, torch.Tensor], idx: torch.Tensor,
                 targets: torch.Tensor) -> torch.Tensor:
    """Each worker's mean cross-entropy, shape (N,): ``params`` maps ``net``'s parameter names
    to tensors with a leading worker dimension N; ``idx`` and ``targets`` are (N, B, T)."""
    n, b, t = idx.shape
    s = net.shape
    wte = params["wte.weight"]                                        # (N, V, C)
    # worker k's token ids index rows k*V.. of the workers' tables laid end to end
    rows = idx + torch.arange(n, device=idx.device)[:, None, None] * s.vocab_size
    x = F.embedding(rows, wte.reshape(n * s.vocab_size, s.n_embd))   # (N, B, T, C)
    x = (x + params["wpe.weight"][:, None, :t]).reshape(n, b * t, s.n_embd)
    for i in range(s.n_layer):
        x = _block(params, f"blocks.{i}.", x, b, t, s.n_head)
    x = _layer_norm(params, "ln_f.", x)
    logits = torch.bmm(x, wte.transpose(1, 2))                        # tied head: (N, BT, V)
    loss = F.cross_entropy(logits.reshape(-1, s.vocab_size), targets.reshape(-1),
                           reduction="none")
    return loss.view(n, b * t).mean(dim=1)


def _block(p: dict, at: str, x: torch.Tensor, b: int, t: int, heads: int) -> torch.Tensor:
    x = x + _attention(p, at + "attn.", _layer_norm(p, at + "ln1.", x), b, t, heads)
    h = F.gelu(_linear(p, at + "mlp.0.", _layer_norm(p, at + "ln2.", x)))
    return x + _linear(p, at + "mlp.2.", h)


def _attention(p: dict, at: str, x: torch.Tensor, b: int, t: int, heads: int) -> torch.Tensor:
    n, _, c = x.shape
    q, k, v = _linear(p, at + "qkv.", x).view(n * b, t, 3 * c).split(c, dim=2)
    q, k, v = (z.view(n * b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return _linear(p, at + "proj.", y.transpose(1, 2).reshape(n, b * t, c))


def _linear(p: dict, at: str, x: torch.Tensor) -> torch.Tensor:
    """x W^T + b for each worker's W (N, out, in) and b (N, out)."""
    return torch.baddbmm(p[at + "bias"][:, None, :], x, p[at + "weight"].transpose(1, 2))


def _layer_norm(p: dict, at: str, x: torch.Tensor) -> torch.Tensor:
    y = F.layer_norm(x, x.shape[-1:])
    return torch.addcmul(p[at + "bias"][:, None, :], y, p[at + "weight"][:, None, :])
