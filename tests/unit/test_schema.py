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
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator import simulate as sim
from gasloc_emu.simulator.memory import InMemoryTransport
from gasloc_emu.training.data import build_corpus
from gasloc_emu.training.model import count_parameters
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
    sim.simulate(build_plan(cfg, corpus=corpora(workers)), tmp_path / "run", device="cpu")
    numel = count_parameters(cfg.model)
    schemas = [WireSchema(r, workers, numel) for r in range(workers)]
    assert sent, "the algorithm sent nothing"
    for src, dst, kind, dtype, shape in sent:
        assert dtype == torch.float32, (src, dst, kind)
        assert schemas[dst].shape_of(src, kind) == shape, (src, dst, kind, shape)


# -- churn: the ring re-formed over the living (``members``), and the ``join`` kind

NUMEL = 1002  # into 4 chunks: 251, 251, 250, 250; into 5: 201, 201, 200, 200, 200
RING5 = [f"{phase}{s}" for phase in ("rs", "ag") for s in range(4)]  # every ring kind of 5


def _living(t: int) -> set[int]:
    """5 workers; worker 2 is gone from round 3 on."""
    return {0, 1, 2, 3, 4} if t < 3 else {0, 1, 3, 4}


def test_with_members_ring_chunks_follow_the_living_ring():
    schema = WireSchema(3, 5, NUMEL, members=_living)
    # round 3: the ring 0, 1, 3, 4; receiver 3 sits at position 2, its sender is 1 (position 1),
    # which sends chunks 1, 0, 3 at reduce-scatter and 2, 1, 0 at all-gather, of a split into 4
    assert [schema.shape_of(1, f"rs{s}", 3) for s in range(3)] == [(251,), (251,), (250,)]
    assert [schema.shape_of(1, f"ag{s}", 3) for s in range(3)] == [(250,), (251,), (251,)]
    assert schema.shape_of(1, "rs3", 3) is None and schema.shape_of(1, "ag3", 3) is None
    for src in (0, 2, 3, 4):   # 2 is gone; 0 and 4 are not before 3 on the ring
        assert all(schema.shape_of(src, kind, 3) is None for kind in RING5), src
    # round 2: everyone, the ring of 5 as without members: sender 2, chunks of a split into 5
    assert [schema.shape_of(2, f"rs{s}", 2) for s in range(4)] == [(200,), (201,), (201,), (200,)]
    assert [schema.shape_of(2, f"ag{s}", 2) for s in range(4)] == [(200,), (200,), (201,), (201,)]
    assert all(schema.shape_of(1, kind, 2) is None for kind in RING5)


@pytest.mark.parametrize("round_idx", [3, 4, 99])
def test_a_worker_that_is_not_a_member_receives_no_ring_messages(round_idx):
    schema = WireSchema(2, 5, NUMEL, members=_living)
    assert all(schema.shape_of(src, kind, round_idx) is None
               for src in range(5) for kind in RING5)
    assert schema.shape_of(1, "rs0", 2) == (201,)   # while it was a member, it did


@pytest.mark.parametrize(("living", "steps"), [({1, 4}, 1), ({4}, 0)])
def test_small_living_rings_have_fewer_steps(living, steps):
    """Two alive: one step of each phase, halves of the model; alone: no ring messages."""
    schema = WireSchema(4, 6, NUMEL, members=lambda t: living)
    got = {(src, kind): schema.shape_of(src, kind, 0) for src in range(6)
           for kind in (f"{p}{s}" for p in ("rs", "ag") for s in range(5))}
    want = {(1, "rs0"): (501,), (1, "ag0"): (501,)} if steps else {}
    assert {k: v for k, v in got.items() if v is not None} == want


@pytest.mark.parametrize("round_idx", [-1, 1.0, "0", None])
def test_with_members_a_bad_round_index_has_no_ring_shape(round_idx):
    schema = WireSchema(3, 5, NUMEL, members=_living)
    assert schema.shape_of(2, "rs0", round_idx) is None


