"""Wire format of the data plane: a two-frame message ``[msgpack header, raw tensor bytes]``.

The header is a small msgpack map; the payload is the tensor's memory as is (native byte order,
C order), so a send never serialises the tensor and a receive views the received frame in place
(``torch.frombuffer``). Nothing here unpickles or evaluates anything: ``decode`` treats every
frame as hostile and either returns a well-formed ``Message`` or raises ``FrameError``, never any
other exception, because a message from the network must not be able to crash a worker.

Header keys (version 1):
    v           int   format version (``VERSION``)
    src         int   sender's rank
    round       int   outer round the message belongs to
    kind        str   label within the round ("z", "rs0", "ag3", ...), 1..MAX_KIND_CHARS chars
    dtype       str   element type without the "torch." prefix ("float32")
    shape       list  dimensions, ints >= 0
    nbytes      int   payload length in bytes (numel * itemsize)
    deliver_at  float optional: when the userspace shaper lets the message out (time.time())
    sent_at     float optional: when the sender handed the message to its transport
                (time.time()); only ever used to measure links (``mailbox.LinkTally``), never
                for control, because a sender may claim anything
    seq         int   optional: the sender's count of messages to this receiver before this
                one; a gap is messages that never arrived (``mailbox.Numbering``), such as
                those libzmq cut at its size limit with the connection they were on

Exact checks. With a ``schema`` (``schema.WireSchema``; the transport always passes one) the
kind must be one the sender sends this receiver ("kind") and the shape exactly the one the
schema names for it ("shape"). With ``authenticated_as`` (the ZAP user id of the connection the
message came in on, on an authenticated plane) the header's ``src`` must be that user ("spoofed"):
the sender of a message is the authenticated peer, never what its header claims.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack
import torch

from gasloc_emu.transport.auth import user_id
from gasloc_emu.transport.schema import Wire, WireSchema

VERSION = 1
MAX_KIND_CHARS = 64
MAX_DIMS = 16
# A version-1 header is about 100 bytes; anything much longer is not one of ours.
MAX_HEADER_BYTES = 1024
_REQUIRED_KEYS = frozenset({"v", "src", "round", "kind", "dtype", "shape", "nbytes"})
_KNOWN_KEYS = _REQUIRED_KEYS | {"deliver_at", "sent_at", "seq"}
MAX_SEQ = 1 << 62
# optional float header keys: each must be a finite number when present
_TIME_KEYS = ("deliver_at", "sent_at")
# the dtypes a schema may name: the plane's values and compressed frames
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16, "uint8": torch.uint8}


class FrameError(ValueError):
    """A received message is malformed or unwanted; ``reason`` is a short code for drop counters.
    ``numbered``: (src, seq) when the refused message's sender and number are known (its src a
    peer, the connection's own on an authenticated plane), so that it is not also counted as
    never arrived."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.numbered: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Message:
    src: int
    round: int
    kind: str
    tensor: torch.Tensor
    deliver_at: float | None = None
    sent_at: float | None = None
    seq: int | None = None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- encoding (our own, trusted tensors: errors are programming errors, hence ValueError)

def encode(src: int, round: int, kind: str, tensor: torch.Tensor,
           deliver_at: float | None = None, sent_at: float | None = None,
           seq: int | None = None) -> tuple[bytes, memoryview]:
    """Header bytes and a zero-copy view of ``tensor``'s memory, ready for ``send_multipart``.

    The view keeps ``tensor``'s storage alive, so the caller may drop its own reference; it must
    not modify the tensor until the send is done (see the ownership rule in ``base``).
    """
    _check_encodable(src, round, kind, tensor)
    header = {"v": VERSION, "src": src, "round": round, "kind": kind,
              "dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape),
              "nbytes": tensor.numel() * tensor.element_size()}
    for name, value in (("deliver_at", deliver_at), ("sent_at", sent_at)):
        if value is not None:
            header[name] = float(value)
    if seq is not None:
        header["seq"] = int(seq)
    return msgpack.packb(header), _payload_view(tensor)


def _check_encodable(src: int, round: int, kind: str, tensor: torch.Tensor) -> None:
    if not (_is_int(src) and src >= 0 and _is_int(round)):
        raise ValueError(f"src must be an int >= 0 and round an int, got {src!r}, {round!r}")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_KIND_CHARS:
        raise ValueError(f"kind must be a str of 1..{MAX_KIND_CHARS} chars, got {kind!r}")
    if tensor.device.type != "cpu":
        raise ValueError(f"encode needs a CPU tensor, got one on {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(f"encode needs a contiguous tensor, got strides {tensor.stride()}")


def _payload_view(tensor: torch.Tensor) -> memoryview:
    if tensor.numel() == 0:
        return memoryview(b"")
    # a uint8 view works for every dtype, including those numpy lacks (bfloat16)
    flat = tensor.detach().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())


