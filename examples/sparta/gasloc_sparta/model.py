"""A model of one's own for gasloc-emu (``model.preset = mlp-lm``): a factory taking the
vocabulary size and the context length and returning a module from tokens (B, T) to logits
(B, T, vocab). The workers add the loss, flatten the parameters and do everything else.

This one looks at a single token and its position: an embedding, a two-layer MLP with a
residual connection, and an output head. It trains in seconds on the CPU (a bigram-style
model of byte text), which is all an example needs.
"""
from __future__ import annotations

import torch
from torch import nn

WIDTH = 64


class MLPLanguageModel(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, width: int = WIDTH):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, width)
        self.pos = nn.Embedding(block_size, width)
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(x + self.mlp(x))


def tiny_mlp_lm(vocab_size: int, block_size: int) -> nn.Module:
    """The factory gasloc-emu calls (under the run's seed, so every worker starts equal)."""
    return MLPLanguageModel(vocab_size, block_size)
