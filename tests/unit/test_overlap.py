"""Overlapped GASLoC and DiLoCo (``algo.overlap = 1``), on the float64 quadratic harness.

docs/ALGORITHM.md, "Overlap": the written update, its special cases, the stability rule the
config enforces (no negative eigenvalue in W), and the simulator's background lane.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_algorithms import DIM, consensus_error, on_hub, quadratic_inner, random_starts

from gasloc_emu import config
from gasloc_emu.algorithms import DiLoCo, GASLoC
from gasloc_emu.config import ConfigError
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.memory import Hub
from gasloc_emu.simulator.virtual_clock import Compute, Done, Mark, Recv, Send, VirtualClock
from gasloc_emu.topology import Topology


def run_overlapped(n: int, make_algo, rounds: int, steps: int = 5, theta0=None,
                   background: bool = False, inner=None) -> list[list[torch.Tensor]]:
    """Like ``test_algorithms.run_threads``, with ``finish`` after the last round: history[rank]
    holds theta after each round, then the final model."""
    hub = Hub(n, timeout_s=60.0, background=background)
    theta0 = theta0 or [torch.zeros(DIM, dtype=torch.float64) for _ in range(n)]
    inner = inner or quadratic_inner(n)
    hist: list[list[torch.Tensor]] = [[] for _ in range(n)]

    def loop(rank: int, tp) -> None:
        algo, theta = make_algo(rank, tp), theta0[rank].clone()
        algo.begin(theta)
        for t in range(rounds):
            inner(rank, theta, steps)
            algo.outer_step(t, theta)
            hist[rank].append(theta.clone())
        algo.finish(theta)
        hist[rank].append(theta.clone())
        tp.finish()

    on_hub(hub, loop)
    return hist


def written_overlapped_gasloc(topo: Topology, theta0, rounds: int, steps: int, eta: float,
                              gamma: float) -> np.ndarray:
    """docs/ALGORITHM.md's overlapped update with explicit matrices: rows are workers."""
    inner = quadratic_inner(topo.n)
    z = torch.stack(theta0).clone()            # where each round's inner phase starts
    y_prev, mixed = z.clone(), z.clone()       # round 0: m = theta_0, nothing in flight
    for t in range(rounds):
        plus = z.clone()
        for i in range(topo.n):
            inner(i, plus[i], steps)
        y = mixed + eta * (plus - z)           # m_i + eta g_i, g_i from z_i
        z = y + gamma * (y - y_prev)
        y_prev = y
        mixed = torch.from_numpy(topo.mixing_matrix(t)) @ z   # lands at the end of round t+1
    return mixed.numpy()


@pytest.mark.parametrize("name,alpha", [("ring", 0.75), ("matching", 1.0)])
def test_overlapped_gasloc_is_the_written_update(name, alpha):
    n, rounds = 6, 12
    topo = Topology(name, n, alpha=alpha)
    starts = random_starts(n)
    hist = run_overlapped(n, lambda r, tp: GASLoC(r, tp, topo, 0.7, 0.5, overlap=1), rounds,
                          theta0=starts)
    want = written_overlapped_gasloc(topo, starts, rounds, 5, 0.7, 0.5)
    got = np.stack([h[-1].numpy() for h in hist])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_overlap_changes_the_iterates_and_overlap_0_does_not():
    """The same run with overlap 0 through the overlap-aware worker loop is today's GASLoC."""
    n, topo, starts = 4, Topology("ring", 4, alpha=0.75), random_starts(4)
    plain = run_overlapped(n, lambda r, tp: GASLoC(r, tp, topo, 0.7, 0.9), 8, theta0=starts)
    same = run_overlapped(n, lambda r, tp: GASLoC(r, tp, topo, 0.7, 0.9, overlap=0), 8,
                          theta0=starts)
    lagged = run_overlapped(n, lambda r, tp: GASLoC(r, tp, topo, 0.7, 0.9, overlap=1), 8,
                            theta0=starts)
    assert all(torch.equal(a[-1], b[-1]) for a, b in zip(plain, same, strict=True))
    assert not torch.allclose(plain[0][-1], lagged[0][-1])


def test_overlapped_diloco_equals_overlapped_gasloc_on_the_complete_graph():
    """The overlapped pair keeps the overlap-0 identity (GASLoC on W = 11^T/n is DiLoCo): the
    same iterates to rounding over 40 rounds, the background All-Reduce against gossip."""
    n, rounds = 5, 40
    topo, starts = Topology("complete", n), random_starts(n)
    gas = run_overlapped(n, lambda r, tp: GASLoC(r, tp, topo, 0.7, 0.9, overlap=1), rounds,
                         theta0=starts)
    dil = run_overlapped(n, lambda r, tp: DiLoCo(r, tp, 0.7, 0.9, overlap=1), rounds,
                         theta0=starts, background=True)
    for g, d in zip(gas, dil, strict=True):
        scale = max(1.0, float(g[-1].abs().max()))
        assert float((g[-1] - d[-1]).abs().max()) < 1e-11 * scale
    # and every worker ends on the same model (the last mean lands in ``finish``)
    assert consensus_error([d[-1] for d in dil]) == 0.0


def test_overlapped_diloco_is_the_same_with_and_without_the_background_lane():
    n, starts = 4, random_starts(4)
    make = lambda r, tp: DiLoCo(r, tp, 0.7, 0.9, overlap=1)  # noqa: E731
    at_once = run_overlapped(n, make, 6, theta0=starts)
    deferred = run_overlapped(n, make, 6, theta0=starts, background=True)
    assert all(torch.equal(a[-1], b[-1]) for a, b in zip(at_once, deferred, strict=True))


