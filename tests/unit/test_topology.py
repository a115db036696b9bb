"""Graphs, Metropolis-Hastings mixing matrices, shared-seed matchings, lambda_2 and gamma*."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gasloc_emu.topology import (
    FIXED,
    RANDOM,
    LivingGraph,
    Topology,
    TopologyError,
    critical_momentum,
    torus_shape,
)

ALL = FIXED + RANDOM


def _valid(name: str, n: int, degree: int, base: str = "complete") -> bool:
    """Whether (name, N, d) is a request the topology module should accept."""
    graph = base if name in RANDOM else name
    if n < 2 or (name in RANDOM and n % 2):
        return False
    if graph == "torus" and all(n % r for r in range(2, math.isqrt(n) + 1)):
        return False
    return not (graph == "expander" and (degree >= n or (n * degree) % 2))


def assert_mixing_matrix(w: np.ndarray, topo: Topology, t: int) -> None:
    n = topo.n
    assert w.shape == (n, n)
    np.testing.assert_allclose(w, w.T, rtol=0, atol=1e-15, err_msg="W is not symmetric")
    np.testing.assert_allclose(w.sum(0), np.ones(n), rtol=0, atol=1e-12)
    np.testing.assert_allclose(w.sum(1), np.ones(n), rtol=0, atol=1e-12)
    assert (w >= -1e-15).all(), "W has negative entries"
    # W_ij > 0 exactly on this round's edges (and the diagonal)
    adj = topo.neighbors(t)
    for i in range(n):
        off = {j for j in range(n) if j != i and w[i, j] != 0}
        assert off == set(adj[i])


# ---------------------------------------------------------------- property: every graph, every seed

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(name=st.sampled_from(ALL), n=st.integers(2, 24), degree=st.integers(2, 5),
       seed=st.integers(0, 2**32), t=st.integers(0, 10_000),
       base=st.sampled_from(["complete", "ring", "torus", "exponential", "expander"]))
def test_mixing_matrix_symmetric_doubly_stochastic(name, n, degree, seed, t, base):
    if name in RANDOM and base in ("ring", "expander"):
        n = min(n, 16)  # random search for perfect matchings of sparse graphs: keep it quick
    assume(_valid(name, n, degree, base))
    topo = Topology(name, n, degree=degree, seed=seed, base=base)
    w = topo.mixing_matrix(t)
    assert_mixing_matrix(w, topo, t)
    if name in RANDOM:
        degs = [len(a) for a in topo.neighbors(t)]
        assert set(degs) <= ({1} if name == "matching" else {1, 2})
        if name == "matching":  # a perfect matching, pairwise averaging with weight 1/2
            assert all(d == 1 for d in degs)
            for i, (j,) in enumerate(topo.neighbors(t)):
                assert w[i, j] == 0.5 and w[i, i] == 0.5
        # the edges come from the base graph
        assert topo.edges(t) <= Topology(base, n, degree=degree, seed=seed).edges(0)
    else:
        assert topo.edges(t) == topo.edges(t + 17)  # fixed graphs do not change


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), alpha=st.floats(0.05, 1.0), seed=st.integers(0, 1000),
       name=st.sampled_from(["ring", "exponential", "complete", "matching2"]))
def test_alpha_scales_the_laplacian(n, alpha, seed, name):
    """W = I - alpha * L: off-diagonal entries scale with alpha, W stays doubly stochastic."""
    assume(_valid(name, n, 4))
    one = Topology(name, n, seed=seed).mixing_matrix(3)
    w = Topology(name, n, seed=seed, alpha=alpha).mixing_matrix(3)
    off = ~np.eye(n, dtype=bool)
    np.testing.assert_allclose(w[off], alpha * one[off], rtol=1e-12, atol=0)
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-12)


# ---------------------------------------------------------------- graphs

@pytest.mark.parametrize("n", [3, 4, 5, 8, 13, 32, 64])
def test_ring_lambda2_closed_form(n):
    """Ring with MH weights 1/3: eigenvalues 1/3 + 2/3 cos(2 pi k / n); lambda2 is k = 1."""
    topo = Topology("ring", n)
    w = topo.mixing_matrix()
    np.testing.assert_allclose(w[w != 0], 1 / 3, rtol=0, atol=1e-15)  # MH weights, W_ii too
    eigs = 1 / 3 + 2 / 3 * np.cos(2 * np.pi * np.arange(n) / n)
    expected = np.sort(np.abs(eigs))[::-1][1]
    assert topo.lambda2 == pytest.approx(expected, abs=1e-12)
    if n >= 4:
        assert topo.lambda2 == pytest.approx(max(1 / 3 + 2 / 3 * math.cos(2 * math.pi / n), 1 / 3),
                                             abs=1e-12)
    assert topo.spectral_gap == pytest.approx(1 - topo.lambda2)


def test_ring_32_gamma_star_value():
    topo = Topology("ring", 32)
    lam = 1 / 3 + 2 / 3 * math.cos(2 * math.pi / 32)
    assert topo.gamma_star == pytest.approx((1 - math.sqrt(1 - lam)) ** 2 / lam, rel=1e-12)
    assert topo.gamma_star == pytest.approx(0.79665, abs=1e-4)


@pytest.mark.parametrize("n", [2, 3, 5, 16, 50])
def test_complete_graph_is_exact_averaging(n):
    topo = Topology("complete", n)
    np.testing.assert_allclose(topo.mixing_matrix(), np.full((n, n), 1 / n), rtol=0, atol=1e-15)
    assert topo.lambda2 == pytest.approx(0.0, abs=1e-12)
    assert topo.gamma_star == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("n", [8, 16, 32])
def test_matching_on_complete_base_lambda2(n):
    """E[W] = I/2 + (11^T - I) / (2(n-1)) for a uniform perfect matching: lambda2 = 1/2 -
    1/(2(n-1))."""
    exact = 0.5 - 0.5 / (n - 1)
    lam = Topology("matching", n, seed=3).lambda2
    assert 0.0 < lam < 1.0
    assert lam == pytest.approx(exact, abs=0.08)  # E[W] is estimated from sampled rounds


def test_lambda2_orders_graphs_by_connectivity():
    n = 32
    lam = {name: Topology(name, n).lambda2 for name in FIXED}
    assert lam["complete"] < lam["exponential"] < lam["torus"] < lam["ring"] < 1.0
    assert 0.0 < lam["expander"] < lam["ring"]
    for name, v in lam.items():
        g = critical_momentum(v)
        assert 0.0 <= g < 1.0, name


@pytest.mark.parametrize("lam,gamma", [(0.0, 0.0), (1.0, 1.0),
                                       (0.5, (1 - math.sqrt(0.5)) ** 2 / 0.5),
                                       (0.99, (1 - 0.1) ** 2 / 0.99)])
def test_critical_momentum_values(lam, gamma):
    assert critical_momentum(lam) == pytest.approx(gamma, rel=1e-12, abs=1e-15)


def test_critical_momentum_is_critical_damping():
    """gamma* makes the heavy-ball recursion x+ = lam (1 + g) x - lam g x- have a double root."""
    for lam in (0.3, 0.8, 0.99, 0.9999):
        g = critical_momentum(lam)
        disc = (lam * (1 + g)) ** 2 - 4 * lam * g
        assert abs(disc) < 1e-9
        assert math.sqrt(lam * g) == pytest.approx(1 - math.sqrt(1 - lam), rel=1e-9)


@pytest.mark.parametrize("n,shape", [(4, (2, 2)), (6, (2, 3)), (12, (3, 4)), (16, (4, 4)),
                                     (36, (6, 6))])
def test_torus_shape(n, shape):
    assert torus_shape(n) == shape
    topo = Topology("torus", n)
    degs = {len(a) for a in topo.neighbors(0)}
    assert degs == ({4} if min(shape) > 2 else {3} if max(shape) > 2 else {2})


def test_exponential_graph_edges():
    topo = Topology("exponential", 16)
    assert topo.peers(0, 0) == sorted({1, 2, 4, 8, 15, 14, 12})
    assert {len(a) for a in topo.neighbors(0)} == {7}


@pytest.mark.parametrize("n,d", [(8, 3), (10, 4), (16, 4), (32, 4), (64, 6), (32, 8), (16, 8),
                                 (12, 11), (64, 16)])
def test_expander_is_connected_d_regular_for_valid_degrees(n, d):
    """Every d < N with N x d even is a valid request (d = N - 1 is the complete graph)."""
    topo = Topology("expander", n, degree=d, seed=1)
    adj = topo.neighbors(0)
    assert all(len(a) == d for a in adj)
    assert all(i not in a for i, a in enumerate(adj))
    assert topo.lambda2 < 1 - 1e-9  # connected: a simple eigenvalue 1


def test_expander_depends_on_seed_only():
    a = Topology("expander", 32, degree=4, seed=5).edges(0)
    b = Topology("expander", 32, degree=4, seed=5).edges(0)
    c = Topology("expander", 32, degree=4, seed=6).edges(0)
    assert a == b and a != c


# ---------------------------------------------------------------- shared-seed matchings

@pytest.mark.parametrize("name", RANDOM)
@pytest.mark.parametrize("base", ["complete", "torus", "exponential"])
def test_every_worker_derives_the_same_matching(name, base):
    """Separate Topology objects (one per worker) agree on round t's edges and weights."""
    n, seed = 16, 1234
    per_worker = [Topology(name, n, seed=seed, base=base) for _ in range(n)]
    seen = set()
    for t in range(25):
        edges = per_worker[0].edges(t)
        seen.add(frozenset(edges))
        for rank, topo in enumerate(per_worker):
            assert topo.edges(t) == edges
            # worker i talks to j exactly when j talks to i, with the same weight
            w_self, w_off = topo.row(rank, t)
            for j, wij in w_off.items():
                _, back = per_worker[j].row(j, t)
                assert back[rank] == wij
            assert w_self + sum(w_off.values()) == pytest.approx(1.0, abs=1e-15)
    assert len(seen) > 10  # the matching really changes between rounds
    other = Topology(name, n, seed=seed + 1, base=base)
    assert any(other.edges(t) != per_worker[0].edges(t) for t in range(25))


