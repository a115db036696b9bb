"""The codecs alone: exact frame sizes, bounded error for the quantisers, what the sparse codecs
keep, error feedback that loses nothing over rounds, and untrusted frames refused."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu.comm.codecs import (
    CODECS,
    RandK,
    TopK,
    make_codec,
    max_error,
    ratio_of,
    top_indices,
)
from gasloc_emu.comm.reduce import encode_with

LOSSY = [c for c in CODECS if c != "none"]


def vec(n: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("name", LOSSY)
@pytest.mark.parametrize("numel", [1, 7, 256, 257, 1000])
def test_a_frame_has_exactly_the_bytes_the_codec_names(name, numel):
    codec = make_codec(name, ratio=0.1, block_size=64)
    frame = codec.encode(vec(numel), salt=5)
    assert frame.dtype == torch.uint8 and frame.shape == (codec.nbytes(numel),)
    assert codec.check(frame, numel) is None
    out = codec.decode(frame, numel)
    assert out.dtype == torch.float32 and out.shape == (numel,)


def test_the_bytes_each_codec_puts_on_the_wire():
    numel = 482_304  # the tiny GPT's size class
    got = {name: ratio_of(make_codec(name, 0.01, 256), numel) for name in LOSSY}
    assert got["bf16"] == 0.5
    assert got["int8"] == pytest.approx(0.25 + 1 / 256)      # a float32 scale per 256 values
    assert got["int4"] == pytest.approx(0.125 + 1 / 256)
    assert got["topk"] == pytest.approx(0.02, rel=1e-4)       # index and value, 1 % of them
    assert got["randk"] == pytest.approx(0.01, abs=1e-4)      # values only: the salt picks
    assert ratio_of(None, numel) == 1.0


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["bf16", "int8", "int4"]), numel=st.integers(1, 700),
       block=st.sampled_from([8, 32, 256]), seed=st.integers(0, 10_000),
       scale=st.sampled_from([1e-6, 1.0, 1e4]))
def test_a_quantiser_stays_within_its_bound(name, numel, block, seed, scale):
    codec = make_codec(name, block_size=block)
    x = vec(numel, seed, scale)
    err = (codec.decode(codec.encode(x), numel) - x).abs().max().item()
    assert err <= max_error(codec, x)


def test_zero_blocks_stay_zero_and_bf16_values_travel_exactly():
    x = torch.zeros(300)
    x[290:] = vec(10)
    for name in ("int8", "int4"):
        codec = make_codec(name, block_size=32)
        out = codec.decode(codec.encode(x), 300)
        assert torch.equal(out[:288], torch.zeros(288))
    exact = vec(100).to(torch.bfloat16).float()
    bf16 = make_codec("bf16")
    assert torch.equal(bf16.decode(bf16.encode(exact), 100), exact)


def test_topk_keeps_the_largest_magnitudes_exactly():
    x = vec(1000, seed=3)
    codec = TopK(0.05)
    out = codec.decode(codec.encode(x), 1000)
    kept = out.nonzero().squeeze(1)
    assert kept.numel() == 50
    assert torch.equal(out[kept], x[kept])
    assert x.abs()[kept].min() >= x.abs()[out == 0].max()


def test_randk_indices_come_from_the_salt_alone():
    x, codec = vec(1000, seed=4), RandK(0.02)
    a, b, c = codec.encode(x, salt=11), codec.encode(x, salt=11), codec.encode(x, salt=12)
    assert torch.equal(a, b) and not torch.equal(a, c)
    out = codec.decode(a, 1000)
    kept = out.nonzero().squeeze(1)
    assert torch.equal(kept, codec.indices(11, 1000)) and torch.equal(out[kept], x[kept])


@pytest.mark.parametrize("name", LOSSY)
def test_error_feedback_loses_nothing_over_many_rounds(name):
    """What 60 messages delivered plus the last residual is exactly what was to be sent."""
    codec = make_codec(name, ratio=0.05, block_size=32)
    residual, sent, delivered = torch.zeros(500), torch.zeros(500), torch.zeros(500)
    for t in range(60):
        x = vec(500, seed=t)
        _, decoded = encode_with(codec, x, residual, salt=t)
        sent += x
        delivered += decoded
    assert torch.allclose(delivered + residual, sent, atol=1e-4)
    if codec.summable:  # a quantiser's residual stays within one step: it does not pile up
        assert residual.abs().max() < 0.5


def test_a_frame_with_impossible_indices_is_refused():
    codec, numel = TopK(0.01), 1000
    frame = codec.encode(vec(numel))
    bad = frame.clone()
    bad[:40].view(torch.int32)[-1] = numel
    assert "outside" in codec.check(bad, numel)
    bad = frame.clone()
    bad[:40].view(torch.int32)[:2] = bad[:40].view(torch.int32)[:2].flip(0).clone()
    assert "increasing" in codec.check(bad, numel)
    bad[:40].view(torch.int32)[0] = -1
    assert codec.check(bad, numel)


def test_settings_are_checked_where_the_codec_is_made():
    assert make_codec("none") is None
    with pytest.raises(ValueError, match="'zstd' is unknown"):
        make_codec("zstd")
    with pytest.raises(ValueError, match="block_size = 4 is out of range"):
        make_codec("int8", block_size=4)
    with pytest.raises(ValueError, match=r"ratio = 0 is out of range; expected a number in \(0"):
        make_codec("topk", ratio=0)


@pytest.mark.parametrize("k", [1_000, 60_000])
def test_topk_through_a_sampled_threshold_picks_what_a_full_topk_picks(k):
    magnitude = vec(5_000_000, seed=k).abs()  # large enough for the threshold path
    fast = top_indices(magnitude, k)
    full = torch.topk(magnitude, k, sorted=False).indices.sort().values
    assert bool((fast == full).all())
