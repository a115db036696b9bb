"""The ring All-Reduce re-formed over the workers still there (``members``), in memory.

DiLoCo survives departures by running its ring over the living workers only: every member gets
the mean of the members' tensors, the same bits on every member, and the workers that left send
and receive nothing.
"""
from __future__ import annotations

import pytest
import torch
from hub_threads import on_threads

from gasloc_emu.simulator.memory import Hub
from gasloc_emu.transport.base import ring_all_reduce_sum

DIM = 29  # not a multiple of the ring sizes below: chunks of unequal length


def inputs(n: int, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(DIM, generator=g, dtype=torch.float64) for _ in range(n)]


def all_reduce(world: int, members, tensors: list[torch.Tensor]
               ) -> tuple[dict[int, torch.Tensor], dict[int, dict]]:
    """Run ``all_reduce_mean(members=members)`` on one thread per member of a ``world``-worker
    hub (the others finish at once, as departed workers); the result and counters per rank."""
    ranks = range(world) if members is None else members

    def body(rank: int, tp):
        mean = tp.all_reduce_mean(0, tensors[rank].clone(), members).clone() \
            if rank in ranks else None
        return mean, tp.counters()

    got = on_threads(world, body)
    return ({r: m for r, (m, _) in got.items() if m is not None},
            {r: c for r, (_, c) in got.items()})


@pytest.mark.parametrize("world,members", [(5, [0, 2, 3]), (5, [1, 4]), (6, [0, 1, 2, 3, 5]),
                                           (6, [5]), (4, [0, 1, 2, 3]), (7, [0, 3, 6])])
def test_ring_over_members_is_the_mean_of_the_members(world, members):
    tensors = inputs(world)
    out, counters = all_reduce(world, members, tensors)
    assert sorted(out) == members
    expected = torch.stack([tensors[r] for r in members]).mean(0)
    for r in members:
        assert torch.equal(out[r], out[members[0]]), f"member {r} got different bits"
        torch.testing.assert_close(out[r], expected, rtol=1e-12, atol=1e-12)
    for pos, r in enumerate(members):  # a member sends only to the next member on the ring
        nxt = members[(pos + 1) % len(members)]
        assert set(counters[r]["bytes_sent"]) == ({nxt} if len(members) > 1 else set())
    for r in set(range(world)) - set(members):  # the departed take no part
        assert not counters[r]["bytes_sent"] and not counters[r]["bytes_recv"]


@pytest.mark.parametrize("world,members", [(5, [0, 2, 3]), (6, [1, 2, 4, 5]), (7, [0, 3, 6])])
def test_ring_over_members_sums_as_a_ring_of_that_size(world, members):
    """The same bits as a full ring of len(members) workers with those inputs in rank order:
    chunks are summed in ring-position order, whichever ranks hold the positions."""
    tensors = inputs(world)
    got, _ = all_reduce(world, members, tensors)
    alone, _ = all_reduce(len(members), None, [tensors[r] for r in members])
    for pos, r in enumerate(members):
        assert torch.equal(got[r], alone[pos])


@pytest.mark.parametrize("world", [2, 3, 5])
def test_every_worker_as_members_is_todays_ring_bit_for_bit(world):
    tensors = inputs(world, seed=8)
    everyone, _ = all_reduce(world, list(range(world)), tensors)
    default, _ = all_reduce(world, None, tensors)
    for r in range(world):
        assert torch.equal(everyone[r], default[r])


@pytest.mark.parametrize("members,match", [
    ([0, 2], r"do not include this worker, rank 1"),
    ([2, 1], "strictly increasing"),
    ([1, 1, 2], "strictly increasing"),
    ([1, 5], r"ring member 5 outside \[0, 4\)"),
    ([-1, 1], r"ring member -1 outside \[0, 4\)"),
    ([1.0, 2], r"ring member 1.0 outside"),
])
def test_bad_members_are_rejected_before_anything_is_sent(members, match):
    tp = Hub(4, timeout_s=5.0).transport(1)
    with pytest.raises(ValueError, match=match):
        ring_all_reduce_sum(tp, 0, torch.zeros(DIM), members)
    assert not tp.counters()["bytes_sent"]
