"""The outer algorithms driven directly, on flat float64 vectors, over the in-memory transport.

Every worker is a thread with its own ``InMemoryTransport`` on one ``Hub``; like the simulator, a
thread holds the hub's turn lock while it computes and gives it up only inside ``recv``. The inner
phase is a fake: H gradient steps on a per-worker quadratic f_i(x) = 1/2 (x - c_i)^T D_i (x - c_i).
The special cases of docs/ALGORITHM.md ("Special cases") are checked on these exact iterates.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from gasloc_emu.algorithms import DSGD, DiLoCo, GASLoC, PlainGossip
from gasloc_emu.simulator.memory import Hub
from gasloc_emu.topology import Topology

DIM = 24


# ---------------------------------------------------------------- harness

def quadratic_inner(n: int, seed: int = 0, lr: float = 0.1):
    """Per-worker H gradient steps on f_i(x) = 1/2 (x - c_i)^T diag(d_i) (x - c_i), in place."""
    g = torch.Generator().manual_seed(seed)
    centres = [torch.randn(DIM, generator=g, dtype=torch.float64) for _ in range(n)]
    curv = [0.5 + torch.rand(DIM, generator=g, dtype=torch.float64) for _ in range(n)]

    def inner(rank: int, theta: torch.Tensor, steps: int) -> None:
        for _ in range(steps):
            theta.sub_(lr * curv[rank] * (theta - centres[rank]))
    return inner


def run_threads(n: int, make_algo, rounds: int, inner=None, steps: int | list[int] = 5,
                theta0: list[torch.Tensor] | None = None) -> list[list[torch.Tensor]]:
    """Run ``rounds`` outer rounds on ``n`` worker threads; return history[rank][t] (after round t).

    history[rank][0] is the starting point, so history[rank][t + 1] is theta after round t.
    """
    hub = Hub(n, timeout_s=60.0)
    if theta0 is None:
        theta0 = [torch.zeros(DIM, dtype=torch.float64) for _ in range(n)]
    hist: list[list[torch.Tensor]] = [[] for _ in range(n)]
    per_worker = steps if isinstance(steps, list) else [steps] * n

    def loop(rank: int, tp) -> None:
        algo = make_algo(rank, tp)
        theta = theta0[rank].clone()
        algo.begin(theta)
        hist[rank].append(theta.clone())
        for t in range(rounds):
            if inner is not None:
                inner(rank, theta, per_worker[rank])
            algo.outer_step(t, theta)
            hist[rank].append(theta.clone())

    on_hub(hub, loop)
    assert all(len(h) == rounds + 1 for h in hist), "a worker thread did not finish"
    return hist


def on_hub(hub: Hub, body, timeout_s: float = 120.0) -> None:
    """Run ``body(rank, transport)`` on one thread per worker, taking turns as the simulator does;
    the first failure stops every thread and is raised here."""
    def loop(rank: int) -> None:
        try:
            with hub.cond:  # the simulator's turn lock: one worker computes at a time
                body(rank, hub.transport(rank))
        except BaseException as exc:  # noqa: BLE001 - stop the other threads too
            hub.abort(exc)

    threads = [threading.Thread(target=loop, args=(r,), daemon=True) for r in range(hub.world_size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout_s)
    if hub.error is not None:
        raise hub.error


def consensus_error(thetas: list[torch.Tensor]) -> float:
    """RMS over workers of the distance to the average."""
    stack = torch.stack(thetas)
    return float((stack - stack.mean(0)).pow(2).sum(1).mean().sqrt())


def random_starts(n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(DIM, generator=g, dtype=torch.float64) for _ in range(n)]


# ---------------------------------------------------------------- transport the algorithms rely on

@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_all_reduce_mean_is_the_exact_mean_on_every_worker(n):
    """DiLoCo's All-Reduce: every worker gets the same tensor, equal to the mean of the inputs."""
    inputs = random_starts(n, seed=7)
    hub = Hub(n, timeout_s=60.0)
    out: dict[int, torch.Tensor] = {}

    def loop(rank: int, tp) -> None:
        res = tp.all_reduce_mean(0, inputs[rank].clone())
        out[rank] = res.clone()  # snapshot at return, as the caller sees it
        # the caller goes on computing (a new inner phase) before the others finish
        tp.advance(0.0)

    on_hub(hub, loop, 60.0)
    expected = torch.stack(inputs).mean(0)
    for r in range(n):
        assert torch.equal(out[r], out[0]), f"worker {r} got a different All-Reduce result"
        torch.testing.assert_close(out[r], expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- special cases (docs/ALGORITHM.md)

@pytest.mark.parametrize("n,eta,gamma", [(4, 0.7, 0.9), (3, 1.0, 0.5), (5, 0.3, 0.0)])
def test_gasloc_on_complete_graph_equals_diloco_nesterov(n, eta, gamma):
    """Complete graph, W = 11^T/n, eta = lr, gamma = mu: DiLoCo's iterates to float precision."""
    rounds = 60
    topo = Topology("complete", n)
    assert np.allclose(topo.mixing_matrix(), np.full((n, n), 1.0 / n), atol=1e-15)
    starts = [torch.zeros(DIM, dtype=torch.float64)] * n  # a common init, as from a shared seed
    g_hist = run_threads(n, lambda r, tp: GASLoC(r, tp, topo, eta, gamma), rounds,
                         quadratic_inner(n), steps=5, theta0=starts)
    d_hist = run_threads(n, lambda r, tp: DiLoCo(r, tp, eta, gamma), rounds,
                         quadratic_inner(n), steps=5, theta0=starts)
    scale = max(float(d_hist[0][t].abs().max()) for t in range(rounds + 1))
    assert scale > 0.1  # the iterates really moved
    for t in range(rounds + 1):
        for r in range(n):
            assert torch.equal(d_hist[r][t], d_hist[0][t]), \
                f"DiLoCo workers disagree after round {t - 1} (worker {r})"
            err = float((g_hist[r][t] - d_hist[r][t]).abs().max())
            assert err <= 1e-12 * scale, f"round {t - 1}, worker {r}: |gasloc - diloco| = {err:.3e}"


def test_diloco_outer_step_is_torch_sgd_nesterov():
    """The outer step is torch.optim.SGD(lr, momentum, nesterov=True) on the averaged drift."""
    n, rounds, lr, mu = 4, 15, 0.7, 0.9
    inner = quadratic_inner(n, seed=3)
    hist = run_threads(n, lambda r, tp: DiLoCo(r, tp, lr, mu), rounds, inner, steps=4)
    # reference: torch's own optimizer, pseudo-gradient = mean_i (theta - theta_i^+)
    p = torch.nn.Parameter(torch.zeros(DIM, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=lr, momentum=mu, nesterov=True)
    for t in range(rounds):
        outs = []
        for r in range(n):
            th = p.detach().clone()
            inner(r, th, 4)
            outs.append(th)
        p.grad = torch.stack([p.detach() - o for o in outs]).mean(0)
        opt.step()
        torch.testing.assert_close(hist[0][t + 1], p.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("topo_name", ["ring", "exponential", "matching"])
def test_gasloc_eta1_gamma0_equals_plain_gossip_bit_for_bit(topo_name):
    """eta = 1, gamma = 0: local gossip (H > 1) and DSGD (H = 1), identical bits."""
    n, rounds = 6, 25
    topo = Topology(topo_name, n, seed=5)
    starts = random_starts(n, seed=4)
    for steps, cls in ((5, PlainGossip), (1, DSGD)):
        ref = run_threads(n, lambda r, tp, cls=cls: cls(r, tp, topo), rounds, quadratic_inner(n),
                          steps, starts)
        got = run_threads(n, lambda r, tp: GASLoC(r, tp, topo, 1.0, 0.0), rounds,
                          quadratic_inner(n), steps, starts)
        for r in range(n):
            for t in range(rounds + 1):
                assert torch.equal(got[r][t], ref[r][t]), f"H={steps} worker {r} round {t - 1}"
        assert consensus_error([ref[r][-1] for r in range(n)]) > 0  # not trivially in consensus


def test_plain_gossip_applies_the_mixing_matrix():
    """One gossip round with no gradients is exactly theta <- W theta."""
    n = 8
    topo = Topology("ring", n)
    starts = random_starts(n, seed=11)
    hist = run_threads(n, lambda r, tp: PlainGossip(r, tp, topo), 1, None, 0, starts)
    w = torch.from_numpy(topo.mixing_matrix(0))
    expected = w @ torch.stack(starts)
    for r in range(n):
        torch.testing.assert_close(hist[r][1], expected[r], rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("eta", [0.0, 0.7])
def test_gasloc_round_matches_the_written_update(eta):
    """theta_i <- sum_j W_ij z_j with z = y + gamma (y - y_prev), y = theta + eta g (two rounds)."""
    n, gamma, steps = 6, 0.6, 3
    topo = Topology("ring", n)
    inner = quadratic_inner(n, seed=9)
    starts = random_starts(n, seed=10)
    hist = run_threads(n, lambda r, tp: GASLoC(r, tp, topo, eta, gamma), 2, inner, steps, starts)
    w = torch.from_numpy(topo.mixing_matrix(0))
    theta = torch.stack(starts)
    y_prev = theta.clone()
    for t in range(2):
        plus = theta.clone()
        for r in range(n):
            inner(r, plus[r], steps)
        y = theta + eta * (plus - theta)
        z = y + gamma * (y - y_prev)
        y_prev = y
        theta = w @ z
        for r in range(n):
            torch.testing.assert_close(hist[r][t + 1], theta[r], rtol=1e-12, atol=1e-12)


def test_accelerated_gossip_on_32_ring():
    """eta = 0 (no gradients): gamma* reaches a consensus error >= 1000x below gamma = 0 in
    200 rounds."""
    n, rounds = 32, 200
    topo = Topology("ring", n)
    gstar = topo.gamma_star
    assert 0.7 < gstar < 0.9
    starts = random_starts(n, seed=2)
    mean0 = torch.stack(starts).mean(0)
    errors = {}
    for gamma in (0.0, gstar):
        hist = run_threads(n, lambda r, tp, gamma=gamma: GASLoC(r, tp, topo, 0.0, gamma), rounds,
                           None, 0, starts)
        final = [hist[r][-1] for r in range(n)]
        errors[gamma] = consensus_error(final)
        # averaging: the mean is preserved, the workers go towards it
        torch.testing.assert_close(torch.stack(final).mean(0), mean0, rtol=0, atol=1e-12)
    # eta = 0 ignores the inner phase entirely: with gradients the iterates are the same bits
    with_grads = run_threads(n, lambda r, tp: GASLoC(r, tp, topo, 0.0, gstar), 20,
                             quadratic_inner(n), 3, starts)
    no_grads = run_threads(n, lambda r, tp: GASLoC(r, tp, topo, 0.0, gstar), 20, None, 0, starts)
    for r in range(n):
        assert torch.equal(with_grads[r][-1], no_grads[r][-1])
    e0 = consensus_error(starts)
    assert errors[0.0] < e0  # plain gossip does progress...
    assert errors[0.0] > 1e-3 * e0  # ...but slowly on a 32-ring (lambda2 = 0.987)
    assert errors[gstar] < errors[0.0] / 1000, errors
    assert errors[gstar] < 1e-6 * e0, errors


def test_per_worker_local_steps_on_complete_graph_keep_consensus():
    """Per-worker H (one worker does none): exact averaging keeps every worker on the same point."""
    n = 4
    topo = Topology("complete", n)
    hist = run_threads(n, lambda r, tp: GASLoC(r, tp, topo, 0.7, 0.9), 20, quadratic_inner(n),
                       steps=[5, 5, 1, 0])
    for r in range(n):
        assert torch.isfinite(hist[r][-1]).all()
    # on the complete graph everyone agrees (to rounding) whatever each worker's H
    assert consensus_error([hist[r][-1] for r in range(n)]) < 1e-12


def test_state_bytes_counts_model_sized_buffers():
    """GASLoC keeps theta's anchor and y_prev (two buffers), DiLoCo anchor + momentum, gossip
    none."""
    n = 2
    topo = Topology("ring", n)
    hub = Hub(n)
    theta = torch.zeros(DIM, dtype=torch.float64)
    g = GASLoC(0, hub.transport(0), topo, 0.7, 0.9)
    g.begin(theta)
    assert g.state_bytes() == 2 * DIM * 8
    p = PlainGossip(0, hub.transport(0), topo)
    p.begin(theta)
    assert p.state_bytes() == 0
    d = DiLoCo(0, hub.transport(0), 0.7, 0.9)
    d.begin(theta)
    assert d.state_bytes() == DIM * 8  # the momentum buffer appears after the first round


@pytest.mark.parametrize("name, n, degree", [("expander", 8, 3), ("torus", 8, 4)])
def test_momentum_growth_predicts_divergent_gossip(name, n, degree):
    """The run-time warning's criterion: with growth > 1 pure gossip diverges, with gamma* it
    converges, and the measured per-round growth matches the predicted factor."""
    topo = Topology(name, n, degree)
    assert topo.momentum_growth(0.9) > 1.0 > topo.momentum_growth(topo.gamma_star)
    starts, rounds = random_starts(n, seed=3), 40
    for gamma in (0.9, topo.gamma_star):
        hist = run_threads(n, lambda r, tp, gamma=gamma: GASLoC(r, tp, topo, 0.0, gamma), rounds,
                           None, 0, starts)
        e = [consensus_error([hist[r][t] for r in range(n)]) for t in (20, 40)]
        measured = (e[1] / e[0]) ** (1 / 20)
        assert measured == pytest.approx(topo.momentum_growth(gamma), rel=0.05), (gamma, e)