# -- decoding (untrusted bytes: every failure is a FrameError with a reason code)

def decode(frames, *, world_size: int, self_rank: int, dtype: torch.dtype, max_numel: int,
           round_window: tuple[int, int], schema: WireSchema | None = None,
           authenticated_as: str | None = None) -> Message:
    """Validate a received multipart message and view its payload as a tensor.

    ``frames`` are zmq Frames (zero copy: the tensor keeps its frame alive) or any buffers.
    ``round_window`` is inclusive. ``schema``: the exact shape per (src, kind), else any shape
    up to ``max_numel``. ``authenticated_as``: the connection's user id, or None on a plane
    without authentication. Raises ``FrameError`` for anything malformed or unwanted.
    """
    if not isinstance(frames, (list, tuple)) or len(frames) != 2:
        count = len(frames) if isinstance(frames, (list, tuple)) else type(frames).__name__
        raise FrameError("frames", f"expected 2 frames, got {count}")
    header = _unpack_header(_buffer_of(frames[0]))
    _check_keys(header)
    try:
        return _decode_checked(header, frames, world_size, self_rank, dtype, max_numel,
                               round_window, schema, authenticated_as)
    except FrameError as exc:
        exc.numbered = _numbered(header, world_size, self_rank, authenticated_as)
        raise


def _numbered(header: dict, world_size: int, self_rank: int,
              authenticated_as: str | None) -> tuple[int, int] | None:
    """(src, seq) of a refused message whose sender is a peer (the connection's, when it is
    authenticated) and whose number is valid; else None."""
    src, seq = header["src"], header.get("seq")
    if not (_is_int(src) and 0 <= src < world_size and src != self_rank and _is_int(seq)
            and 0 <= seq < MAX_SEQ):
        return None
    if authenticated_as is not None and authenticated_as != user_id(src):
        return None
    return src, seq


def _decode_checked(header: dict, frames, world_size: int, self_rank: int, dtype: torch.dtype,
                    max_numel: int, round_window: tuple[int, int], schema: WireSchema | None,
                    authenticated_as: str | None) -> Message:
    _check_identity(header, world_size, self_rank, round_window)
    if authenticated_as is not None:
        _check_sender(header["src"], authenticated_as)
    seq = header.get("seq")
    if seq is not None and (not _is_int(seq) or not 0 <= seq < MAX_SEQ):
        raise FrameError("seq", f"seq {seq!r} is not an int in [0, {MAX_SEQ})")
    wire = None
    if schema is None:
        shape, numel = _check_shape(header, dtype, max_numel)
    else:
        wire = _check_schema(header, schema)
        shape, numel, dtype = list(wire.shape), math.prod(wire.shape), _DTYPES[wire.dtype]
    payload = _buffer_of(frames[1])
    _check_nbytes(header, numel * dtype.itemsize, payload.nbytes)
    tensor = _view_tensor(payload, dtype, numel).reshape(shape)
    if wire is not None and wire.values is not None:
        _check_codec(schema, tensor, wire.values)
    at, sent = header.get("deliver_at"), header.get("sent_at")
    return Message(header["src"], header["round"], header["kind"], tensor,
                   None if at is None else float(at), None if sent is None else float(sent),
                   seq)


def _buffer_of(frame) -> memoryview:
    """A flat byte view of a zmq Frame (its ``buffer``) or of any bytes-like object."""
    try:
        view = memoryview(getattr(frame, "buffer", frame))
        return view if view.ndim == 1 and view.format == "B" else view.cast("B")
    except (TypeError, ValueError) as exc:
        raise FrameError("frames",
                         f"frame of type {type(frame).__name__} is not bytes ({exc})") from exc


def _unpack_header(raw: memoryview) -> dict:
    if raw.nbytes > MAX_HEADER_BYTES:
        raise FrameError("header", f"header of {raw.nbytes} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True,
                                 max_str_len=MAX_HEADER_BYTES, max_bin_len=MAX_HEADER_BYTES,
                                 max_array_len=MAX_DIMS + 1, max_map_len=len(_KNOWN_KEYS),
                                 max_ext_len=0)
    except Exception as exc:  # msgpack raises many types on garbage; all mean "not a header"
        raise FrameError("header", f"not msgpack ({exc!r})") from None
    if not isinstance(header, dict):
        raise FrameError("header", f"header is a {type(header).__name__}, not a map")
    return header


def _is_int(value) -> bool:
    return type(value) is int  # bool is an int subclass and never a valid rank or size


