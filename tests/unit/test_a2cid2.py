"""A2CiD2's pieces without sockets: the ODE's closed form, the graph constants, the identity with
plain asynchronous pairwise gossip when the momentum is off, and the pairer's rules."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gasloc_emu.algorithms.a2cid2 import A2CiD2, Slots, acid_constants, laplacian, ode_mix
from gasloc_emu.topology import Topology
from gasloc_emu.training.pairing import Pairer


def test_ode_mix_is_the_matrix_exponential_of_the_paper_s_system():
    x, xt = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    eta, tau = 0.37, 1.7
    m = torch.tensor([[-eta, eta], [eta, -eta]], dtype=torch.float64)
    e = torch.linalg.matrix_exp(m * tau)
    want_x, want_xt = e[0, 0] * x + e[0, 1] * xt, e[1, 0] * x + e[1, 1] * xt
    ode_mix(x, xt, eta, tau)
    assert torch.allclose(x, want_x, atol=1e-12) and torch.allclose(xt, want_xt, atol=1e-12)


def test_complete_graph_constants_have_their_closed_form():
    # K_n: Lambda = n/(n-1) (I - J/n): chi_1 = chi_2 = (n-1)/n, so eta = n/(2(n-1)), alpha~ = 1/2
    n = 6
    edges = {(a, b) for a in range(n) for b in range(a + 1, n)}
    eta, alpha_tilde = acid_constants(n, edges)
    assert eta == pytest.approx(n / (2 * (n - 1))) and alpha_tilde == pytest.approx(0.5)


def test_regular_graph_laplacian_is_the_authors_i_minus_a_over_d():
    topo = Topology("ring", 8)
    lap = laplacian(8, topo.possible_edges)
    adj = np.zeros((8, 8))
    for a, b in topo.possible_edges:
        adj[a, b] = adj[b, a] = 1
    assert np.allclose(lap, np.eye(8) - adj / 2)
    eta, alpha_tilde = acid_constants(8, topo.possible_edges)
    assert 0 < eta < 1 and alpha_tilde > 0.5   # the ring's chi_1 is far above its chi_2


def test_constants_at_rate_com_r_are_the_authors_laplacian_times_r():
    # their compute_acid_constants multiplies the Laplacian by rate_com: chi_1 and chi_2 both
    # shrink by R, so eta grows by R and alpha~ stays
    edges = Topology("ring", 8).possible_edges
    eta, at = acid_constants(8, edges)
    for rate in (0.5, 2.0, 3.0):
        eta_r, at_r = acid_constants(8, edges, rate)
        assert eta_r == pytest.approx(rate * eta) and at_r == pytest.approx(at)


@pytest.mark.parametrize(("rate", "steps", "exchanges"), [
    (1, 1, 1), (2, 1, 2), (8, 1, 8), (0.5, 2, 1), (0.25, 4, 1), (1 / 3, 3, 1)])
def test_slots_keep_rate_com_exchanges_per_step(rate, steps, exchanges):
    slots = Slots.of(rate)
    assert (slots.steps, slots.exchanges) == (steps, exchanges)
    assert slots.requests(12) / 12 == pytest.approx(rate)   # 12 steps: whole slots
    assert sum(slots.steps_in(k, 13) for k in range(slots.count(13))) == 13   # a short last


@pytest.mark.parametrize("rate", [1.5, 9, 0.3, 1 / 65, 0])
def test_slots_refuse_a_rate_the_barrier_cannot_keep(rate):
    with pytest.raises(ValueError, match=r"algo.rate_com = .* is not allowed; expected a whole "
                                         r"number 1..8 or 1/m with m a whole number 2..64"):
        Slots.of(rate)


class _Wire:
    """A transport for a fixed event order: send then recv, in one thread."""

    def __init__(self, rank: int, boxes: dict):
        self.rank, self.boxes = rank, boxes

    def send(self, peer, label, kind, tensor):
        self.boxes[(peer, self.rank, label)] = tensor

    def recv(self, peer, label, kind):
        return self.boxes.pop((self.rank, peer, label))


def _replay(events, xs, updates, momentum: bool):
    """Apply ('step', i, t) and ('pair', i, j, t) events to A2CiD2 workers; returns their x."""
    boxes: dict = {}
    topo = Topology("ring", len(xs))
    algos = [A2CiD2(i, _Wire(i, boxes), topo, momentum=momentum) for i in range(len(xs))]
    thetas = [x.clone() for x in xs]
    for a, th in zip(algos, thetas, strict=True):
        a.begin(th)
    steps = [0] * len(xs)
    for label, ev in enumerate(events, start=1):
        if ev[0] == "step":
            _, i, t = ev
            algos[i].before_step(thetas[i], t)
            thetas[i].add_(updates[i][steps[i]])   # an optimizer's update
            algos[i].took_step(thetas[i])
            steps[i] += 1
        else:
            _, i, j, t = ev
            algos[i].send_half(j, label, thetas[i], t)
            algos[j].send_half(i, label, thetas[j], t)
            algos[i].mix(thetas[i], algos[i].take(j, label), t)
            algos[j].mix(thetas[j], algos[j].take(i, label), t)
    _replay.algos = algos   # for tests of x~
    return thetas


def _events(n: int, count: int, seed: int):
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += float(rng.exponential(0.3))
        if rng.random() < 0.5:
            out.append(("step", int(rng.integers(n)), t))
        else:
            i = int(rng.integers(n))
            out.append(("pair", i, (i + 1) % n, t))
    return out


def _plain_gossip(events, xs, updates):
    """Asynchronous pairwise gossip written directly: a step adds its update, a pair averages."""
    xs = [x.clone() for x in xs]
    steps = [0] * len(xs)
    for ev in events:
        if ev[0] == "step":
            xs[ev[1]] += updates[ev[1]][steps[ev[1]]]
            steps[ev[1]] += 1
        else:
            mean = (xs[ev[1]] + xs[ev[2]]) / 2
            xs[ev[1]], xs[ev[2]] = mean.clone(), mean.clone()
    return xs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_momentum_it_is_plain_asynchronous_pairwise_gossip(seed):
    n = 6
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(32, generator=gen) for _ in range(n)]
    updates = [[torch.randn(32, generator=gen) * 0.1 for _ in range(60)] for _ in range(n)]
    events = _events(n, 120, seed)
    got = _replay(events, xs, updates, momentum=False)
    want = _plain_gossip(events, xs, updates)
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-6)
    # with the momentum on, the same events give other iterates (the identity is not vacuous)
    on = _replay(events, xs, updates, momentum=True)
    assert max(float((a - b).abs().max()) for a, b in zip(on, want, strict=True)) > 1e-3


def test_communication_and_the_ode_keep_the_sum_of_x_and_x_tilde():
    # a pair keeps x_i + x_j and moves x~ by +-alpha~ (x_j - x_i); the ODE keeps x + x~: so the
    # sum over workers of x + x~ only changes with gradient steps (the mean's dynamics)
    n = 4
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(16, dtype=torch.float64, generator=gen) for _ in range(n)]
    events = [("pair", 0, 1, 0.5), ("pair", 1, 2, 1.5), ("pair", 3, 0, 2.0), ("pair", 2, 3, 4.0)]
    out = _replay(events, xs, [[]] * n, momentum=True)
    tildes = [a.x_tilde for a in _replay.algos]
    assert torch.allclose(sum(out) + sum(tildes), 2 * sum(xs), atol=1e-9)
    assert not torch.allclose(tildes[0], out[0], atol=1e-3)   # x~ really moved apart from x


# ---------------------------------------------------------------- the pairer

def _drive(pairer: Pairer, n: int, steps: int, seed: int) -> list[tuple[int, int | None]]:
    """Workers finish steps in a random order; an exchange frees both sides. Returns pairs."""
    rng = np.random.default_rng(seed)
    done, busy, pairs = [0] * n, set(range(n)), []
    while busy:
        w = int(rng.choice(sorted(busy)))
        busy.discard(w)
        got = pairer.ready(w)
        for p in got:
            pairs.append((p.worker, p.peer))
            done[p.worker] += 1
            if done[p.worker] < steps:
                busy.add(p.worker)
            else:
                for q in pairer.finished(p.worker):
                    pairs.append((q.worker, q.peer))
                    done[q.worker] += 1
                    if done[q.worker] < steps:
                        busy.add(q.worker)
                    else:
                        pairer.finished(q.worker)
    assert done == [steps] * n and not pairer.waiting
    return pairs


@pytest.mark.parametrize("seed", range(5))
def test_pairer_pairs_only_neighbours_and_every_worker_takes_every_step(seed):
    topo = Topology("ring", 8)
    pairer = Pairer(8, topo.possible_edges, seed)
    pairs = _drive(pairer, 8, 20, seed)
    for a, b in pairs:
        assert b is None or (min(a, b), max(a, b)) in topo.possible_edges
    rec = pairer.record()
    assert rec["requests"] == [20] * 8
    assert sum(rec["pairings"].values()) == rec["exchanges"]
    assert 2 * rec["exchanges"] + sum(rec["unpaired"]) == 8 * 20


def test_pairer_waits_for_a_free_neighbour_and_labels_in_order():
    p = Pairer(3, {(0, 1), (1, 2)}, 0)
    assert p.ready(0) == []                   # 1 is busy: 0 waits
    assert p.ready(2) == []                   # 2's only neighbour is busy too
    got = p.ready(1)
    assert [(q.worker, q.peer) for q in got] in ([(1, 0), (0, 1)], [(1, 2), (2, 1)])
    assert got[0].label == got[1].label == 1
    with pytest.raises(ValueError):
        p.ready(0 if got[0].peer == 2 else 2)   # still waiting: ready twice is refused


def test_pairer_refuses_a_request_out_of_order():
    p = Pairer(2, {(0, 1)}, 0)
    assert p.ready(0, request=0) == []
    assert len(p.ready(1, request=0)) == 2
    with pytest.raises(ValueError, match="says request 2; it has made 1"):
        p.ready(0, request=2)


def test_a_worker_whose_neighbours_finished_goes_on_alone():
    p = Pairer(3, {(0, 1), (1, 2)}, 0)
    assert p.ready(0) == []
    assert [(q.worker, q.peer) for q in p.finished(1)] == [(0, None)]
    assert [(q.worker, q.peer) for q in p.ready(2)] == [(2, None)]
    assert p.record()["unpaired"] == [1, 0, 1]


def test_pairer_is_deterministic_for_a_seed():
    topo = Topology("expander", 8, degree=3, seed=1)
    a = _drive(Pairer(8, topo.possible_edges, 4), 8, 10, 4)
    b = _drive(Pairer(8, topo.possible_edges, 4), 8, 10, 4)
    assert a == b and math.isfinite(len(a))


def test_an_update_that_lands_during_the_transfer_is_kept_whole():
    # the gradient lane's update u lands on x_0 between the send and the mix: the pair's sum
    # ends as x_0 + x_1 + u (the authors' (x + x_j) / 2 with the live x would keep u / 2)
    boxes: dict = {}
    topo = Topology("ring", 2)
    algos = [A2CiD2(i, _Wire(i, boxes), topo, momentum=False) for i in range(2)]
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(8, dtype=torch.float64, generator=gen) for _ in range(2)]
    u = torch.randn(8, dtype=torch.float64, generator=gen)
    thetas = [x.clone() for x in xs]
    for a, th in zip(algos, thetas, strict=True):
        a.begin(th)
    algos[0].send_half(1, 1, thetas[0], 0.0)
    algos[1].send_half(0, 1, thetas[1], 0.0)
    thetas[0].add_(u)
    algos[0].mix(thetas[0], algos[0].take(1, 1), 0.5)
    algos[1].mix(thetas[1], algos[1].take(0, 1), 0.5)
    assert torch.allclose(thetas[0] + thetas[1], xs[0] + xs[1] + u, atol=1e-12)
    assert torch.allclose(thetas[0] - thetas[1], u, atol=1e-12)   # averaged, then u on top