def test_matching_is_the_same_in_a_separate_process():
    """A fresh interpreter (another hash seed), as a separate worker process would be."""
    n, seed, rounds = 12, 99, 8
    here = [sorted(Topology("matching2", n, seed=seed).edges(t)) for t in range(rounds)]
    code = ("import json; from gasloc_emu.topology import Topology; "
            f"print(json.dumps([sorted(Topology('matching2', {n}, seed={seed}).edges(t)) "
            f"for t in range({rounds})]))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, timeout=60)
    there = [sorted(tuple(e) for e in edges) for edges in json.loads(out.stdout)]
    assert there == [[tuple(e) for e in edges] for edges in here]


@pytest.mark.parametrize("base", ["ring", "torus", "expander"])
def test_matching_over_sparse_base_graph_for_larger_n(base):
    """A perfect matching exists in these base graphs (even N); the sampler must find one."""
    n = 64
    topo = Topology("matching", n, degree=4, seed=0, base=base)
    for t in range(3):
        adj = topo.neighbors(t)
        assert all(len(a) == 1 for a in adj)


# ---------------------------------------------------------------- bad requests

@pytest.mark.parametrize("kwargs,match", [
    (dict(name="ring", n=1), "at least 2"),
    (dict(name="matching", n=7), "even"),
    (dict(name="matching2", n=5), "even"),
    (dict(name="expander", n=8, degree=8), r"\[1, N - 1\]"),
    (dict(name="expander", n=7, degree=3), "even"),
    (dict(name="torus", n=7), "torus"),
    (dict(name="torus", n=3), "torus"),
    (dict(name="star", n=8), "unknown"),
    (dict(name="matching", n=8, base="star"), "unknown"),
])
def test_bad_requests_raise_topology_error(kwargs, match):
    with pytest.raises(TopologyError, match=match):
        Topology(**kwargs)


# ---------------------------------------------------------------- the graph over the living workers

def _living(topo: Topology, alive) -> LivingGraph:
    """The view of ``topo`` over a fixed set of living workers (the same in every round)."""
    alive = frozenset(alive)
    return LivingGraph(topo, lambda t: alive)


def _unmatched(graph: LivingGraph, t: int, alive) -> set[int]:
    return {i for i in alive if not graph.peers(i, t)}


def test_ring_minus_one_worker_is_a_path_with_surviving_degrees():
    """Worker 2 of a 6-ring leaves: its neighbours 1 and 3 become path ends, degree 1."""
    graph = _living(Topology("ring", 6), {0, 1, 3, 4, 5})
    assert graph.edges(0) == {(0, 1), (3, 4), (4, 5), (0, 5)}
    assert [graph.peers(i, 7) for i in range(6)] == [[1, 5], [0], [], [4], [3, 5], [0, 4]]
    assert graph.row(2, 0) == (1.0, {})  # the dead worker: asking is allowed
    assert graph.row(1, 0) == (pytest.approx(2 / 3), {0: 1 / 3})  # 1 / (1 + max(1, 2))
    assert graph.row(4, 0) == (pytest.approx(1 / 3), {3: 1 / 3, 5: 1 / 3})
    w = graph.mixing_matrix(0)
    assert w[2, 2] == 1.0 and w[2].sum() == 1.0 and w[:, 2].sum() == 1.0
    np.testing.assert_allclose(w.sum(0), 1.0, atol=1e-15)


@pytest.mark.parametrize("n,dead", [(5, {3}), (8, {0, 6, 7}), (4, {0, 1, 2})])
def test_complete_graph_over_the_living_is_exact_averaging_of_the_living(n, dead):
    """Surviving degrees: k living workers of a complete graph mix with weights 1/k, not 1/n."""
    alive = sorted(set(range(n)) - dead)
    w = _living(Topology("complete", n), alive).mixing_matrix(0)
    k = len(alive)
    np.testing.assert_allclose(w[np.ix_(alive, alive)], np.full((k, k), 1 / k), rtol=0,
                               atol=1e-15)


@pytest.mark.parametrize("name", ["ring", "torus", "matching"])
def test_worker_whose_neighbours_all_left_trains_alone(name):
    """Worker 0 of a 2 x 4 ring/torus loses 1, 3 (and 4): no peers, W row (1.0, {})."""
    n = 8
    dead = {1, 7} if name == "ring" else {1, 3, 4}
    base = "torus" if name == "matching" else "complete"
    graph = _living(Topology(name, n, base=base, seed=4), set(range(n)) - dead)
    for t in range(5):
        assert graph.peers(0, t) == []
        assert graph.row(0, t) == (1.0, {})
        assert all(0 not in graph.peers(j, t) for j in range(n))


@pytest.mark.parametrize("name", RANDOM)
def test_matching_over_an_odd_living_set_leaves_one_worker_unmatched(name):
    """7 of 8 workers alive on a complete base: 3 pairs per matching, the dead one untouched."""
    n, alive = 8, {0, 1, 2, 4, 5, 6, 7}
    graph = _living(Topology(name, n, seed=11), alive)
    left_out = set()
    for t in range(30):
        edges = graph.edges(t)
        assert all(a in alive and b in alive for a, b in edges)
        assert graph.peers(3, t) == [] and graph.row(3, t) == (1.0, {})
        if name == "matching":
            assert len(edges) == 3
            (alone,) = _unmatched(graph, t, alive)
            left_out.add(alone)
            assert graph.row(alone, t) == (1.0, {})
        else:
            assert 3 <= len(edges) <= 6
            assert {len(graph.peers(i, t)) for i in alive} <= {0, 1, 2}
    if name == "matching":
        assert len(left_out) > 3  # the worker left out changes with the round


def test_matching_is_drawn_among_the_living_not_cut_from_the_full_one():
    """6 of 10 alive: every round pairs all 6 (cutting a full matching would leave some alone)."""
    alive = {0, 2, 3, 5, 8, 9}
    graph = _living(Topology("matching", 10, seed=6), alive)
    for t in range(30):
        assert not _unmatched(graph, t, alive)


def test_matching_over_a_sparse_base_subset_leaves_as_few_unmatched_as_possible():
    """A 4 x 4 torus is bipartite; two workers of one colour leave: 8 vs 6 on the two sides,
    so no perfect matching exists and the best leaves 2 living workers unmatched."""
    n, dead = 16, {0, 5}  # both of colour (row + col) % 2 == 0
    alive = set(range(n)) - dead
    graph = _living(Topology("matching", n, seed=2, base="torus"), alive)
    for t in range(10):
        assert len(_unmatched(graph, t, alive)) == 2
        assert graph.edges(t) <= Topology("torus", n).edges(0)


def test_matching_over_a_subset_whose_components_are_odd():
    """A 12-ring minus 0 and 6 is two paths of 5 workers: one unmatched in each."""
    n, alive = 12, set(range(12)) - {0, 6}
    graph = _living(Topology("matching", n, seed=9, base="ring"), alive)
    for t in range(10):
        alone = _unmatched(graph, t, alive)
        assert len(alone) == 2 and len(alone & {1, 2, 3, 4, 5}) == 1


@pytest.mark.parametrize("name,base", [(name, "complete") for name in FIXED] + [
    (name, base) for name in RANDOM for base in ("complete", "torus", "exponential", "expander")])
def test_all_alive_is_the_full_topology_bit_for_bit(name, base):
    """With everyone alive, peers, rows and W are exactly the full graph's (same draws)."""
    n = 12
    topo = Topology(name, n, degree=3, seed=21, base=base)
    graph = LivingGraph(topo, lambda t: range(n))
    for t in range(12):
        assert graph.edges(t) == topo.edges(t)
        assert graph.neighbors(t) == topo.neighbors(t)
        for i in range(n):
            assert graph.peers(i, t) == topo.peers(i, t)
            assert graph.row(i, t) == topo.row(i, t)  # float equality: the same bits
        assert np.array_equal(graph.mixing_matrix(t), topo.mixing_matrix(t))
    assert (graph.n, graph.name, graph.lambda2, graph.gamma_star) == (
        topo.n, topo.name, topo.lambda2, topo.gamma_star)


def test_living_set_may_change_between_rounds():
    """alive(t) is asked per round: a worker leaves at round 3 and comes back at round 6."""
    n = 6
    graph = LivingGraph(Topology("ring", n),
                        lambda t: set(range(n)) - ({2} if 3 <= t < 6 else set()))
    assert [graph.peers(1, t) for t in (2, 3, 5, 6)] == [[0, 2], [0], [0], [0, 2]]


def test_living_rounds_are_memoised_per_round_and_living_set():
    from gasloc_emu.topology import _living_round

    graph = _living(Topology("matching", 10, seed=5), range(9))
    graph.row(0, 1234)
    before = _living_round.cache_info()
    for i in range(10):
        graph.row(i, 1234)
        graph.peers(i, 1234)
    after = _living_round.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 20


@pytest.mark.parametrize("alive,match", [({0, 6}, r"\[6\] outside \[0, 6\)"),
                                         ({-1, 2}, r"\[-1\] outside"), ({"1"}, "outside")])
def test_living_workers_outside_the_graph_are_rejected(alive, match):
    graph = _living(Topology("ring", 6), alive)
    with pytest.raises(ValueError, match=match):
        graph.peers(0, 0)


@pytest.mark.parametrize("rank", [-1, 6, 1.0])
def test_living_graph_rejects_bad_ranks(rank):
    with pytest.raises(ValueError, match=r"outside \[0, 6\)"):
        _living(Topology("ring", 6), range(6)).row(rank, 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(name=st.sampled_from(ALL), n=st.integers(2, 20), degree=st.integers(2, 5),
       seed=st.integers(0, 2**32), t=st.integers(0, 10_000),
       base=st.sampled_from(["complete", "ring", "torus", "exponential", "expander"]),
       data=st.data())
def test_living_mixing_matrix_symmetric_doubly_stochastic(name, n, degree, seed, t, base, data):
    """Over any living subset: W symmetric, doubly stochastic, non-negative, identity rows for
    the dead, and nonzero off the diagonal exactly on edges of the full graph with both ends
    alive (all of them on a fixed graph; a matching of the living for random ones)."""
    assume(_valid(name, n, degree, base))
    topo = Topology(name, n, degree=degree, seed=seed, base=base)
    alive = frozenset(data.draw(st.sets(st.integers(0, n - 1)), label="alive"))
    graph = _living(topo, alive)
    w = graph.mixing_matrix(t)
    np.testing.assert_array_equal(w, w.T)
    np.testing.assert_allclose(w.sum(0), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=0, atol=1e-12)
    assert (w >= 0).all()
    for i in set(range(n)) - alive:
        assert w[i, i] == 1.0 and graph.peers(i, t) == []
    edges = graph.edges(t)
    assert all(a in alive and b in alive for a, b in edges)
    assert {(i, j) for i in range(n) for j in range(i + 1, n) if w[i, j] != 0} == edges
    if name in RANDOM:
        assert edges <= topo.possible_edges
        degs = [len(graph.peers(i, t)) for i in range(n)]
        assert max(degs) <= (1 if name == "matching" else 2)
        if name == "matching" and base == "complete":
            assert len(edges) == len(alive) // 2  # everyone paired but one of an odd number
    else:
        assert edges == {(a, b) for a, b in topo.possible_edges if a in alive and b in alive}


# ---------------------------------------------------------------- fastest: peers by link rate

@st.composite
def _link_rates(draw, n_min: int = 2, n_max: int = 14):
    """An n x n matrix of directed rates (a few distinct values, so ties happen), 0 diagonal."""
    n = draw(st.integers(n_min, n_max))
    values = st.sampled_from([1.0, 5.0, 20.0, 50.0, 191.0, 440.0, 1000.0, 3739.0])
    rows = [[0.0 if i == j else draw(values) for j in range(n)] for i in range(n)]
    return tuple(tuple(r) for r in rows)


def _undirected(rates) -> dict[tuple[int, int], float]:
    n = len(rates)
    return {(i, j): min(rates[i][j], rates[j][i]) for i in range(n) for j in range(i + 1, n)}


def _connected_over(n: int, edges) -> bool:
    """Union-find over ``edges`` (written here, not the module's search)."""
    parent = list(range(n))

    def find(v):
        while parent[v] != v:
            v = parent[v]
        return v
    for a, b in edges:
        parent[find(a)] = find(b)
    return len({find(v) for v in range(n)}) == 1


def _best_bottleneck(rates) -> float:
    """The largest t whose links of rate >= t connect every worker: no connected graph on
    these links has a faster slowest edge (found by trying every rate, not by Kruskal)."""
    rate = _undirected(rates)
    return max(t for t in set(rate.values())
               if _connected_over(len(rates), [e for e, r in rate.items() if r >= t]))


@settings(max_examples=120, deadline=None)
@given(rates=_link_rates(), degree=st.integers(2, 6), slack=st.sampled_from([0.0, 0.2, 0.5]),
       alpha=st.sampled_from([1.0, 0.5]))
def test_fastest_is_connected_degree_bounded_and_doubly_stochastic(rates, degree, slack, alpha):
    n = len(rates)
    topo = Topology("fastest", n, degree=degree, rates=rates, slack=slack, alpha=alpha)
    edges = topo.edges(0)
    assert _connected_over(n, edges)
    assert max(len(a) for a in topo.neighbors(0)) <= degree
    assert_mixing_matrix(topo.mixing_matrix(0), topo, 0)
    assert topo.lambda2 < 1.0 - 1e-9  # connected: a spectral gap
    assert topo.edges(5) == edges and not topo.time_varying
    rate = _undirected(rates)
    assert topo.bottleneck_mbit() == min(rate[e] for e in edges)
    best = _best_bottleneck(rates)
    assert topo.bottleneck_mbit() <= best
    if degree >= n - 1:  # no cap: the spanning tree is a maximum one, the bottleneck the best
        assert topo.bottleneck_mbit() >= (1 - slack) * best
    if slack == 0.0:  # the edges added for mixing are no slower than the tree's slowest
        assert Topology("fastest", n, degree=degree, rates=rates).bottleneck_mbit() == \
            topo.bottleneck_mbit()


@settings(max_examples=60, deadline=None)
@given(rates=_link_rates(n_min=3), degree=st.integers(2, 5))
def test_fastest_fills_every_fast_enough_link_up_to_the_degree_cap(rates, degree):
    """Step 2 stops only when no link fast enough has both ends below the cap."""
    n = len(rates)
    topo = Topology("fastest", n, degree=degree, rates=rates)
    rate, edges = _undirected(rates), topo.edges(0)
    floor = topo.bottleneck_mbit()
    deg = [len(a) for a in topo.neighbors(0)]
    left = [e for e, r in rate.items() if r >= floor and e not in edges
            and deg[e[0]] < degree and deg[e[1]] < degree]
    assert left == []


def test_fastest_keeps_the_fast_links_and_leaves_the_slow_ones():
    """Two fast triangles joined by one fast link, every other link slow: the graph is the
    fast links, never a slow one, where a random expander of the same degree takes slow ones."""
    n, fast = 6, {(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5), (2, 3)}
    rates = tuple(tuple(0.0 if i == j else (1000.0 if (min(i, j), max(i, j)) in fast else 10.0)
                        for j in range(n)) for i in range(n))
    topo = Topology("fastest", n, degree=3, rates=rates)
    assert topo.edges(0) == fast
    assert topo.bottleneck_mbit() == 1000.0
    assert Topology("expander", n, degree=3, seed=0, rates=rates).bottleneck_mbit() == 10.0
    record = topo.peers_record()
    assert record["rule"].startswith("fastest: a spanning tree of greatest bottleneck")
    assert "d = 3" in record["rule"] and record["bottleneck_mbit"] == 1000.0
    assert [2, 3, 1000.0] in record["edges"] and len(record["edges"]) == 7


def test_fastest_takes_the_slower_direction_of_each_link():
    rates = ((0.0, 100.0, 100.0), (1.0, 0.0, 100.0), (100.0, 100.0, 0.0))  # 1 -> 0 is slow
    topo = Topology("fastest", 3, degree=2, rates=rates)
    assert topo.edges(0) == {(0, 2), (1, 2)}


def test_slack_trades_the_bottleneck_for_mixing():
    """A path of fast links and a slightly slower chord: slack 0 keeps the path (the best
    bottleneck), slack 0.2 adds the chord that joins the path's ends (the most hops apart)."""
    n = 5
    rate = {(i, i + 1): 100.0 for i in range(n - 1)} | {(0, 4): 85.0}
    rates = tuple(tuple(0.0 if i == j else rate.get((min(i, j), max(i, j)), 1.0)
                        for j in range(n)) for i in range(n))
    strict = Topology("fastest", n, degree=2, rates=rates)
    loose = Topology("fastest", n, degree=2, rates=rates, slack=0.2)
    assert strict.edges(0) == set(rate) - {(0, 4)} and strict.bottleneck_mbit() == 100.0
    assert loose.edges(0) == set(rate) and loose.bottleneck_mbit() == 85.0
    assert loose.lambda2 < strict.lambda2


def test_fastest_needs_rates_a_degree_that_connects_and_sane_rates():
    with pytest.raises(TopologyError, match=r"measured rates.*net\.bw_profile"):
        Topology("fastest", 8)
    ok = tuple(tuple(0.0 if i == j else 10.0 for j in range(4)) for i in range(4))
    with pytest.raises(TopologyError, match="d >= 2"):
        Topology("fastest", 4, degree=1, rates=ok)
    with pytest.raises(TopologyError, match="4 x 4"):
        Topology("fastest", 4, rates=ok[:3])
    bad = tuple(tuple(-1.0 if (i, j) == (2, 1) else v for j, v in enumerate(r))
                for i, r in enumerate(ok))
    with pytest.raises(TopologyError, match=r"2 -> 1 = -1\.0"):
        Topology("fastest", 4, rates=bad)
    with pytest.raises(TopologyError, match=r"slack = 1\.0"):
        Topology("fastest", 4, rates=ok, slack=1.0)


def test_every_graph_reports_its_peers_and_the_rates_only_when_given():
    assert Topology("ring", 4).peers_record() == {
        "rule": "ring: fixed by worker index", "bottleneck_mbit": None, "edge_count": 4,
        "edges": [[0, 1, None], [0, 3, None], [1, 2, None], [2, 3, None]]}
    m = Topology("matching", 4, seed=7).peers_record()
    assert m["edges"] is None and "seed 7" in m["rule"] and m["edge_count"] == 6
    big = Topology("complete", 92).peers_record()   # 4186 edges: counted, not listed
    assert big["edges"] is None and big["edge_count"] == 92 * 91 // 2


def test_the_config_offers_exactly_the_topology_modules_names():
    from gasloc_emu import config as C
    from gasloc_emu.topology import NAMES
    assert C.TOPOLOGIES == NAMES


def test_graphs_on_other_rates_are_other_graphs():
    """Rates enter equality (by digest), so memoised rounds never mix two runs' graphs."""
    a = tuple(tuple(0.0 if i == j else 10.0 + i + j for j in range(4)) for i in range(4))
    b = tuple(tuple(0.0 if i == j else 10.0 for j in range(4)) for i in range(4))
    assert Topology("fastest", 4, rates=a) == Topology("fastest", 4, rates=a)
    assert hash(Topology("fastest", 4, rates=a)) == hash(Topology("fastest", 4, rates=a))
    assert Topology("fastest", 4, rates=a) != Topology("fastest", 4, rates=b)
    assert Topology("ring", 4, rates=a) != Topology("ring", 4)
