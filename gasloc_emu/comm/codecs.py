"""Codecs: a float32 vector to one byte frame and back, the fewer bytes the better.

Each codec is a pure function pair (no state, no sockets): ``encode(x, salt)`` gives a uint8
tensor of exactly ``nbytes(numel)`` bytes, ``decode(frame, numel)`` a fresh float32 vector.
What a lossy codec drops is kept by its caller (``comm.feedback``) and added to the next
message, so that nothing is lost over rounds. Layouts put 4-byte fields first, so a received
frame views as its parts without a copy:

- ``bf16``: numel bfloat16 values (round to nearest even).
- ``int8``: one float32 scale per block of ``block_size`` values (the block's largest magnitude
  / 127), then numel int8 values rounded to nearest (Dettmers et al. 2022's block-wise absmax).
- ``int4``: as ``int8`` with a scale per block of largest / 7 and two values a byte (value + 8
  in each nibble, low nibble first).
- ``topk``: the ``k = ratio * numel`` largest magnitudes: k int32 indices, strictly increasing,
  then their k float32 values (Aji & Heafield 2017; Lin et al. 2018, "Deep Gradient
  Compression").
- ``randk``: k values at indices drawn without replacement from the frame's int64 salt, so the
  indices need not travel (Stich et al. 2018): the salt, then k float32 values.

A frame comes from the network, so ``check(frame, numel)`` says what is wrong with one that has
the right length but impossible content (an index out of range or out of order); the
transport drops such a frame as it drops one of the wrong shape.

``comm.codec`` names a codec class through ``codec_class``, one path for all of them: a
built-in (``BUILTIN``, the names of ``config.CODECS``), a name an installed package registers
under the entry-point group ``gasloc_emu.codecs``, or ``package.module:Class``. The class
builds itself from the ``comm.*`` settings with ``from_settings``.
"""
from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch

from gasloc_emu import plugins
from gasloc_emu.config import CODECS

_F32 = 4
_SALT_MASK = 2**63 - 1  # a salt fits the frame's int64 as it is
_CHUNK = 1 << 16  # values a quantiser handles at once: its temporaries stay in cache
_SAMPLE = 1 << 16  # values topk's threshold is estimated from