def _check_keys(header: dict) -> None:
    missing, unknown = _REQUIRED_KEYS - header.keys(), header.keys() - _KNOWN_KEYS
    if missing or unknown:
        raise FrameError("header", f"missing keys {sorted(missing)}, unknown keys "
                                   f"{sorted(map(str, unknown))}")
    if header["v"] != VERSION or not _is_int(header["v"]):
        raise FrameError("version", f"format version {header['v']!r}, expected {VERSION}")
    for name in _TIME_KEYS:
        at = header.get(name)
        if at is not None and (type(at) not in (int, float) or not math.isfinite(at)):
            raise FrameError(name, f"{name} {at!r} is not a finite number")


def _check_identity(header: dict, world_size: int, self_rank: int,
                    round_window: tuple[int, int]) -> None:
    src, rnd, kind = header["src"], header["round"], header["kind"]
    if not _is_int(src) or not 0 <= src < world_size or src == self_rank:
        raise FrameError("src", f"sender {src!r} is not a peer of worker {self_rank} "
                                f"(world size {world_size})")
    lo, hi = round_window
    if not _is_int(rnd) or not lo <= rnd <= hi:
        raise FrameError("round", f"round {rnd!r} outside the window [{lo}, {hi}]")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_KIND_CHARS:
        raise FrameError("kind", f"kind {kind!r} is not a str of 1..{MAX_KIND_CHARS} chars")


def _check_shape(header: dict, dtype: torch.dtype, max_numel: int) -> tuple[list[int], int]:
    if header["dtype"] != dtype_name(dtype):
        raise FrameError("dtype", f"dtype {header['dtype']!r}, expected {dtype_name(dtype)!r}")
    shape = header["shape"]
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(_is_int(d) and d >= 0 for d in shape)):
        raise FrameError("shape", f"shape {shape!r} is not a list of at most {MAX_DIMS} "
                                  f"ints >= 0")
    numel = math.prod(shape)
    if numel > max_numel:
        raise FrameError("numel", f"shape {shape} has {numel} elements, limit {max_numel}")
    return shape, numel


def _check_sender(src: int, authenticated_as: str) -> None:
    if authenticated_as != user_id(src):
        raise FrameError("spoofed", f"header says src {src}, the connection is authenticated "
                                    f"as {authenticated_as[:MAX_KIND_CHARS]!r}")


def _check_schema(header: dict, schema: WireSchema) -> Wire:
    """What the schema names for (src, kind); kind first, then dtype, then shape."""
    wire = schema.wire_of(header["src"], header["kind"], header["round"])
    if wire is None:
        raise FrameError("kind", f"worker {header['src']} sends no {header['kind']!r} messages "
                                 f"to worker {schema.rank}")
    if header["dtype"] != wire.dtype or wire.dtype not in _DTYPES:
        raise FrameError("dtype", f"dtype {header['dtype']!r}, expected {wire.dtype!r}")
    shape = header["shape"]
    if (not isinstance(shape, list) or not all(_is_int(d) for d in shape)
            or tuple(shape) != wire.shape):
        raise FrameError("shape", f"shape {shape!r} of {header['kind']!r}, expected "
                                  f"{list(wire.shape)}")
    return wire


def _check_codec(schema: WireSchema, frame: torch.Tensor, values: int) -> None:
    """A compressed frame's content (a sparse codec's indices) as its codec allows."""
    why = schema.codec.check(frame, values)
    if why:
        raise FrameError("codec", f"{schema.codec.name} frame for {values} values: {why}")


def _check_nbytes(header: dict, expected: int, payload_bytes: int) -> None:
    nbytes = header["nbytes"]
    if not _is_int(nbytes) or nbytes != expected or payload_bytes != expected:
        raise FrameError("nbytes", f"header nbytes {nbytes!r}, payload {payload_bytes} bytes, "
                                   f"shape and dtype need {expected}")


def _view_tensor(payload: memoryview, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The payload as a 1-D tensor, sharing memory with the frame where that is safe."""
    if numel == 0:
        return torch.empty(0, dtype=dtype)  # frombuffer refuses empty buffers
    if payload.readonly:
        # only test inputs (bytes) get here; a zmq Frame is writable. Copy rather than hand out
        # a tensor over memory that must not be written.
        payload = memoryview(bytearray(payload))
    raw = torch.frombuffer(payload, dtype=torch.uint8)  # keeps payload, hence the frame, alive
    if raw.data_ptr() % dtype.itemsize:
        raw = raw.clone()  # misaligned (tiny in-struct zmq messages): a fresh aligned copy
    return raw.view(dtype)
