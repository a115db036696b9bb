"""The ring All-Reduce with compressed messages, in the two forms a codec allows.

Both keep a residual of the model's size (error feedback, Seide et al. 2014; Karimireddy et al.
2019): what a worker's encoding of a message dropped is added to the same coordinates of its
next message, so that over rounds the sums lose nothing but the last round's residuals.

- ``ring_sum`` (summable codecs: bf16, int8, int4): the ring of ``transport.base``, each hop's
  partial sum encoded with its residual, decoded and added to by the next worker. The owner of
  a summed chunk encodes it once for the all-gather and uses the decoded value itself, and the
  others forward that frame as it came, so every worker ends with the same bits.
- ``gather_sum`` (sparse codecs: topk, randk): each worker encodes its whole vector once; the
  frames travel the ring n - 1 times, and every worker decodes them and sums in rank order (the
  same bits everywhere). SparseLoCo and DeMo aggregate sparse messages this way.

A worker's residual is indexed by coordinate, so a ring that re-forms over the living workers
(a scenario) keeps it. Kinds and sizes are the ring's (``rs<s>``, ``ag<s>``) with uint8 frames
of ``codec.nbytes`` bytes; ``transport.schema`` names them for the receiver.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from gasloc_emu.comm.codecs import Codec
from gasloc_emu.transport.base import Transport, ring_positions


def encode_with(codec: Codec, x: torch.Tensor, residual: torch.Tensor,
                salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(frame, decoded) of ``x`` plus ``residual``; ``residual`` becomes what the frame lost."""
    v = x + residual
    frame = codec.encode(v, salt)
    decoded = codec.decode(frame, v.numel())
    torch.sub(v, decoded, out=residual)
    return frame, decoded


def message_salt(*parts: int) -> int:
    """A salt for one message, the same in every process (ints hash deterministically)."""
    return hash(tuple(parts)) & (2**63 - 1)


@torch.no_grad()
def ring_sum(tp: Transport, round_idx: int, tensor: torch.Tensor,
             members: Sequence[int] | None, codec: Codec,
             residual: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over the ring, every hop compressed (module docstring)."""
    ring, r = ring_positions(tp, members)
    n = len(ring)
    if n == 1:
        return tensor.clone()
    chunks, res = torch.tensor_split(tensor, n), torch.tensor_split(residual, n)  # handed over
    to, frm, nxt = ring[(r + 1) % n], ring[(r - 1) % n], (r + 1) % n
    for s in range(n - 1):  # reduce-scatter, as base.ring_all_reduce_sum
        c = (r - s) % n
        frame, _ = encode_with(codec, chunks[c], res[c], message_salt(round_idx, tp.rank, s))
        tp.send(to, round_idx, f"rs{s}", frame, raw_nbytes=_raw(chunks[c]))
        mine = chunks[(r - s - 1) % n]
        mine.add_(codec.decode(tp.recv(frm, round_idx, f"rs{s}"), mine.numel()))
    out = torch.empty_like(tensor)
    outs = torch.tensor_split(out, n)
    passing, decoded = encode_with(codec, chunks[nxt], res[nxt],
                                   message_salt(round_idx, tp.rank, n))
    outs[nxt].copy_(decoded)
    for s in range(n - 1):  # all-gather: the owner's frame, forwarded as it is
        tp.send(to, round_idx, f"ag{s}", passing, raw_nbytes=_raw(outs[(r + 1 - s) % n]))
        passing = tp.recv(frm, round_idx, f"ag{s}")
        c = (r - s) % n
        outs[c].copy_(codec.decode(passing, outs[c].numel()))
    return out


@torch.no_grad()
def gather_sum(tp: Transport, round_idx: int, tensor: torch.Tensor,
               members: Sequence[int] | None, codec: Codec,
               residual: torch.Tensor) -> torch.Tensor:
    """The sum of every worker's decoded message, in rank order (module docstring)."""
    ring, r = ring_positions(tp, members)
    n, numel = len(ring), tensor.numel()
    if n == 1:
        return tensor.clone()
    to, frm = ring[(r + 1) % n], ring[(r - 1) % n]
    frames = {tp.rank: encode_with(codec, tensor, residual, message_salt(round_idx, tp.rank))[0]}
    passing = frames[tp.rank]
    for s in range(n - 1):
        tp.send(to, round_idx, f"ag{s}", passing, raw_nbytes=_raw(tensor))
        passing = tp.recv(frm, round_idx, f"ag{s}")
        frames[ring[(r - s - 1) % n]] = passing
    total = torch.zeros_like(tensor)
    for rank in ring:
        total.add_(codec.decode(frames[rank], numel))
    return total


def _raw(t: torch.Tensor) -> int:
    """A message's bytes before compression (float32 values)."""
    return t.numel() * t.element_size()