@pytest.mark.parametrize("world", [2, 4, 5, 7])
def test_without_members_shapes_are_as_before_and_as_with_everyone_alive(world):
    """members=None: the full ring, whatever the round; the same shapes as members that are
    every worker in every round."""
    kinds = ["z", "join", "x"] + [f"{p}{s}" for p in ("rs", "ag") for s in range(world)]
    for rank in range(world):
        plain = WireSchema(rank, world, NUMEL)
        everyone = WireSchema(rank, world, NUMEL, members=lambda t, w=world: range(w))
        assert plain.members is None
        for src in range(world):
            for kind in kinds:
                want = plain.shape_of(src, kind)
                for t in (0, 5):
                    assert plain.shape_of(src, kind, t) == want, (rank, src, kind)
                    assert everyone.shape_of(src, kind, t) == want, (rank, src, kind)
                if kind[:2] in ("rs", "ag"):
                    step = int(kind[2:])
                    ok = src == (rank - 1) % world and step < world - 1
                    assert (want is not None) == ok, (rank, src, kind)


@pytest.mark.parametrize("members", [None, _living])
def test_join_comes_from_any_sender_with_the_models_shape(members):
    for rank in range(5):   # 2 is not a member from round 3: it receives the model to rejoin
        schema = WireSchema(rank, 5, NUMEL, members=members)
        assert all(schema.shape_of(src, "join", t) == (NUMEL,)
                   for src in range(5) for t in (0, 3, 6))
        assert schema.max_numel() == NUMEL


def test_join_cannot_be_an_extra_kind():
    with pytest.raises(ValueError, match=r"extra kind 'join' must be a non-empty str that is not "
                                         r"an algorithm's kind \(z, join, rs<s>, ag<s>\)"):
        WireSchema(0, 2, 10, {"join": (10,)})
    assert WireSchema(0, 2, 10, {"joined": (1,)}).shape_of(1, "joined") == (1,)


@pytest.mark.parametrize(("world", "members"), [(5, [0, 1, 3, 4]), (6, [1, 2, 5]), (4, [0, 3]),
                                                (5, [3])])
def test_the_ring_over_members_sends_exactly_what_the_schema_allows(monkeypatch, world,
                                                                    members):
    """base.ring_all_reduce_sum over ``members`` at round 3 (every worker alive in other rounds):
    every message fits its receiver's schema, and every ring message a schema allows is sent."""
    import threading

    from gasloc_emu.simulator.memory import Hub

    sent: list[tuple] = []
    real_send = InMemoryTransport._send

    def recording_send(self, peer, round_idx, kind, tensor):
        sent.append((self.rank, peer, round_idx, kind, tuple(tensor.shape)))
        real_send(self, peer, round_idx, kind, tensor)

    monkeypatch.setattr(InMemoryTransport, "_send", recording_send)
    hub = Hub(world, timeout_s=20.0)

    def body(rank: int) -> None:
        tp = hub.transport(rank)
        try:
            with hub.cond:
                if rank in members:
                    tp.all_reduce_mean(3, torch.ones(NUMEL), members)
                tp.finish()
        except BaseException as exc:  # noqa: BLE001 - stop the other threads too
            hub.abort(exc)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30.0)
    if hub.error is not None:
        raise hub.error
    alive = lambda t: members if t == 3 else range(world)  # noqa: E731
    schemas = [WireSchema(r, world, NUMEL, members=alive) for r in range(world)]
    for src, dst, round_idx, kind, shape in sent:
        assert round_idx == 3 and schemas[dst].shape_of(src, kind, 3) == shape, \
            (src, dst, kind, shape)
    kinds = [f"{p}{s}" for p in ("rs", "ag") for s in range(world)]
    allowed = {(src, dst, kind) for dst in range(world) for src in range(world)
               for kind in kinds if schemas[dst].shape_of(src, kind, 3) is not None}
    assert {(src, dst, kind) for src, dst, _, kind, _ in sent} == allowed
    assert len(sent) == len(allowed) == (2 * len(members) * (len(members) - 1))
