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