def stiff_inner(n: int, eps: float):
    """An inner phase that removes a fraction ``eps`` of each worker's distance to its own
    centre (the contraction of docs/ALGORITHM.md's mode analysis), centres far apart."""
    g = torch.Generator().manual_seed(5)
    centres = [3 * torch.randn(DIM, generator=g, dtype=torch.float64) for _ in range(n)]

    def inner(rank: int, theta: torch.Tensor, steps: int) -> None:
        theta.sub_(eps * (theta - centres[rank]))
    return inner


def disagreement(alpha: float, overlap: int, graph: str = "ring", eps: float = 0.3,
                 rounds: int = 60) -> float:
    """8 workers, eta = 1 (so eta * eps = eps), gamma 0.9: the disagreement before the last
    mix."""
    n = 8
    topo = Topology(graph, n, alpha=alpha)
    hist = run_overlapped(n, lambda r, tp: GASLoC(r, tp, topo, 1.0, 0.9, overlap=overlap),
                          rounds, inner=stiff_inner(n, eps))
    return consensus_error([h[-2] for h in hist])


def test_a_negative_eigenvalue_makes_overlapped_momentum_diverge():
    """Mode analysis: kappa = mu - eta*eps; on the 8-ring at alpha = 1 (mu = -1/3), gamma 0.9
    and eta*eps = 0.3, kappa = -0.63 < -1/(1 + 2 gamma) and a disagreement grows; at the lazy
    alpha = 0.75 (W >= 0) it stays bounded, and without overlap alpha = 1 is fine."""
    assert disagreement(1.0, overlap=1) > 1e3
    assert disagreement(0.75, overlap=1) < 50
    assert disagreement(1.0, overlap=0) < 50


def pair_disagreement(alpha: float, overlap: int) -> float:
    """One-peer matchings, eta * eps = 0.35."""
    return disagreement(alpha, overlap, graph="matching", eps=0.35)


def test_a_lazier_gossip_step_takes_back_what_the_lag_adds():
    """docs/ALGORITHM.md, "What the lag costs": a pair's disagreement goes by kappa = 1 - alpha -
    eta*eps with overlap, (1 - alpha)(1 - eta*eps) without. At alpha = 1 the overlapped pair's
    kappa is -0.35 and, with gamma 0.9, its disagreement flips sign every round and fades
    slowly: several times the sequential one. alpha = 1 - eta*eps brings kappa back to 0, and
    the disagreement to the sequential run's."""
    sequential = pair_disagreement(1.0, overlap=0)
    assert pair_disagreement(1.0, overlap=1) > 4 * sequential
    assert pair_disagreement(0.65, overlap=1) < 1.25 * sequential


def _cfg(**over):
    sets = tuple(f"{k}={v}" for k, v in over.items())
    return config.resolve(overrides={"workers": 8, "run.rounds": 2}, sets=sets)


def test_the_config_refuses_overlap_where_it_diverges_and_says_which_alpha_works():
    with pytest.raises(ConfigError, match=r"W has -0.333 at algo.alpha = 1; set algo.alpha "
                                          r"<= 0.75"):
        build_plan(_cfg(**{"algo.overlap": 1}), data=False)
    build_plan(_cfg(**{"algo.overlap": 1, "algo.alpha": 0.75}), data=False)
    build_plan(_cfg(**{"algo.overlap": 1, "topology.name": "matching"}), data=False)
    build_plan(_cfg(**{"algo.overlap": 1, "algo.name": "diloco"}), data=False)
    with pytest.raises(ConfigError, match="dsgd has no outer step to overlap"):
        build_plan(_cfg(**{"algo.overlap": 1, "algo.name": "dsgd"}), data=False)
    with pytest.raises(ConfigError, match="algo.overlap"):
        _cfg(**{"algo.overlap": 2})


def test_the_lazy_alpha_is_the_largest_with_no_negative_eigenvalue():
    for name in ("ring", "torus", "expander", "exponential"):
        lazy = Topology(name, 8).lazy_alpha()
        assert Topology(name, 8, alpha=lazy).min_eigenvalue() == pytest.approx(0.0, abs=1e-12)
        assert Topology(name, 8, alpha=min(1.0, lazy + 0.01)).min_eigenvalue() < 0


# ---------------------------------------------------------------- the background lane


def test_a_background_all_reduce_runs_alongside_compute_on_the_clock():
    """Two workers, 1 s of compute each, then a 1-chunk exchange that takes 2 s on the wire:
    in the background it overlaps the next round's 1 s of compute, so the worker waits 1 s."""
    clock = VirtualClock(2, lambda s, d, nbytes: (nbytes / 1000.0, 0.0), slots=2,
                         lanes_per_worker=2)
    rows = []
    clock.emit = rows.append
    for r in (0, 1):
        bg, peer = 2 + r, 1 - r
        clock.report(r, Compute(1.0, dedicated=True))
        clock.report(r, Send((bg, r, 0, "fork"), 0))
        clock.report(bg, Recv((bg, r, 0, "fork")))
        clock.report(r, Compute(1.0, dedicated=True))           # the next round's inner steps
        clock.report(bg, Send((2 + peer, bg, 0, "rs0"), 2000))  # lane keys: background lanes
        clock.report(bg, Recv((bg, 2 + peer, 0, "rs0")))
        clock.report(bg, Send((r, bg, 0, "joined"), 0))
        clock.report(r, Recv((r, bg, 0, "joined")))
        clock.report(r, Mark({"worker": r}))
        clock.report(r, Done())
        clock.report(bg, Done())
    assert clock.finished()
    assert [row["time_s"] for row in rows] == [3.0, 3.0]   # 1 s compute + max(1 s, 2 s wire)
    assert [row["wait_s"] for row in rows] == [1.0, 1.0]
