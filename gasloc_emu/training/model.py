"""A small GPT (pre-norm, causal self-attention, tied embeddings) and its named presets, or a
model a user brings (``model.preset = package.module:factory``, or a name registered under the
entry-point group ``gasloc_emu.models``): a factory taking the vocabulary size and the context
length and returning a module that maps tokens (B, T) to logits (B, T, vocab).

Parameters live as views into one flat buffer (``flatten_parameters``), so the algorithms work
on a single contiguous vector: the outer step, gossip and the wire all see one tensor, and no
per-round copy between the model and that vector is ever needed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from gasloc_emu import plugins
from gasloc_emu.config import ConfigError

MODEL_GROUP = "gasloc_emu.models"

PRESETS = {
    # name: (n_layer, n_head, n_embd, block_size, vocab_size)
    "tiny": (2, 2, 64, 64, 256),        # ~0.12M parameters: CI and integration tests
    "small": (5, 4, 128, 128, 256),     # ~1.0M parameters: benchmarks and reproduction on CPU
    "gpt2": (12, 12, 768, 1024, 50304),  # the 124M GPT-2 shape, for GPU users with a token file
}


# The corpus a preset trains on when data.path is empty (a name of training.corpora.CORPORA):
# tiny, for CI, the byte-level Python sources; the language-model presets English prose
DEFAULT_CORPUS = {"tiny": "stdlib", "small": "pydoc-topics", "gpt2": "pydoc-topics"}


def default_corpus(mcfg) -> str:
    """The preset's default corpus; a user's model gets tiny's."""
    return DEFAULT_CORPUS.get(mcfg.preset, DEFAULT_CORPUS["tiny"])


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    dropout: float = 0.0


def is_plugin(mcfg) -> bool:
    """A model the user brings rather than one of the GPT presets."""
    return mcfg.preset not in PRESETS


def shape_from_config(mcfg) -> GPTShape:
    """Preset values, each replaced by the config's value where that is non-zero; a plugin
    model takes the vocabulary and context length from the config, tiny's where unset."""
    preset = "tiny" if is_plugin(mcfg) else mcfg.preset
    base = dict(zip(("n_layer", "n_head", "n_embd", "block_size", "vocab_size"),
                    PRESETS[preset], strict=True))
    for key in base:
        base[key] = getattr(mcfg, key) or base[key]
    if base["n_embd"] % base["n_head"]:
        raise ConfigError(f"model.n_embd = {base['n_embd']} must be divisible by "
                         f"model.n_head = {base['n_head']}")
    return GPTShape(dropout=mcfg.dropout, **base)


class CausalSelfAttention(nn.Module):
    def __init__(self, s: GPTShape):
        super().__init__()
        self.n_head = s.n_head
        self.qkv = nn.Linear(s.n_embd, 3 * s.n_embd)
        self.proj = nn.Linear(s.n_embd, s.n_embd)
        self.dropout = s.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, s: GPTShape):
        super().__init__()
        self.ln1 = nn.LayerNorm(s.n_embd)
        self.attn = CausalSelfAttention(s)
        self.ln2 = nn.LayerNorm(s.n_embd)
        self.mlp = nn.Sequential(nn.Linear(s.n_embd, 4 * s.n_embd), nn.GELU(),
                                 nn.Linear(4 * s.n_embd, s.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, s: GPTShape):
        super().__init__()
        self.shape = s
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.wpe = nn.Embedding(s.block_size, s.n_embd)
        self.drop = nn.Dropout(s.dropout)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.n_layer))
        self.ln_f = nn.LayerNorm(s.n_embd)
        self.head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # weight tying (Press & Wolf 2017)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * s.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def flatten_parameters(model: nn.Module) -> torch.Tensor:
    """Move every parameter into one contiguous buffer and make the parameters views of it.

    Returns the flat buffer. Writing into it changes the model and vice versa, so an outer
    step is a handful of vector operations on this tensor.
    """
    params = list(model.parameters())  # tied weights appear once
    total = sum(p.numel() for p in params)
    flat = torch.empty(total, dtype=params[0].dtype, device=params[0].device)
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[offset:offset + n].copy_(p.reshape(-1))
            p.data = flat[offset:offset + n].view_as(p)
            offset += n
    return flat


class TokensToLogits(nn.Module):
    """A user's model (tokens to logits) with the loss the workers train on, as ``GPT``'s
    forward gives it: ``(logits, cross-entropy or None)``."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.inner(idx)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _construct(mcfg) -> nn.Module:
    shape = shape_from_config(mcfg)
    if not is_plugin(mcfg):
        return GPT(shape)
    factory = plugins.load(mcfg.preset, MODEL_GROUP, "model.preset", also=tuple(PRESETS))
    made = factory(shape.vocab_size, shape.block_size)
    if not isinstance(made, nn.Module) or not any(True for _ in made.parameters()):
        raise plugins.PluginError(f"model.preset = {mcfg.preset!r} returned {type(made).__name__}"
                                  ", not a torch.nn.Module with parameters")
    return TokensToLogits(made)


def check_model(mcfg) -> None:
    """The configured model can be built: its shape splits, and a plugin's factory loads and
    maps a batch of tokens to logits of the vocabulary's width (on the meta device)."""
    shape = shape_from_config(mcfg)
    if not is_plugin(mcfg):
        return
    with torch.device("meta"):
        net = _construct(mcfg)
        logits, _ = net(torch.zeros(2, shape.block_size, dtype=torch.long))
    if tuple(logits.shape) != (2, shape.block_size, shape.vocab_size):
        raise plugins.PluginError(f"model.preset = {mcfg.preset!r} maps tokens (2, "
                                  f"{shape.block_size}) to {tuple(logits.shape)}; expected "
                                  f"(2, {shape.block_size}, {shape.vocab_size})")


def gpt_num_params(s: GPTShape) -> int:
    """The GPT's parameters from its shape: token and position tables, per block two layer
    norms, the attention's qkv and output projections and the 4x MLP (weights and biases),
    the final norm; the head is tied to the token table."""
    c = s.n_embd
    block = 2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c)
    return s.vocab_size * c + s.block_size * c + s.n_layer * block + 2 * c


def count_parameters(mcfg) -> int:
    """Parameters of the configured model: the GPT's from its shape, a plugin's counted on the
    meta device (nothing allocated). Not the GPT on the meta device: its initialisers there
    import torch's compiler, seconds of every worker's start."""
    if not is_plugin(mcfg):
        return gpt_num_params(shape_from_config(mcfg))
    with torch.device("meta"):
        net = _construct(mcfg)
    return net.num_params()


def build_model(mcfg, seed: int,
                device: str | torch.device = "cpu") -> tuple[nn.Module, torch.Tensor]:
    """The model initialised from ``seed`` (identical on every worker) and its flat buffer."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = _construct(mcfg)
    finally:
        torch.random.set_rng_state(gen_state)
    model.to(device)
    return model, flatten_parameters(model)
