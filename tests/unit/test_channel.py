"""Compressed communication between workers, in memory: CHOCO-style gossip keeps the average
and its copies in step, the compressed ring gives every worker the same bits and loses nothing
to its residuals, and the wire schema and framing take exactly the codec's frames."""
from __future__ import annotations

import msgpack
import pytest
import torch
from hub_threads import on_threads

from gasloc_emu.comm.channel import Channel
from gasloc_emu.comm.codecs import make_codec
from gasloc_emu.transport import framing
from gasloc_emu.transport.schema import Wire, WireSchema

N, DIM = 4, 301
RING = {r: [(r - 1) % N, (r + 1) % N] for r in range(N)}  # W: 1/3 to self and each neighbour


def vec(seed: int, dim: int = DIM) -> torch.Tensor:
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed))


def gossip_rounds(codec_name: str, zs: list[torch.Tensor], rounds: int, step: float = 1.0):
    """Every worker sends its fixed z to its ring neighbours ``rounds`` times and mixes."""
    codec, start = make_codec(codec_name, ratio=0.1, block_size=32), vec(99)

    def body(rank: int, tp):
        ch, out = Channel(codec, start, step), torch.empty(DIM)
        for t in range(rounds):
            for j in RING[rank]:
                ch.send(tp, j, t, "z", zs[rank])
            ch.mix(tp, RING[rank], {j: 1 / 3 for j in RING[rank]}, t, "z", zs[rank], out)
        return out, ch
    return on_threads(N, body)


@pytest.mark.parametrize("codec", ["int8", "int4", "topk", "randk", "bf16"])
def test_compressed_gossip_keeps_the_average(codec):
    zs = [vec(r) for r in range(N)]
    got = gossip_rounds(codec, zs, rounds=1)
    mean_in = torch.stack(zs).mean(0)
    mean_out = torch.stack([got[r][0] for r in range(N)]).mean(0)
    assert torch.allclose(mean_out, mean_in, atol=1e-5)


def test_the_copies_reach_what_was_sent_and_the_mix_becomes_exact_gossip():
    """topk at 10 % of what is left: after eleven messages every value of z has gone, so the
    copies equal z on both ends and the mix is sum_j W[i, j] z_j."""
    zs = [vec(r) for r in range(N)]
    got = gossip_rounds("topk", zs, rounds=11)  # 30 of 301 values a message
    for r in range(N):
        out, ch = got[r]
        for j in RING[r]:
            assert torch.allclose(ch.sent[j], zs[r], atol=1e-6)  # start + (z - start)
        want = (zs[r] + zs[RING[r][0]] + zs[RING[r][1]]) / 3
        assert torch.allclose(out, want, atol=1e-6)


def test_both_ends_of_an_edge_keep_the_same_copy():
    zs = [vec(r) for r in range(N)]
    got = gossip_rounds("int4", zs, rounds=3)
    for r in range(N):
        for j in RING[r]:
            assert torch.equal(got[r][1].sent[j], got[j][1].received[r])


def ring_mean(codec_name: str, inputs: list[torch.Tensor], rounds: int = 1):
    codec = make_codec(codec_name, ratio=0.05, block_size=16)

    def body(rank: int, tp):
        ch = Channel(codec, torch.zeros(DIM))
        means = [tp.all_reduce_mean(t, inputs[rank].clone(), None, ch.ring_sum)
                 for t in range(rounds)]
        return means, ch.residual
    return on_threads(N, body)


@pytest.mark.parametrize("codec", ["int8", "int4", "bf16", "topk", "randk"])
def test_the_compressed_ring_gives_every_worker_the_same_bits(codec):
    inputs = [vec(10 + r) for r in range(N)]
    got = ring_mean(codec, inputs)
    first = got[0][0][0]
    assert all(torch.equal(got[r][0][0], first) for r in range(N))
    # error feedback: the decoded sum and every worker's residual add up to the true sum
    residuals = torch.stack([got[r][1] for r in range(N)]).sum(0)
    assert torch.allclose(first * N + residuals, torch.stack(inputs).sum(0), atol=1e-4)


def test_the_int8_ring_is_close_to_the_exact_mean_and_feedback_catches_up():
    inputs = [vec(20 + r) for r in range(N)]
    exact = torch.stack(inputs).mean(0)
    got = ring_mean("int8", inputs, rounds=8)
    means = got[0][0]
    assert (means[0] - exact).abs().max() < 0.05
    # the mean over rounds of a repeated input converges: residuals are paid back
    assert (torch.stack(means).mean(0) - exact).abs().max() < 0.01


def test_a_ring_of_one_sends_nothing_and_returns_the_input():
    x = vec(5)
    got = on_threads(1, lambda rank, tp: Channel(make_codec("int8"), x).ring_sum(tp, 0, x, None))
    assert torch.equal(got[0], x)


# -- on the wire

def schema(codec_name: str, rank: int = 1) -> WireSchema:
    return WireSchema(rank, N, 1000, codec=make_codec(codec_name, 0.01, 256), compressed=("z",))


def test_the_schema_names_each_compressed_frame_exactly():
    s = schema("int8")
    assert s.wire_of(0, "z") == Wire("uint8", (4 * 4 + 1000,), 1000)
    assert s.wire_of(0, "join") == Wire("float32", (1000,))      # never compressed
    chunk = s.shape_of(0, "rs0")[0]
    assert s.wire_of(0, "rs0") == Wire("uint8", (4 + chunk,), chunk)
    assert s.wire_of(2, "rs0") is None                           # not the ring's predecessor
    sparse = schema("topk")
    assert sparse.wire_of(0, "rs0") is None                      # gathered: no reduce-scatter
    assert sparse.wire_of(0, "ag1") == Wire("uint8", (80,), 1000)
    assert WireSchema(1, N, 1000).wire_of(0, "z") == Wire("float32", (1000,))


def frames(kind: str, tensor: torch.Tensor) -> list[bytes]:
    header, payload = framing.encode(0, 0, kind, tensor)
    return [header, bytes(payload)]


def decode(s: WireSchema, msg: list[bytes]):
    return framing.decode(msg, world_size=N, self_rank=1, dtype=torch.float32,
                          max_numel=s.max_numel(), round_window=(0, 5), schema=s)


def test_framing_takes_a_codec_frame_and_drops_every_other_shape_or_content():
    s, codec = schema("topk"), make_codec("topk", 0.01)
    good = codec.encode(vec(1, 1000))
    assert torch.equal(decode(s, frames("z", good)).tensor, good)
    for bad, reason in ((good[:-4].clone(), "shape"), (vec(2, 1000), "dtype"),
                        (torch.zeros(80, dtype=torch.uint8), "codec")):
        with pytest.raises(framing.FrameError) as info:
            decode(s, frames("z", bad))
        assert info.value.reason == reason
    header = msgpack.unpackb(frames("z", good)[0])
    assert header["dtype"] == "uint8" and header["nbytes"] == 80
