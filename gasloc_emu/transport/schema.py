"""What a data-plane message must look like: for each (sender, kind), exactly one shape.

The algorithms send two families of messages, both 1-D vectors of the transport's dtype
(float32), and a receiver knows in advance exactly which shape each one has:

- ``"z"``: gossip (gasloc, dsgd, local-gossip) sends the whole model to each neighbour;
- ``"join"``: a worker hands the whole model to a worker joining the run (a scenario's join);
- ``"rs{s}"`` / ``"ag{s}"`` for s in [0, n-2]: the ring All-Reduce (diloco;
  ``base.ring_all_reduce_sum``) sends one chunk to the next worker on the ring. Worker ``src``
  sends chunk (src - s) % n at reduce-scatter step s and chunk (src + 1 - s) % n at all-gather
  step s; chunk sizes are those of ``torch.tensor_split`` of the model vector into n, so only
  the previous worker on the ring sends these to a receiver. When workers leave and join,
  ``members(t)`` gives round t's ring (the living workers, in rank order): n is its length,
  positions on it replace ranks, and only the previous living worker sends. During a partition
  the ring is the receiver's group: ``members`` is bound to the receiver
  (``World.ring_members(rank)``), so it answers for this receiver's ring only.

``WireSchema.shape_of`` answers from an allow-list built at construction, so a kind or a shape
that no algorithm sends is dropped ("kind", "shape" in ``framing``) before the mailbox holds
anything. Nothing is parsed from the wire string. Tests and benchmarks that need other messages
name them, each with its one shape, in ``extra``. Pure: no sockets, no torch.

With a lossy codec (``comm.codecs``), the kinds named in ``compressed`` and the ring's travel as
uint8 frames of exactly ``codec.nbytes(values)`` bytes (``wire_of``): a summable codec's ring
sends each chunk so, a sparse codec's ring gathers whole messages (``ag<s>`` of the model's
size, no ``rs<s>``; ``comm.reduce``). A frame of the right length whose content the codec
refuses (``codec.check``) is dropped too ("codec").
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gasloc_emu.transport.base import check_rank

Shape = tuple[int, ...]
RING_PHASES = ("rs", "ag")  # reduce-scatter, all-gather (the kinds base.ring_all_reduce_sum sends)
MAX_EXTRA_KINDS = 64


@dataclass(frozen=True)
class Wire:
    """What one message must be on the wire: its dtype's name, its shape, and for a compressed
    frame the number of values it decodes to (None: the values themselves)."""

    dtype: str
    shape: Shape
    values: int | None = None


def chunk_sizes(numel: int, parts: int) -> list[int]:
    """Sizes of ``torch.tensor_split(vector of numel, parts)``: the first numel % parts chunks
    are one element longer."""
    base, longer = divmod(numel, parts)
    return [base + 1] * longer + [base] * (parts - longer)


def ring_chunk(phase: str, step: int, src: int, world_size: int) -> int:
    """The chunk index worker ``src`` sends at ``step`` of ``phase`` of the ring All-Reduce."""
    offset = 0 if phase == "rs" else 1
    return (src + offset - step) % world_size


class WireSchema:
    """The allow-list of one receiver (``rank`` of ``world_size``) for a model of
    ``model_numel`` parameters, plus ``extra`` kinds of one fixed shape each."""

    def __init__(self, rank: int, world_size: int, model_numel: int,
                 extra: Mapping[str, Shape] | None = None,
                 members: Callable[[int], Collection[int]] | None = None,
                 codec: Any = None, compressed: Collection[str] = ("z",),
                 dtype: str = "float32"):
        _check(rank, world_size, model_numel)
        self.codec, self.compressed, self.dtype = codec, frozenset(compressed), dtype
        self.rank, self.world_size, self.model_numel = rank, world_size, model_numel
        self._fixed: dict[str, Shape] = {"z": (model_numel,), "join": (model_numel,)} \
            | _checked_extra(extra or {})
        self._ring = {f"{phase}{s}": (phase, s) for phase in RING_PHASES
                      for s in range(world_size - 1)}
        self._chunks = chunk_sizes(model_numel, world_size)
        self._ring_src = (rank - 1) % world_size
        self.members = members

    def shape_of(self, src: int, kind: str, round_idx: int = 0) -> Shape | None:
        """The one shape a ``kind`` message of round ``round_idx`` from ``src`` has; None when
        ``src`` sends this receiver no such message."""
        fixed = self._fixed.get(kind)
        if fixed is not None:
            return fixed
        step = self._ring.get(kind)
        if step is None:
            return None
        if self.members is not None:
            return self._member_chunk(src, step, round_idx)
        if src != self._ring_src:
            return None
        return (self._chunks[ring_chunk(*step, src, self.world_size)],)

    def wire_of(self, src: int, kind: str, round_idx: int = 0) -> Wire | None:
        """What a ``kind`` message of round ``round_idx`` from ``src`` must be on the wire;
        None when ``src`` sends this receiver no such message."""
        shape = self.shape_of(src, kind, round_idx)
        ring = _is_ring_name(kind)
        if shape is None or self.codec is None or not (ring or kind in self.compressed):
            return None if shape is None else Wire(self.dtype, shape)
        values = math.prod(shape)
        if ring and not self.codec.summable:  # gathered whole: ag<s> only, the model's size
            if kind.startswith("rs"):
                return None
            values = self.model_numel
        return Wire("uint8", (self.codec.nbytes(values),), values)

    def _member_chunk(self, src: int, step: tuple[str, int], round_idx: int) -> Shape | None:
        """A ring chunk's shape on round ``round_idx``'s ring of the living workers."""
        if type(round_idx) is not int or round_idx < 0:
            return None
        ring = sorted(self.members(round_idx))
        if self.rank not in ring or step[1] >= len(ring) - 1:
            return None
        n, pos = len(ring), ring.index(self.rank)
        if src != ring[(pos - 1) % n]:
            return None
        return (chunk_sizes(self.model_numel, n)[ring_chunk(*step, (pos - 1) % n, n)],)

    def max_numel(self) -> int:
        """The most elements any allowed message has (a compressed frame's bytes counted in
        values of the plane's 4-byte dtype)."""
        most = max(math.prod(s) for s in self._fixed.values())
        if self.codec is not None:
            most = max(most, -(-self.codec.nbytes(self.model_numel) // 4))
        return most


def _checked_extra(extra: Mapping[str, Shape]) -> dict[str, Shape]:
    if not isinstance(extra, Mapping) or len(extra) > MAX_EXTRA_KINDS:
        raise ValueError(f"extra must map at most {MAX_EXTRA_KINDS} kinds to shapes, "
                         f"got {extra!r}")
    out = {}
    for kind, shape in extra.items():
        if not isinstance(kind, str) or not kind or kind in ("z", "join") \
                or _is_ring_name(kind):
            raise ValueError(f"extra kind {kind!r} must be a non-empty str that is not an "
                             f"algorithm's kind (z, join, rs<s>, ag<s>)")
        if not (isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"shape of extra kind {kind!r} must be a tuple of ints >= 0, "
                             f"got {shape!r}")
        out[kind] = shape
    return out


def _is_ring_name(kind: str) -> bool:
    """"rs<digits>" or "ag<digits>": an extra kind must never shadow the ring's."""
    return kind[:2] in RING_PHASES and kind[2:].isdigit()


def _check(rank: int, world_size: int, model_numel: int) -> None:
    check_rank(rank, world_size)
    if type(model_numel) is not int or model_numel < 1:
        raise ValueError(f"model_numel must be an int >= 1, got {model_numel!r}")
