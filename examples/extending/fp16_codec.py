"""A codec in one file: IEEE half precision, two bytes a value.

Register it under the entry-point group ``gasloc_emu.codecs`` in your package's
pyproject.toml, then run with ``--codec fp16`` (or name it by path:
``--codec fp16_codec:FP16``, with this file's folder importable)::

    [project.entry-points."gasloc_emu.codecs"]
    fp16 = "fp16_codec:FP16"

float16 keeps 11 significant bits where bfloat16 keeps 8, but its range ends at 65504: a
value beyond is sent as the largest half, and the caller's error feedback (``comm.reduce``,
``comm.channel``) carries the rest into the next message.
"""
from __future__ import annotations

import torch

from gasloc_emu.comm.codecs import Codec

_HALF_MAX = 65504.0


class FP16(Codec):
    name = "fp16"
    summable = True          # a partial sum can be decoded, added to and encoded again

    def nbytes(self, numel: int) -> int:
        return 2 * numel

    def encode(self, x: torch.Tensor, salt: int = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
        frame = torch.empty(self.nbytes(x.numel()), dtype=torch.uint8) if out is None else out
        frame.view(torch.float16).copy_(x.clamp(-_HALF_MAX, _HALF_MAX))  # round to nearest
        return frame

    def decode(self, frame: torch.Tensor, numel: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.empty(numel) if out is None else out
        return out.copy_(frame.view(torch.float16))

    def check(self, frame: torch.Tensor, numel: int) -> str | None:
        """A peer's frame holding inf or NaN (never encoded here) is refused."""
        if not bool(torch.isfinite(frame.view(torch.float16)).all()):
            return "a value that is not finite"
        return None
