"""The wire format: round trips, zero-copy receive, and hostile input that must only raise
FrameError."""
from __future__ import annotations

import gc
import math

import msgpack
import pytest
import torch
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gasloc_emu.transport import framing
from gasloc_emu.transport.framing import FrameError, Message, decode, encode
from gasloc_emu.transport.mailbox import Mailbox, PeerBounds
from gasloc_emu.transport.schema import WireSchema
from netem.userspace import shaping_from_spec

WORLD, SELF, WINDOW, MAX_NUMEL = 4, 0, (4, 9), 1 << 20
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.uint8, torch.bool]
FUZZ = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


def _decode(frames, dtype=torch.float32, **overrides):
    kw = dict(world_size=WORLD, self_rank=SELF, dtype=dtype, max_numel=MAX_NUMEL,
              round_window=WINDOW) | overrides
    return decode(frames, **kw)


def _valid_header(**changes) -> dict:
    header = {"v": framing.VERSION, "src": 1, "round": 5, "kind": "z", "dtype": "float32",
              "shape": [2, 3], "nbytes": 24}
    return header | changes


def _frames(header: dict, payload: bytes = bytes(24)) -> list:
    return [msgpack.packb(header), payload]


def _reason(frames, **kw) -> str:
    with pytest.raises(FrameError) as info:
        _decode(frames, **kw)
    return info.value.reason


def _random_tensor(dtype: torch.dtype, shape: list[int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 256, (math.prod(shape) * dtype.itemsize,), dtype=torch.uint8,
                         generator=gen)
    if dtype == torch.bool:
        bits = bits % 2  # only 0 and 1 are valid bools
    return bits.view(dtype).reshape(shape)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # NaN payloads compare unequal as floats; the wire must preserve the bits
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


# -- round trips

@FUZZ
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 5), max_size=4),
       src=st.integers(1, WORLD - 1), rnd=st.integers(*WINDOW),
       kind=st.text(min_size=1, max_size=framing.MAX_KIND_CHARS),
       deliver_at=st.none() | st.floats(0, 1e10), seed=st.integers(0, 2**31))
def test_round_trip_preserves_every_field_and_bit(dtype, shape, src, rnd, kind, deliver_at, seed):
    tensor = _random_tensor(dtype, shape, seed)
    header, payload = encode(src, rnd, kind, tensor, deliver_at)
    msg = _decode([header, bytes(payload)], dtype=dtype)
    assert (msg.src, msg.round, msg.kind, msg.deliver_at) == (src, rnd, kind, deliver_at)
    assert _same_bits(msg.tensor, tensor)


def test_encode_payload_is_a_view_not_a_copy():
    tensor = torch.arange(10, dtype=torch.float32)
    _, payload = encode(1, 0, "z", tensor)
    tensor[0] = 42.0  # visible through the view: nothing was copied
    assert torch.frombuffer(bytearray(payload), dtype=torch.float32)[0] == 42.0


def test_decoded_tensor_views_the_zmq_frame_and_keeps_it_alive():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://framing-test")
        b.connect("inproc://framing-test")
        sent = torch.arange(1 << 16, dtype=torch.float32)  # 256 KiB: above pyzmq's copy threshold
        a.send_multipart(encode(1, 5, "z", sent), copy=False)
        frames = b.recv_multipart(copy=False)
        msg = _decode(frames)
        frame_addr = torch.frombuffer(frames[1].buffer, dtype=torch.uint8).data_ptr()
        assert msg.tensor.data_ptr() == frame_addr  # zero copy
        del frames
        gc.collect()
        a.send_multipart(encode(1, 5, "z", torch.zeros(1 << 16)), copy=False)
        b.recv_multipart(copy=False)  # reuses freed memory if the first frame had been freed
        assert torch.equal(msg.tensor, sent)
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def test_empty_and_scalar_tensors_round_trip():
    for tensor in (torch.empty(0, 3), torch.tensor(3.5)):
        header, payload = encode(1, 5, "z", tensor)
        assert _same_bits(_decode([header, bytes(payload)]).tensor, tensor)


def test_read_only_buffers_are_copied_into_a_writable_tensor():
    header, payload = encode(1, 5, "z", torch.ones(4))
    msg = _decode([header, bytes(payload)])
    msg.tensor.add_(1)  # writable, and writing does not touch the caller's bytes
    assert torch.equal(msg.tensor, torch.full((4,), 2.0))


