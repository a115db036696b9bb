"""DiLoCo's one shared state under churn and partitions: a joiner takes over the donor's
momentum buffer, and the sides of a partition merge their states when the links come back
(docs/ALGORITHM.md, "Churn"). Driven on flat float64 vectors over the in-memory transport."""
from __future__ import annotations

import pytest
import torch
from test_algorithms import DIM, consensus_error, on_hub, quadratic_inner, random_starts

from gasloc_emu import algorithms
from gasloc_emu.algorithms import DiLoCo, load
from gasloc_emu.simulator.memory import Hub

ROUNDS, CUT = 6, range(1, 3)    # a partition {0, 1} | {2, 3} in rounds 1 and 2


def sides(rank: int):
    def members(t: int) -> frozenset:
        if t in CUT:
            return frozenset({0, 1}) if rank < 2 else frozenset({2, 3})
        return frozenset(range(4))
    return members


def partitioned(heal: bool) -> list[list[torch.Tensor]]:
    """Four DiLoCo workers through the partition; theta after each round, per worker."""
    inner, starts = quadratic_inner(4, seed=3), random_starts(4, seed=4)
    hist: list[list[torch.Tensor]] = [[] for _ in range(4)]

    def body(rank: int, tp) -> None:
        algo = DiLoCo(rank, tp, 0.7, 0.9, members=sides(rank),
                      heals=(lambda t: t == CUT.stop) if heal else None)
        theta = starts[0].clone()   # DiLoCo: one starting point for everyone
        algo.begin(theta)
        for t in range(ROUNDS):
            inner(rank, theta, 3)
            algo.outer_step(t, theta)
            hist[rank].append(theta.clone())
    on_hub(Hub(4, timeout_s=60.0), body)
    return hist


def test_the_sides_of_a_partition_drift_apart_and_merge_when_it_heals():
    hist = partitioned(heal=True)
    for t in CUT:   # each side shares one state, the two sides differ
        assert torch.equal(hist[0][t], hist[1][t]) and torch.equal(hist[2][t], hist[3][t])
        assert not torch.equal(hist[0][t], hist[2][t])
    for t in range(CUT.stop, ROUNDS):   # one state again, to the bit
        assert all(torch.equal(hist[0][t], hist[r][t]) for r in range(4)), t


def test_without_the_heal_the_sides_never_merge():
    hist = partitioned(heal=False)
    assert consensus_error([h[-1] for h in hist]) > 1e-3


def test_the_heal_is_the_mean_of_the_states_then_the_step():
    """Round CUT.stop by hand: theta and buffer averaged over the four, then the usual step."""
    inner, starts = quadratic_inner(4, seed=3), random_starts(4, seed=4)
    states = {}

    def body(rank: int, tp) -> None:
        algo = DiLoCo(rank, tp, 0.7, 0.9, members=sides(rank), heals=lambda t: t == CUT.stop)
        theta = starts[0].clone()
        algo.begin(theta)
        for t in range(CUT.stop + 1):
            inner(rank, theta, 3)
            if t == CUT.stop:
                states[rank] = (algo.anchor.clone(), algo.buf.clone(), theta.clone())
            algo.outer_step(t, theta)
        states[rank] += (theta.clone(),)
    on_hub(Hub(4, timeout_s=60.0), body)
    anchor = sum(states[r][0] for r in range(4)) / 4
    buf = sum(states[r][1] for r in range(4)) / 4
    delta = sum(states[r][0] - states[r][2] for r in range(4)) / 4   # each drift, own anchor
    buf = 0.9 * buf + delta
    expect = anchor - 0.7 * (delta + 0.9 * buf)
    for r in range(4):
        assert torch.allclose(states[r][3], expect, atol=1e-12, rtol=0)


@pytest.mark.parametrize("take_over", [True, False])
def test_a_joiner_takes_over_the_donors_buffer_and_stays_in_step(take_over):
    """Worker 2 leaves for rounds 2-3 and rejoins at 4 from worker 0: with the buffer taken
    over, the three hold one state again; with a fresh buffer they would split."""
    inner = quadratic_inner(3, seed=5)
    start = random_starts(1, seed=6)[0]
    alive = {t: frozenset({0, 1}) if t in (2, 3) else frozenset({0, 1, 2}) for t in range(6)}
    final = {}

    def body(rank: int, tp) -> None:
        algo = DiLoCo(rank, tp, 0.7, 0.9, members=lambda t: alive[t])
        theta = start.clone()
        algo.begin(theta)
        for t in range(6):
            if rank not in alive[t]:
                continue
            if rank == 0 and t == 4:
                tp.send(2, t, "join", theta.clone())
                for kind, tensor in algo.handover().items():
                    tp.send(2, t, kind, tensor)
            if rank == 2 and t == 4:
                theta.copy_(tp.recv(0, t, "join"))
                algo.begin(theta)
                state = {kind: tp.recv(0, t, kind) for kind in algo.handover()}
                if take_over:
                    algo.take_over(state)
            inner(rank, theta, 3)
            algo.outer_step(t, theta)
        final[rank] = theta.clone()
    on_hub(Hub(3, timeout_s=60.0), body)
    same = all(torch.equal(final[0], final[r]) for r in (1, 2))
    assert same == take_over


def test_diloco_declares_its_extra_messages_for_the_receivers_schema():
    numel = DIM
    none = algorithms.NoSettings()
    assert load("diloco").wire_kinds(numel, none) == {"outer": (numel,), "heal": (2 * numel,)}
    assert load("gasloc").wire_kinds(numel, none) == {}
