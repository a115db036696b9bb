"""The consensus surrogate (experiments/consensus.py): its rates against W's spectrum, its outer
steps against the real algorithms', its mixing against the dense W, and the command.

Everything is small (at most 64 workers, d = 4..8, a few hundred rounds of N x d tensors), so
the file runs in a few seconds. The spectral predictions are checked against closed forms
(circulant graphs) or numpy's eigensolver on the dense W, not against the surrogate.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from test_algorithms import on_hub

from gasloc_emu import config as C
from gasloc_emu.algorithms import DiLoCo, GASLoC
from gasloc_emu.commands.cli import main
from gasloc_emu.experiments.consensus import (
    ConsensusRun,
    Mixing,
    Quadratics,
    Surrogate,
    consensus_distance,
    measured_rate,
    run_consensus,
)
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.memory import Hub
from gasloc_emu.topology import Family, LivingGraph, Topology, TopologyError


def plan_of(**sets):
    cfg = C.resolve(None, {"surrogate.dim": 4, "surrogate.rows": 8, **sets})
    return build_plan(cfg, data=False)


def gossip_plan(topology: str, n: int, rounds: int, gamma: float = 0.0, **sets):
    """Pure gossip of random starts: outer lr 0 discards the inner phase."""
    return plan_of(**{"workers": n, "topology.name": topology, "algo.outer_lr": 0.0,
                      "algo.momentum": gamma, "algo.local_steps": 1, "run.rounds": rounds,
                      "surrogate.init_spread": 1.0, **sets})


def circulant_slem(topo: Topology) -> float:
    """Second-largest eigenvalue modulus of a circulant W from its first row: the eigenvalues
    are sum_j W[0, j] cos(2 pi k j / n) (a circulant's DFT; W is symmetric)."""
    own, off = topo.row(0, 0)
    n = topo.n
    mus = [own + sum(w * math.cos(2 * math.pi * k * j / n) for j, w in off.items())
           for k in range(1, n)]
    return max(abs(m) for m in mus)


# ---------------------------------------------------------------- rates against the spectrum

@pytest.mark.parametrize("topology,n,rounds", [
    ("ring", 16, 300), ("ring", 32, 400), ("exponential", 16, 120), ("exponential", 64, 120)])
def test_plain_gossip_contracts_by_lambda2_squared_on_circulant_graphs(topology, n, rounds):
    """(1/N) sum |x_i - xbar|^2 shrinks by lambda_2^2 per round, lambda_2 from the circulant
    closed form (ring: 1 - (2/3)(1 - cos(2 pi / N)) with Metropolis weights 1/3)."""
    plan = gossip_plan(topology, n, rounds)
    lam = circulant_slem(plan.topology)
    if topology == "ring":
        assert lam == pytest.approx(1 - 2 / 3 * (1 - math.cos(2 * math.pi / n)), abs=1e-12)
    res = run_consensus(plan)
    assert res.predicted_rate == pytest.approx(lam ** 2, rel=1e-9)
    assert res.measured_rate == pytest.approx(lam ** 2, rel=1e-3)


class Hypercube(Family):
    """The d-cube on N = 2^d workers (i ~ i xor 2^k), brought as a plugin family
    (``topology.name = test_consensus:Hypercube``): the surrogate takes any graph the
    registry loads."""

    name = "hypercube"

    def edges(self, topo: Topology) -> set[tuple[int, int]]:
        d = topo.n.bit_length() - 1
        if 1 << d != topo.n:
            raise TopologyError(f"a hypercube needs N = 2^d; got N = {topo.n}")
        return {(i, i ^ (1 << k)) for i in range(topo.n) for k in range(d) if i < i ^ (1 << k)}


@pytest.mark.parametrize("n", [16, 64, 256])
def test_plain_gossip_contracts_by_lambda2_squared_on_hypercubes(n):
    """The d-cube's Laplacian has eigenvalues 2k (k = 0..d); with weights 1/(d + 1) W's are
    1 - 2k/(d + 1), whose second-largest modulus is (d - 1)/(d + 1), at both ends."""
    d = n.bit_length() - 1
    res = run_consensus(gossip_plan("test_consensus:Hypercube", n, 120))
    lam = (d - 1) / (d + 1)
    assert res.lambda2 == pytest.approx(lam, rel=1e-9)
    assert res.measured_rate == pytest.approx(lam ** 2, rel=1e-3)


@pytest.mark.parametrize("n,degree", [(32, 4), (64, 3)])
def test_plain_gossip_contracts_by_lambda2_squared_on_expanders(n, degree):
    """Random regular graphs: lambda_2 from numpy's eigensolver on the dense W."""
    plan = gossip_plan("expander", n, 400, **{"topology.degree": degree})
    eig = np.sort(np.abs(np.linalg.eigvalsh(plan.topology.mixing_matrix(0))))
    res = run_consensus(plan)
    assert res.lambda2 == pytest.approx(eig[-2], rel=1e-9)
    assert res.measured_rate == pytest.approx(eig[-2] ** 2, rel=1e-3)


@pytest.mark.parametrize("alpha", [1.0, 0.75])
def test_outer_momentum_contracts_by_the_heavy_ball_root(alpha):
    """Gossip with momentum gamma: the slowest root of r^2 - mu (1 + gamma) r + mu gamma over
    W's eigenvalues mu < 1, squared; here it accelerates the 32-ring (alpha 1: the root of
    mu = -1/3 is not the slowest; 0.75: W has no negative eigenvalue)."""
    gamma = 0.5
    plan = gossip_plan("ring", 32, 300, gamma, **{"algo.alpha": alpha})
    mus = np.linalg.eigvalsh(plan.topology.mixing_matrix(0))[:-1]
    roots = [abs(np.roots([1.0, -m * (1 + gamma), m * gamma])).max() for m in mus]
    slowest = max(roots)
    res = run_consensus(plan)
    assert res.predicted_rate == pytest.approx(slowest ** 2, rel=1e-9)
    assert res.measured_rate == pytest.approx(slowest ** 2, rel=2e-3)
    plain = run_consensus(gossip_plan("ring", 32, 300, 0.0, **{"algo.alpha": alpha}))
    assert res.measured_rate < plain.measured_rate - 0.005


def test_no_rate_is_predicted_where_theory_gives_none():
    """Local steps with heterogeneous optima hold the workers apart (a floor, not a rate);
    random matchings change W every round; DiLoCo leaves no disagreement after its step."""
    local = run_consensus(plan_of(workers=8, **{"topology.name": "ring", "run.rounds": 5}))
    matched = run_consensus(gossip_plan("matching", 8, 5))
    diloco = run_consensus(plan_of(workers=8, **{"algo.name": "diloco", "run.rounds": 5}))
    assert (local.predicted_rate, matched.predicted_rate, diloco.predicted_rate) == (None,) * 3
    assert local.consensus[-1] > 1e-4 and diloco.consensus[1:] == [0.0] * 5


@pytest.mark.parametrize("ratio", [0.5, 0.9, 0.999])
def test_measured_rate_of_a_geometric_series(ratio):
    series = [3.0 * ratio ** t for t in range(60)]
    assert measured_rate(series) == pytest.approx(ratio, rel=1e-12)


def test_measured_rate_stops_at_the_rounding_floor():
    """After the distance reached rounding level its ratios are noise: fitted before."""
    series = [0.5 ** t for t in range(100)] + [1e-40, 3e-40, 1e-40] * 30
    assert measured_rate(series) == pytest.approx(0.5, rel=1e-12)
    assert measured_rate([0.0] * 10) is None and measured_rate([1.0, 0.5]) is None


# ---------------------------------------------------------------- the real algorithms' steps

def real_rounds(sur: Surrogate, make_algo, rounds: int) -> list[torch.Tensor]:
    """The real algorithm on one thread per worker over the in-memory transport, with the
    surrogate's quadratics, start, step size and H_i: the stack after every round."""
    q, n, lr = sur.q, sur.cfg.workers, sur.cfg.surrogate.lr
    hist = [[None] * rounds for _ in range(n)]
    start = sur.x.clone()

    def body(rank: int, tp) -> None:
        algo = make_algo(rank, tp)
        theta = start[rank].clone()
        algo.begin(theta)
        for t in range(rounds):
            for _ in range(sur.steps[rank]):
                theta.sub_(q.hess[rank] @ theta - q.lin[rank], alpha=lr)
            algo.outer_step(t, theta)
            hist[rank][t] = theta.clone()

    on_hub(Hub(n, timeout_s=60.0), body)
    return [torch.stack([hist[r][t] for r in range(n)]) for t in range(rounds)]


def surrogate_rounds(sur: Surrogate, rounds: int) -> list[torch.Tensor]:
    out = []
    for t in range(rounds):
        sur.round(t)
        out.append(sur.x.clone())
    return out


@pytest.mark.parametrize("topology,eta,gamma,steps", [
    ("ring", 0.7, 0.5, 3), ("matching", 0.4, 0.9, [1, 2, 3, 1, 4, 2]),
    ("expander", 1.0, 0.0, 2)])
def test_the_surrogate_takes_gaslocs_outer_step(topology, eta, gamma, steps):
    """Six GASLoC workers over the in-memory transport and the surrogate's stack agree to
    rounding for 6 rounds (eta 1, gamma 0 is dsgd / local-gossip)."""
    plan = plan_of(workers=6, **{"topology.name": topology, "topology.degree": 3,
                                 "algo.outer_lr": eta, "algo.momentum": gamma,
                                 "algo.local_steps": steps, "surrogate.init_spread": 1.0})
    sur = Surrogate(plan)
    real = real_rounds(sur, lambda r, tp: GASLoC(r, tp, plan.topology, eta, gamma), 6)
    for t, x in enumerate(surrogate_rounds(sur, 6)):
        torch.testing.assert_close(x, real[t], rtol=1e-12, atol=1e-12, msg=f"round {t}")


@pytest.mark.parametrize("name", ["dsgd", "local-gossip"])
def test_plain_gossip_is_gasloc_with_eta_1_and_gamma_0(name):
    """dsgd and local-gossip take GASLoC's rule at eta = 1, gamma = 0 (docs/ALGORITHM.md)."""
    sets = {"workers": 8, "topology.name": "ring", "algo.local_steps": 1, "run.rounds": 6}
    plain = run_consensus(plan_of(**{**sets, "algo.name": name}))
    gasloc = run_consensus(plan_of(**{**sets, "algo.outer_lr": 1.0, "algo.momentum": 0.0}))
    assert (plain.eta, plain.gamma) == (1.0, 0.0)
    assert plain.consensus == gasloc.consensus and plain.loss_gap == gasloc.loss_gap


def test_a_seed_repeats_and_gradient_noise_moves_the_run():
    sets = {"workers": 8, "topology.name": "expander", "topology.degree": 3, "run.rounds": 5}
    one, two = (run_consensus(plan_of(**sets)) for _ in range(2))
    noisy = run_consensus(plan_of(**sets, **{"surrogate.grad_noise": 0.5}))
    assert one.consensus == two.consensus and one.worker_gap == two.worker_gap
    assert noisy.consensus[-1] != pytest.approx(one.consensus[-1], rel=1e-3)


@pytest.mark.parametrize("mean", ["plain", "steps"])
def test_the_surrogate_takes_dilocos_outer_step(mean):
    """DiLoCo's All-Reduce and Nesterov step, with unequal H_i (and weights n H_i / sum H)."""
    steps = [1, 3, 2, 4]
    plan = plan_of(workers=4, **{"algo.name": "diloco", "algo.local_steps": steps,
                                 "algo.pseudo_grad_mean": mean, "algo.outer_lr": 0.8,
                                 "algo.momentum": 0.6})
    weight = [len(steps) * h / sum(steps) if mean == "steps" else 1.0 for h in steps]
    sur = Surrogate(plan)
    real = real_rounds(sur, lambda r, tp: DiLoCo(r, tp, 0.8, 0.6, weight[r]), 5)
    for t, x in enumerate(surrogate_rounds(sur, 5)):
        torch.testing.assert_close(x, real[t], rtol=1e-12, atol=1e-12, msg=f"round {t}")


# ---------------------------------------------------------------- mixing and the problem

@pytest.mark.parametrize("topology,n", [("ring", 9), ("exponential", 12), ("expander", 10),
                                        ("matching", 10), ("torus", 12), ("complete", 7)])
def test_the_neighbour_table_is_w(topology, n):
    topo = Topology(topology, n, 3 if topology == "expander" else 4, seed=2)
    z = torch.randn(n, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for t in range(3):
        w = torch.from_numpy(topo.mixing_matrix(t))
        torch.testing.assert_close(Mixing.of(topo, t).apply(z), w @ z, rtol=1e-13, atol=1e-13)


def test_the_neighbour_table_pads_uneven_degrees():
    """Workers 2 and 5 gone from a 4-regular expander: degrees differ, the dead rows are I."""
    full = Topology("expander", 10, 4, seed=1, alpha=0.7)
    living = LivingGraph(full, lambda t: {0, 1, 3, 4, 6, 7, 8, 9})
    z = torch.randn(10, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = torch.from_numpy(living.mixing_matrix(0))
    torch.testing.assert_close(Mixing.of(living, 0).apply(z), w @ z, rtol=1e-13, atol=1e-13)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 12), het=st.floats(0.0, 5.0))
def test_the_loss_gaps_are_those_of_the_mean_objective(seed, n, het):
    """f(xbar) - f* >= 0, zero at x*; the workers' mean gap adds half their spread in H."""
    gen = torch.Generator().manual_seed(seed)
    q = Quadratics.draw(n, 3, 6, het, gen)
    x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    direct = [float((0.5 * xi @ q.hess @ xi - q.lin @ xi + q.const).mean()) - q.f_star
              for xi in x]
    at_mean, workers = q.gaps(x)
    assert at_mean >= -1e-9 and workers >= at_mean - 1e-9
    assert workers == pytest.approx(sum(direct) / n, rel=1e-9, abs=1e-9)
    assert q.gaps(q.x_star.expand(n, 3))[0] == pytest.approx(0.0, abs=1e-9)
    assert consensus_distance(q.x_star.expand(n, 3)) == pytest.approx(0.0, abs=1e-30)
    assert consensus_distance(x) == pytest.approx(
        float(sum((xi - x.mean(0)) @ (xi - x.mean(0)) for xi in x)) / n, rel=1e-12)


# ---------------------------------------------------------------- the command

def test_the_command_prints_rates_and_writes_json_and_csv(tmp_path):
    out, rows = tmp_path / "c.json", tmp_path / "c.csv"
    result = CliRunner().invoke(main, [
        "consensus", "-n", "16", "--topology", "ring", "--outer-lr", "0", "--momentum", "0",
        "-R", "20", "-H", "1", "--init-spread", "1", "--dim", "4", "--out", str(out),
        "--csv", str(rows)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    res = ConsensusRun.from_json(out.read_text())
    assert res.workers == 16 and len(res.consensus) == 21 and res.settings["dim"] == 4
    assert f"{res.predicted_rate:.6f}" in result.output
    lines = rows.read_text().splitlines()
    assert lines[0] == "round,consensus,loss_gap,worker_gap" and len(lines) == 22
    bad = dict(json.loads(out.read_text()), version=99)
    with pytest.raises(ValueError, match="version 99"):
        ConsensusRun.from_json(json.dumps(bad))


def test_a_diverging_run_exits_3_with_its_growth_measured(tmp_path):
    """gamma = 0.9 past the 16-worker expander's stability edge: the predicted growth per round
    is measured until the distance overflows, and the command says where (exit 3)."""
    out = tmp_path / "c.json"
    result = CliRunner().invoke(main, [
        "consensus", "-n", "16", "--topology", "expander", "--outer-lr", "0", "--momentum",
        "0.9", "-R", "4000", "-H", "1", "--init-spread", "1", "--dim", "4", "--out", str(out)])
    assert result.exit_code == 3 and "diverged" in result.stderr
    res = ConsensusRun.from_json(out.read_text())
    assert res.predicted_rate > 1.0
    assert res.measured_rate == pytest.approx(res.predicted_rate, rel=1e-3)


@pytest.mark.parametrize("args,needle", [
    (["--algo", "a2cid2"], "a2cid2"), (["--dim", "0"], "surrogate.dim"),
    (["-n", "4096", "--algo", "diloco", "--dim", "1024", "--set", "surrogate.rows=1"],
     "too large"),
    (["--set", "algo.overlap=1", "--set", "algo.alpha=0.5"], "not modelled"),
    (["--set", "comm.codec=int8"], "comm.codec")])
def test_the_command_refuses_what_it_does_not_model_in_one_line(args, needle):
    result = CliRunner().invoke(main, ["consensus", "-n", "4", *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert "round" not in result.stdout