class Codec:
    """One codec's rule. ``summable``: a partial sum may be decoded, added to and encoded again
    at every hop of a ring (dense quantisers); otherwise each worker's message is gathered
    whole and summed after decoding (sparse codecs)."""

    name: ClassVar[str] = "codec"
    summable: ClassVar[bool] = True

    def nbytes(self, numel: int) -> int:
        raise NotImplementedError

    def encode(self, x: torch.Tensor, salt: int = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (1-D float32, CPU) as one uint8 frame of ``nbytes(x.numel())`` bytes, written
        into ``out`` when given."""
        raise NotImplementedError

    def decode(self, frame: torch.Tensor, numel: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """``numel`` float32 values from a frame that passed ``check``, in ``out`` when given
        (a fresh vector otherwise)."""
        raise NotImplementedError

    def check(self, frame: torch.Tensor, numel: int) -> str | None:
        """Why a frame of the right length cannot be one of this codec's, or None."""
        return None

    def describe(self) -> str:
        return self.name

    @classmethod
    def from_settings(cls, ratio: float, block_size: int) -> Codec:
        """The codec as ``comm.ratio`` and ``comm.block_size`` configure it (each class takes
        what applies to it; a bad value is a ``ValueError`` naming it)."""
        return cls()


class BF16(Codec):
    name = "bf16"

    def nbytes(self, numel: int) -> int:
        return 2 * numel

    def encode(self, x: torch.Tensor, salt: int = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
        frame = _frame(out, self.nbytes(x.numel()))
        frame.view(torch.bfloat16).copy_(x)
        return frame

    def decode(self, frame: torch.Tensor, numel: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.empty(numel) if out is None else out
        return out.copy_(frame.view(torch.bfloat16))


class BlockQuant(Codec):
    """Block-wise absmax quantisation to signed integers of ``bits`` bits."""

    bits: ClassVar[int] = 8

    def __init__(self, block_size: int):
        if type(block_size) is not int or not 8 <= block_size <= 65536:
            raise ValueError(f"block_size = {block_size!r} is out of range; expected an int in "
                             "[8, 65536]")
        self.block_size = block_size
        self.levels = 2 ** (self.bits - 1) - 1  # 127 or 7: symmetric, zero exact

    def blocks(self, numel: int) -> int:
        return -(-numel // self.block_size)

    def nbytes(self, numel: int) -> int:
        return _F32 * self.blocks(numel) + self.value_bytes(numel)

    def value_bytes(self, numel: int) -> int:
        return numel if self.bits == 8 else -(-numel // 2)

    def describe(self) -> str:
        return f"{self.name} (blocks of {self.block_size})"

    @classmethod
    def from_settings(cls, ratio: float, block_size: int) -> Codec:
        return cls(block_size)

    @torch.no_grad()
    def encode(self, x: torch.Tensor, salt: int = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
        numel, nb, size = x.numel(), self.blocks(x.numel()), self.block_size
        frame = _frame(out, self.nbytes(numel))
        scales, values = frame[:_F32 * nb].view(torch.float32), frame[_F32 * nb:]
        buf = torch.empty(min(self.rows_per_chunk(), nb), size)
        for r0, rows in self._row_chunks(x):  # chunks that stay in cache: one pass over memory
            r1 = r0 + rows.shape[0]
            ints = buf[:r1 - r0]
            self._encode_rows(rows, scales[r0:r1], ints)
            self._pack(ints.view(-1)[:numel - r0 * size],
                       values[self.value_bytes(r0 * size):self.value_bytes(min(numel, r1 * size))])
        return frame

    def _row_chunks(self, x: torch.Tensor):
        """(first block, a view of whole blocks) over ``x``; a short last block comes padded
        with zeros, so only it is copied."""
        size, per = self.block_size, self.rows_per_chunk()
        whole = x.numel() // size
        head = x[:whole * size].view(whole, size)
        for r0 in range(0, whole, per):
            yield r0, head[r0:r0 + per]
        if whole * size < x.numel():
            yield whole, _padded(x[whole * size:], size).view(1, size)

    def rows_per_chunk(self) -> int:
        return max(1, _CHUNK // self.block_size)

    def _encode_rows(self, rows: torch.Tensor, scales: torch.Tensor, ints: torch.Tensor) -> None:
        """Scales and rounded values of whole blocks; amax and amin are vectorised reductions
        (aminmax and abs().amax are several times slower here)."""
        amax = torch.maximum(rows.amax(1), rows.amin(1).neg_())
        torch.div(amax, self.levels, out=scales)
        inv = torch.where(amax > 0, self.levels / amax, 0.0)
        torch.mul(rows, inv[:, None], out=ints).round_()

    def _pack(self, ints: torch.Tensor, out: torch.Tensor) -> None:
        out.view(torch.int8).copy_(ints)

    def _unpack(self, values: torch.Tensor, count: int) -> torch.Tensor:
        return values.view(torch.int8)

    @torch.no_grad()
    def decode(self, frame: torch.Tensor, numel: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        nb, size = self.blocks(numel), self.block_size
        scales, values = frame[:_F32 * nb].view(torch.float32), frame[_F32 * nb:]
        out = torch.empty(numel) if out is None else out
        per = self.rows_per_chunk() * size
        for v0 in range(0, numel, per):
            v1 = min(numel, v0 + per)
            chunk = out[v0:v1]
            chunk.copy_(self._unpack(values[self.value_bytes(v0):self.value_bytes(v1)],
                                     v1 - v0))
            _scale_blocks(chunk, scales[v0 // size:-(-v1 // size)], size)
        return out


class Int8(BlockQuant):
    name = "int8"


class Int4(BlockQuant):
    name = "int4"
    bits = 4

    def _pack(self, ints: torch.Tensor, out: torch.Tensor) -> None:
        nibbles = _padded(ints.add(8), 2 * out.numel()).to(torch.uint8)  # [1, 15]; pad 0
        torch.bitwise_or(nibbles[0::2], nibbles[1::2].bitwise_left_shift(4), out=out)

    def _unpack(self, values: torch.Tensor, count: int) -> torch.Tensor:
        pairs = torch.stack((values.bitwise_and(15), values.bitwise_right_shift(4)), dim=1)
        return pairs.view(-1)[:count].to(torch.int8).sub_(8)


class Sparse(Codec):
    """k of numel values; ``ratio`` is k / numel (at least one value)."""

    summable = False

    def __init__(self, ratio: float):
        if not (isinstance(ratio, (int, float)) and 0 < ratio <= 1):
            raise ValueError(f"ratio = {ratio!r} is out of range; expected a number in (0, 1]")
        self.ratio = float(ratio)

    def k(self, numel: int) -> int:
        return max(1, min(numel, round(self.ratio * numel)))

    def describe(self) -> str:
        return f"{self.name} ({self.ratio:g} of the values)"

    @classmethod
    def from_settings(cls, ratio: float, block_size: int) -> Codec:
        return cls(ratio)


class TopK(Sparse):
    name = "topk"

    def nbytes(self, numel: int) -> int:
        return 2 * _F32 * self.k(numel)

    @torch.no_grad()
    def encode(self, x: torch.Tensor, salt: int = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
        k = self.k(x.numel())
        idx = top_indices(x.abs(), k)
        frame = _frame(out, 2 * _F32 * k)
        frame[:_F32 * k].view(torch.int32).copy_(idx)
        torch.index_select(x, 0, idx, out=frame[_F32 * k:].view(torch.float32))
        return frame

    def _parts(self, frame: torch.Tensor, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k(numel)
        return frame[:_F32 * k].view(torch.int32), frame[_F32 * k:].view(torch.float32)

    def check(self, frame: torch.Tensor, numel: int) -> str | None:
        idx, _ = self._parts(frame, numel)
        if int(idx[0]) < 0 or int(idx[-1]) >= numel:
            return f"an index outside [0, {numel})"
        if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
            return "indices not strictly increasing"
        return None

    @torch.no_grad()
    def decode(self, frame: torch.Tensor, numel: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        idx, values = self._parts(frame, numel)
        return _zeros(out, numel).index_copy_(0, idx.long(), values)


def top_indices(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the k largest values, in increasing order. torch.topk over a large vector
    is slow (5 s for 124M values here), so a threshold from an evenly spaced sample keeps about
    twice k candidates, and topk runs over those; exact, because every value left out is below
    the threshold and the k-th largest candidate is not. Falls back to a full topk when the
    sample's threshold keeps fewer than k."""
    n = magnitude.numel()
    if n < 64 * _SAMPLE or 4 * k > n:  # small vectors: torch.topk is as fast
        return torch.topk(magnitude, k, sorted=False).indices.sort().values
    sample = magnitude[::n // _SAMPLE]
    threshold = torch.kthvalue(sample, max(1, sample.numel() - 2 * k * sample.numel() // n)).values
    candidates = (magnitude >= threshold).nonzero().squeeze(1)
    if candidates.numel() < k:
        return torch.topk(magnitude, k, sorted=False).indices.sort().values
    best = torch.topk(magnitude[candidates], k, sorted=False).indices
    return candidates[best].sort().values


class RandK(Sparse):
    name = "randk"

    def nbytes(self, numel: int) -> int:
        return 8 + _F32 * self.k(numel)

    def indices(self, salt: int, numel: int) -> torch.Tensor:
        """k distinct indices in increasing order, the same for the same salt everywhere."""
        rng = np.random.Generator(np.random.PCG64(salt & _SALT_MASK))
        picked = rng.choice(numel, size=self.k(numel), replace=False, shuffle=False)
        return torch.from_numpy(np.sort(picked).astype(np.int64))

    @torch.no_grad()
    def encode(self, x: torch.Tensor, salt: int = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
        frame = _frame(out, self.nbytes(x.numel()))
        frame[:8].view(torch.int64).fill_(salt & _SALT_MASK)
        torch.index_select(x, 0, self.indices(salt, x.numel()),
                           out=frame[8:].view(torch.float32))
        return frame

    @torch.no_grad()
    def decode(self, frame: torch.Tensor, numel: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        salt = int(frame[:8].view(torch.int64))
        return _zeros(out, numel).index_copy_(0, self.indices(salt, numel),
                                              frame[8:].view(torch.float32))


BUILTIN: dict[str, type[Codec]] = {c.name: c for c in (BF16, Int8, Int4, TopK, RandK)}

GROUP = "gasloc_emu.codecs"


def codec_class(name: str) -> type[Codec]:
    """The class ``comm.codec = name`` means: a built-in, a name registered under the
    entry-point group ``gasloc_emu.codecs``, or ``package.module:Class`` (a one-line
    ``ConfigError`` when it means none, or names something that is not a ``Codec``)."""
    if name in BUILTIN:
        return BUILTIN[name]
    if not plugins.is_path(name) and name not in plugins.registered(GROUP):
        known = ", ".join([*CODECS, *sorted(plugins.registered(GROUP))])
        raise plugins.PluginError(f"comm.codec = {name!r} is unknown; expected one of {known}, "
                                  "or package.module:Class")
    cls = plugins.load(name, GROUP, "comm.codec")
    if not (isinstance(cls, type) and issubclass(cls, Codec)):
        raise plugins.PluginError(f"comm.codec = {name!r} is {cls!r}, not a subclass of "
                                  "gasloc_emu.comm.codecs.Codec")
    return cls


def make_codec(name: str, ratio: float = 0.01, block_size: int = 256) -> Codec | None:
    """The codec of ``comm.codec``; None for ``none`` (messages travel as float32, untouched)."""
    if name == "none":
        return None
    return codec_class(name).from_settings(ratio, block_size)


def _padded(x: torch.Tensor, length: int) -> torch.Tensor:
    """``x`` itself when it has ``length`` values, else a copy with zeros after it."""
    if x.numel() == length:
        return x
    out = torch.zeros(length, dtype=x.dtype)
    out[:x.numel()].copy_(x)
    return out


def _frame(out: torch.Tensor | None, nbytes: int) -> torch.Tensor:
    """The caller's buffer for a frame (checked), or a new one."""
    if out is None:
        return torch.empty(nbytes, dtype=torch.uint8)
    if out.dtype != torch.uint8 or out.shape != (nbytes,):
        raise ValueError(f"out must be a uint8 tensor of {nbytes} bytes, got {out.dtype} "
                         f"{tuple(out.shape)}")
    return out


def _zeros(out: torch.Tensor | None, numel: int) -> torch.Tensor:
    return torch.zeros(numel) if out is None else out.zero_()


def _scale_blocks(values: torch.Tensor, scales: torch.Tensor, size: int) -> None:
    """Multiply consecutive blocks of ``size`` values (the last may be short) by their
    scales, in place; ``values`` starts at a block boundary."""
    whole = values.numel() // size
    values[:whole * size].view(whole, size).mul_(scales[:whole, None])
    if whole < scales.numel():
        values[whole * size:].mul_(scales[whole])


def ratio_of(codec: Codec | None, numel: int) -> float:
    """Bytes on the wire per byte of float32 for a message of ``numel`` values."""
    return 1.0 if codec is None else codec.nbytes(numel) / (_F32 * numel)


def max_error(codec: Codec, x: torch.Tensor) -> float:
    """The bound on |decode(encode(x)) - x| a dense quantiser promises (half a step of the
    largest block's scale; bf16: 2^-8 relative); inf for sparse codecs (no pointwise bound)."""
    amax = float(x.abs().max()) if x.numel() else 0.0
    if isinstance(codec, BlockQuant):
        return 0.5 * amax / codec.levels * (1 + 1e-6)
    if isinstance(codec, BF16):
        return amax * 2.0 ** -8
    return math.inf