def test_encode_rejects_what_cannot_go_on_the_wire():
    with pytest.raises(ValueError, match="contiguous"):
        encode(1, 0, "z", torch.ones(4, 4).t())
    with pytest.raises(ValueError, match="kind"):
        encode(1, 0, "", torch.ones(1))
    with pytest.raises(ValueError, match="round"):
        encode(1, "0", "z", torch.ones(1))


# -- hostile input: every malformed message is a FrameError with a reason

@FUZZ
@given(frames=st.lists(st.binary(max_size=64), max_size=4))
def test_garbage_frames_raise_frame_error(frames):
    with pytest.raises(FrameError):
        _decode(frames)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                  max_size=4),
    max_leaves=12)


@FUZZ
@given(header=msgpack_values.filter(lambda v: not isinstance(v, dict)))
def test_non_map_headers_raise_frame_error(header):
    assert _reason(_frames(header)) == "header"


@FUZZ
@given(key=st.sampled_from(sorted(_valid_header()) + ["deliver_at", "extra"]),
       value=msgpack_values, payload=st.binary(max_size=48))
def test_any_corrupted_field_is_rejected_or_still_consistent(key, value, payload):
    """Whatever one field holds, decode returns a consistent Message or raises FrameError."""
    try:
        msg = _decode(_frames(_valid_header(**{key: value}), payload))
    except FrameError:
        return
    assert isinstance(msg, Message)
    assert msg.tensor.numel() * 4 == len(payload) and 1 <= msg.src < WORLD


@FUZZ
@given(header=st.binary(max_size=200), payload=st.binary(max_size=64))
def test_random_header_bytes_raise_frame_error(header, payload):
    with pytest.raises(FrameError):
        _decode([header, payload])


@pytest.mark.parametrize("frames", [[], [b"x"], [b"a", b"b", b"c"], b"ab", None, "ab"])
def test_wrong_frame_count_or_type(frames):
    assert _reason(frames) == "frames"


def test_frame_that_is_not_bytes():
    assert _reason([msgpack.packb(_valid_header()), 12]) == "frames"


@pytest.mark.parametrize("src", [WORLD, -1, SELF, 99, "1", True, 1.0, None])
def test_unknown_sender(src):
    assert _reason(_frames(_valid_header(src=src))) == "src"


@pytest.mark.parametrize("rnd", [WINDOW[0] - 1, WINDOW[1] + 1, -5, 2**64 - 1, "5", 5.0, False])
def test_round_outside_window(rnd):
    assert _reason(_frames(_valid_header(round=rnd))) == "round"


@pytest.mark.parametrize("dtype", ["float64", "torch.float32", "", 4, None])
def test_dtype_mismatch(dtype):
    assert _reason(_frames(_valid_header(dtype=dtype))) == "dtype"


@pytest.mark.parametrize("shape", [[-1, 3], [2, "3"], [2.0, 3], "23", 6, [True, 6], None])
def test_malformed_shape(shape):
    assert _reason(_frames(_valid_header(shape=shape))) == "shape"


@pytest.mark.parametrize("shape", [[MAX_NUMEL + 1], [2**40, 2**40], [2**64 - 1], [2**32] * 16])
def test_huge_shape_is_refused_before_any_allocation(shape):
    assert _reason(_frames(_valid_header(shape=shape, nbytes=24))) == "numel"


def test_too_many_dimensions():
    assert _reason(_frames(_valid_header(shape=[1] * (framing.MAX_DIMS + 1)))) == "shape"
    # long arrays are refused by the unpacker itself, before any list is built
    assert _reason(_frames(_valid_header(shape=[1] * 200))) == "header"


@pytest.mark.parametrize("header,payload", [
    (_valid_header(), bytes(23)),                         # truncated payload
    (_valid_header(), bytes(25)),                         # trailing bytes
    (_valid_header(nbytes=23), bytes(23)),                # nbytes disagrees with the shape
    (_valid_header(shape=[3, 3]), bytes(24)),             # shape disagrees with nbytes
    (_valid_header(nbytes="24"), bytes(24)),
    (_valid_header(shape=[0], nbytes=0), bytes(4)),
])
def test_wrong_sizes(header, payload):
    assert _reason(_frames(header, payload)) == "nbytes"


@pytest.mark.parametrize("version", [0, 2, "1", 1.0, None, True])
def test_unknown_version(version):
    assert _reason(_frames(_valid_header(v=version))) == "version"


@pytest.mark.parametrize("kind", ["", "k" * (framing.MAX_KIND_CHARS + 1), 3, b"z", ["z"]])
def test_bad_kind(kind):
    assert _reason(_frames(_valid_header(kind=kind))) == "kind"


