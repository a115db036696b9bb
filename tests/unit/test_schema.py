"""The wire schema: exact shapes per (sender, kind), and that the real algorithms stay inside it.

The last tests run gasloc, diloco, dsgd and local-gossip through ``simulate`` with a recording
in-memory transport and check every message they send against the receiver's schema, so the
schema cannot drift from what the algorithms send.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu import config as C
from gasloc_emu import simulate as sim
from gasloc_emu.data import build_corpus
from gasloc_emu.model import count_parameters
from gasloc_emu.transport.memory import InMemoryTransport
from gasloc_emu.transport.schema import WireSchema, chunk_sizes, ring_chunk


@settings(deadline=None, max_examples=200)
@given(numel=st.integers(1, 10_000), parts=st.integers(1, 64))
def test_chunk_sizes_are_those_of_tensor_split(numel, parts):
    want = [len(c) for c in torch.tensor_split(torch.empty(numel), parts)]
    assert chunk_sizes(numel, parts) == want


def test_gossip_messages_are_the_whole_model_from_anyone():
    schema = WireSchema(2, 5, 1000)
    assert all(schema.shape_of(src, "z") == (1000,) for src in range(5))


def test_ring_chunks_come_only_from_the_previous_worker_with_its_chunk_size():
    n, numel = 4, 1003  # chunks 251, 251, 251, 250
    schema = WireSchema(0, n, numel)
    assert schema.shape_of(3, "rs0") == (250,)   # worker 3 sends chunk 3 first
    assert schema.shape_of(3, "rs1") == (251,)   # then chunk 2
    assert schema.shape_of(3, "ag0") == (251,)   # all-gather starts at chunk (3 + 1) % 4 = 0
    assert schema.shape_of(3, "ag1") == (250,)   # then chunk 3
    assert schema.shape_of(1, "rs0") is None     # not the previous worker on the ring
    assert schema.shape_of(3, "rs3") is None     # steps run 0..n-2
    assert schema.shape_of(3, "ag-1") is None


@pytest.mark.parametrize("kind", ["", "Z", "z ", "rs", "rs00", "rs0 ", "x", "ag01", "m1"])
def test_anything_else_is_not_a_kind(kind):
    assert WireSchema(0, 4, 100).shape_of(3, kind) is None


def test_ring_chunk_indices_follow_base():
    assert [ring_chunk("rs", s, 2, 4) for s in range(3)] == [2, 1, 0]
    assert [ring_chunk("ag", s, 2, 4) for s in range(3)] == [3, 2, 1]


def test_extra_kinds_have_one_shape_each():
    schema = WireSchema(0, 2, 10, {"warmup": (1,), "grid": (2, 3)})
    assert schema.shape_of(1, "warmup") == (1,) and schema.shape_of(1, "grid") == (2, 3)
    assert schema.max_numel() == 10


@pytest.mark.parametrize(("extra", "match"), [
    ({"z": (1,)}, "extra kind 'z'"),
    ({"rs0": (1,)}, "extra kind 'rs0'"),
    ({"ag12": (1,)}, "extra kind 'ag12'"),
    ({"": (1,)}, "extra kind ''"),
    ({"a": [1]}, r"shape of extra kind 'a' must be a tuple of ints >= 0, got \[1\]"),
    ({"a": (-1,)}, r"got \(-1,\)"),
    ({f"k{i}": (1,) for i in range(65)}, "at most 64 kinds"),
])
def test_bad_extra_kinds_are_refused(extra, match):
    with pytest.raises(ValueError, match=match):
        WireSchema(0, 2, 10, extra)


@pytest.mark.parametrize(("args", "match"), [
    ((2, 2, 10), r"rank 2 outside \[0, 2\)"),
    ((0, 0, 10), "world_size must be an int >= 1, got 0"),
    ((0, 2, 0), "model_numel must be an int >= 1, got 0"),
])
def test_bad_configuration_is_refused_naming_the_value(args, match):
    with pytest.raises(ValueError, match=match):
        WireSchema(*args)


# -- the real algorithms send nothing outside the schema

ARMS = {
    "gasloc-matching": {"algo.name": "gasloc", "topology.name": "matching"},
    "gasloc-complete": {"algo.name": "gasloc", "topology.name": "complete"},
    "diloco": {"algo.name": "diloco"},
    "dsgd": {"algo.name": "dsgd", "topology.name": "ring", "algo.local_steps": 1},
    "local-gossip": {"algo.name": "local-gossip", "topology.name": "ring"},
}


@pytest.fixture(scope="module")
def corpora():
    """One corpus per world size (its shards depend on it), built once for the module."""
    built: dict[int, object] = {}
    return lambda workers: built.setdefault(workers, build_corpus(_cfg(workers, {})))


def _cfg(workers: int, arm: dict) -> C.Config:
    return C.resolve(overrides={"model.preset": "tiny", "workers": workers, "seed": 1,
                                "run.rounds": 2, "algo.local_steps": 1, "run.dashboard": "off",
                                "data.eval_batches": 1, "data.max_corpus_mb": 0.5} | arm)


# every arm on 4 workers; the ring also on 5 (tiny's 120576 parameters: unequal chunks)
CASES = [(arm, 4) for arm in ARMS] + [("diloco", 5), ("dsgd", 3), ("gasloc-complete", 3)]


@pytest.mark.parametrize(("arm", "workers"), CASES)
def test_every_message_the_algorithms_send_fits_the_receivers_schema(tmp_path, monkeypatch,
                                                                     corpora, arm, workers):
    cfg = _cfg(workers, ARMS[arm])
    sent: list[tuple] = []
    real_send = InMemoryTransport._send

    def recording_send(self, peer, round_idx, kind, tensor):
        sent.append((self.rank, peer, kind, tensor.dtype, tuple(tensor.shape)))
        real_send(self, peer, round_idx, kind, tensor)

    monkeypatch.setattr(InMemoryTransport, "_send", recording_send)
    sim.simulate(cfg, tmp_path / "run", corpus=corpora(workers), device="cpu")
    numel = count_parameters(cfg.model)
    schemas = [WireSchema(r, workers, numel) for r in range(workers)]
    assert sent, "the algorithm sent nothing"
    for src, dst, kind, dtype, shape in sent:
        assert dtype == torch.float32, (src, dst, kind)
        assert schemas[dst].shape_of(src, kind) == shape, (src, dst, kind, shape)