@pytest.mark.parametrize("deliver_at", [float("nan"), float("inf"), "soon", [1.0], True])
def test_bad_deliver_at(deliver_at):
    assert _reason(_frames(_valid_header(deliver_at=deliver_at))) == "deliver_at"


@pytest.mark.parametrize("header", [
    {k: v for k, v in _valid_header().items() if k != "kind"},   # missing key
    _valid_header(extra=1),                                        # unknown key
    {**_valid_header(), 7: 1},                                     # non-str key
])
def test_missing_or_unknown_keys(header):
    frames = [msgpack.packb(header, strict_types=False), bytes(24)]
    assert _reason(frames) == "header"


def test_invalid_utf8_and_oversized_headers():
    bad_utf8 = msgpack.packb(_valid_header()).replace(b"\xa1z", b"\xa1\xff")
    assert _reason([bad_utf8, bytes(24)]) == "header"
    padded = _valid_header(kind="k" * framing.MAX_KIND_CHARS, dtype="x" * 2000)
    assert _reason(_frames(padded)) == "header"


def test_frame_error_names_the_bad_value():
    with pytest.raises(FrameError, match="sender 17"):
        _decode(_frames(_valid_header(src=17)))
    with pytest.raises(FrameError, match=r"round 42 outside the window \[4, 9\]"):
        _decode(_frames(_valid_header(round=42)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_control_plane_parameter_frames_round_trip(dtype):
    """Final parameters travel to the launcher as raw bytes, whatever the model's dtype."""
    from gasloc_emu.transport import control
    t = torch.randn(37).to(dtype)
    frame = control.tensor_frame(t)
    back = control.frame_tensor(bytes(frame), str(dtype).split(".")[-1], t.numel())
    assert back.dtype == dtype and torch.equal(back, t)
    with pytest.raises(ValueError, match="expected 36"):
        control.frame_tensor(bytes(frame), str(dtype).split(".")[-1], 36)


# -- the whole receive path: decode (exact schema, authenticated sender), then the mailbox

RX_WORLD, RX_SELF, RX_MODEL, RX_AHEAD = 3, 0, 6, 2
RX_SCHEMA = WireSchema(RX_SELF, RX_WORLD, RX_MODEL)
RX_BOUNDS = PeerBounds(max_msgs=4, max_bytes=3 * RX_MODEL * 4)
RX_SPEC = {"mode": "userspace", "workers": RX_WORLD, "up_mbit": {}, "max_queue_s": 0.5,
           "links": [[s, d, 10.0, 20.0] for s in range(RX_WORLD) for d in range(RX_WORLD)
                     if s != d]}

user_ids = (st.none() | st.sampled_from(["w0", "w1", "w2", "w3", "launcher", ""])
            | st.text(max_size=4))
stamps = st.floats(990.0, 1010.0) | st.sampled_from([1e9, -1.0, 1001])


FAULTS = ("none", "none", "none", "field", "fields", "payload", "user", "frames")


@st.composite
def rx_messages(draw) -> tuple[list, str | None]:
    """A message as a worker would send it, with at most one fault: one or two header fields
    replaced by anything, a random payload, another user id, or frames of random bytes."""
    fault = draw(st.sampled_from(FAULTS))
    if fault == "frames":
        return draw(st.lists(st.binary(max_size=40), max_size=3)), draw(user_ids)
    src, kind = draw(st.sampled_from([(1, "z"), (2, "z"), (2, "ag0"), (2, "rs1")]))
    shape = list(RX_SCHEMA.shape_of(src, kind))
    header = {"v": 1, "src": src, "round": draw(st.integers(-1, 3)), "kind": kind,
              "dtype": "float32", "shape": shape, "nbytes": 4 * math.prod(shape)}
    if draw(st.booleans()):
        header["deliver_at"] = draw(stamps)
    if fault in ("field", "fields"):
        header |= draw(st.dictionaries(st.sampled_from([*header, "deliver_at", "extra"]),
                                       msgpack_values, min_size=1,
                                       max_size=1 if fault == "field" else 2))
    payload = bytes(4 * math.prod(shape))
    if fault == "payload":
        payload = draw(st.binary(max_size=40))
    user = draw(user_ids) if fault == "user" else draw(st.sampled_from([f"w{src}", None]))
    return [msgpack.packb(header), payload], user


@FUZZ
@given(traffic=st.lists(st.tuples(rx_messages(), st.floats(0.0, 2.0)), max_size=40))
def test_random_frames_only_raise_frame_error_and_nothing_malformed_is_kept(traffic):
    clock = [1000.0]
    shaper = shaping_from_spec(RX_SPEC, RX_SELF)
    mb = Mailbox(RX_SELF, RX_WORLD, RX_AHEAD, RX_BOUNDS, shaper, lambda: clock[0])
    for (frames, user), dt in traffic:
        clock[0] += dt
        try:
            msg = decode(frames, world_size=RX_WORLD, self_rank=RX_SELF, dtype=torch.float32,
                         max_numel=RX_MODEL, round_window=mb.window(), schema=RX_SCHEMA,
                         authenticated_as=user)
        except FrameError:
            continue
        assert user is None or user == f"w{msg.src}"  # the sender is the authenticated peer
        assert msg.tensor.dtype == torch.float32
        assert tuple(msg.tensor.shape) == RX_SCHEMA.shape_of(msg.src, msg.kind)
        mb.accept(msg, clock[0])
        mb.note_round(msg.round)
        mb.release_due()
        for src in range(RX_WORLD):
            msgs, nbytes = mb.peer_usage(src)
            assert msgs <= RX_BOUNDS.max_msgs and nbytes <= RX_BOUNDS.max_bytes
        release = mb.next_release_s()
        assert release is None or release <= shaper.latest_release_s(1, 4 * RX_MODEL, clock[0])


# -- exact checks: the schema and the authenticated sender

def _strict(frames, **kw):
    return _decode(frames, schema=WireSchema(SELF, WORLD, 6), **kw)


def _strict_reason(frames, **kw) -> str:
    with pytest.raises(FrameError) as info:
        _strict(frames, **kw)
    return info.value.reason


def test_a_message_the_schema_names_is_decoded():
    msg = _strict(_frames(_valid_header(shape=[6])), authenticated_as="w1")
    assert msg.src == 1 and msg.tensor.shape == (6,)


@pytest.mark.parametrize(("changes", "payload", "reason"), [
    ({"kind": "x"}, bytes(24), "kind"),
    ({"kind": "rs0", "src": 1}, bytes(24), "kind"),       # worker 1 is not before 0 on a ring
    ({"kind": "rs0", "src": 3, "shape": [6]}, bytes(24), "shape"),  # chunks of 6 over 4: 2, 2, 1, 1
    ({"shape": [2, 3]}, bytes(24), "shape"),               # the right size, not the right shape
    ({"shape": [True] * 6, "nbytes": 24}, bytes(24), "shape"),
    ({"shape": [5], "nbytes": 20}, bytes(20), "shape"),
    ({"shape": [6], "dtype": "float64", "nbytes": 48}, bytes(48), "dtype"),
    ({"shape": [6], "nbytes": 20}, bytes(24), "nbytes"),
])
def test_anything_but_the_exact_shape_of_its_kind_is_refused(changes, payload, reason):
    assert _strict_reason(_frames(_valid_header(**changes), payload)) == reason


def test_the_ring_chunk_from_the_previous_worker_is_decoded():
    msg = _strict(_frames(_valid_header(kind="ag0", src=3, shape=[2], nbytes=8), bytes(8)))
    assert msg.tensor.shape == (2,)  # worker 3 starts the all-gather with chunk 0: 2 elements


@pytest.mark.parametrize("user", ["w2", "w0", "launcher", "", "w01", "W1"])
def test_a_header_naming_anyone_but_the_authenticated_peer_is_spoofed(user):
    frames = _frames(_valid_header(shape=[6]))
    assert _strict_reason(frames, authenticated_as=user) == "spoofed"
    assert _strict(frames).src == 1  # an unauthenticated plane cannot tell


# -- numbering

def test_a_message_keeps_its_number_and_a_bad_number_is_refused():
    assert _decode(_frames(_valid_header(seq=7))).seq == 7
    assert _decode(_frames(_valid_header())).seq is None
    for bad in (-1, 1.0, True, framing.MAX_SEQ, "3"):
        assert _reason(_frames(_valid_header(seq=bad))) == "seq"


@pytest.mark.parametrize(("header", "user", "numbered"), [
    (_valid_header(seq=4, round=99), None, (1, 4)),       # refused (round), but numbered
    (_valid_header(seq=4, shape=[9]), "w1", (1, 4)),      # its connection is worker 1's
    (_valid_header(seq=4, shape=[9]), "w2", None),        # spoofed: not counted for worker 1
    (_valid_header(seq=4, src=0, shape=[9]), None, None),  # from itself: no peer
    (_valid_header(seq=-4, shape=[9]), None, None),       # no valid number
])
def test_a_refused_message_says_whose_number_it_was(header, user, numbered):
    with pytest.raises(FrameError) as info:
        _decode(_frames(header), authenticated_as=user)
    assert info.value.numbered == numbered
