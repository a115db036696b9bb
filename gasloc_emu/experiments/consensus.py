"""Consensus at scale without a model: the algorithms' outer rules on per-worker quadratics.

All N workers are one (N, d) float64 tensor. Worker i owns f_i(x) = 1/2 |A_i x - b_i|^2 with
b_i = A_i x_i*, its own optimum x_i* spread ``surrogate.heterogeneity`` around a common centre,
so the workers disagree as data-heterogeneous LLM shards do and the theory's quantities are
exact: the mean objective f = (1/N) sum_i f_i has a closed-form minimiser. A round is H_i
gradient steps on f_i (``surrogate.lr``; Gaussian gradient noise if ``surrogate.grad_noise``),
then the outer step of the configured algorithm, on the whole stack at once:

- gasloc (and dsgd / local-gossip, its eta = 1, gamma = 0 case): ``gasloc.outer_proposal``
  itself, elementwise on the stack, then z mixed with round t's W as a padded neighbour table
  (``Mixing``: N x max-degree entries, never an N x N matrix), self first and peers in
  increasing rank, as ``base.gossip_mix`` sums;
- diloco: ``diloco.nesterov_step`` itself on the one shared anchor with the mean drift.

Measured per round: the consensus distance (1/N) sum_i |x_i - xbar|^2, the gap f(xbar) - f*
of the average, and the gap (1/N) sum_i f(x_i) - f* of the workers' own models.

The theory it is checked against: plain gossip (outer lr 0, so the inner result is discarded
bit for bit) on a fixed W multiplies the disagreement by W each round, so the squared
consensus distance contracts asymptotically by the square of W's second-largest eigenvalue
modulus lambda_2 per round (Boyd, Ghosh, Prabhakar & Shah, "Randomized gossip algorithms",
IEEE Trans. Inf. Theory 2006; Xiao & Boyd, "Fast linear iterations for distributed
averaging", 2004). With outer momentum gamma each eigenvalue mu of W follows
x' = mu ((1 + gamma) x - gamma x_prev), whose slowest root is ``Topology.momentum_growth``
(the heavy ball on gossip; docs/ALGORITHM.md, "gamma*"), so the predicted rate is its square.

Not modelled: overlap (algo.overlap = 1), codecs, scenarios, and a2cid2 (asynchronous events,
not rounds); the command refuses them in one line.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gasloc_emu.algorithms.base import mixing_table
from gasloc_emu.algorithms.diloco import DiLoCo, nesterov_step
from gasloc_emu.algorithms.gasloc import GASLoC, outer_proposal
from gasloc_emu.algorithms.gossip import PlainGossip
from gasloc_emu.algorithms.outer import momentum_value, outer_lr_value
from gasloc_emu.config import ConfigError
from gasloc_emu.plan import RunPlan

VERSION = 1
MAX_ELEMENTS = 1 << 26   # N x max(rows, d) x d (the A_i, then the H_i): 512 MiB of float64
# the measured rate is fitted where the distance is above this share of its start (rounding
# floors it near 1e-32 of the start in float64)
FIT_FLOOR = 1e-24


# ------------------------------------------------------------------------------ the problem

@dataclass(frozen=True)
class Quadratics:
    """f_i(x) = 1/2 x^T H_i x - c_i^T x + e_i (H_i = A_i^T A_i, c_i = A_i^T b_i,
    e_i = 1/2 |b_i|^2), all workers stacked; ``x_star`` and ``f_star`` of their mean."""

    hess: torch.Tensor    # (N, d, d)
    lin: torch.Tensor     # (N, d)
    const: torch.Tensor   # (N,)
    x_star: torch.Tensor  # (d,)
    f_star: float

    @classmethod
    def draw(cls, n: int, dim: int, rows: int, heterogeneity: float,
             gen: torch.Generator) -> Quadratics:
        size = n * max(rows, dim) * dim
        if size > MAX_ELEMENTS:
            raise ConfigError(f"workers x max(surrogate.rows, surrogate.dim) x surrogate.dim = "
                              f"{size} is too large; expected at most {MAX_ELEMENTS}")
        a = torch.randn(n, rows, dim, generator=gen, dtype=torch.float64) / math.sqrt(rows)
        centre = torch.randn(dim, generator=gen, dtype=torch.float64) / math.sqrt(dim)
        own = centre + heterogeneity * torch.randn(n, dim, generator=gen,
                                                   dtype=torch.float64) / math.sqrt(dim)
        b = torch.einsum("nrd,nd->nr", a, own)
        hess = a.transpose(1, 2) @ a
        lin = torch.einsum("nrd,nr->nd", a, b)
        const = 0.5 * b.pow(2).sum(1)
        x_star = torch.linalg.solve(hess.mean(0), lin.mean(0))
        f_star = _mean_loss(hess.mean(0), lin.mean(0), float(const.mean()), x_star)
        return cls(hess, lin, const, x_star, f_star)

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        """Every worker's gradient of its own f_i at its own x_i, (N, d)."""
        return torch.bmm(self.hess, x.unsqueeze(2)).squeeze(2) - self.lin

    def gaps(self, x: torch.Tensor) -> tuple[float, float]:
        """(f(xbar) - f*, (1/N) sum_i f(x_i) - f*) for the mean objective f."""
        h, c, e = self.mean_terms
        xbar = x.mean(0)
        at_mean = _mean_loss(h, c, e, xbar) - self.f_star
        dev = x - xbar
        spread = 0.5 * float(((dev @ h) * dev).sum(1).mean())
        return at_mean, at_mean + spread

    @functools.cached_property
    def mean_terms(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(H, c, e) of the mean objective f."""
        return self.hess.mean(0), self.lin.mean(0), float(self.const.mean())


def _mean_loss(h: torch.Tensor, c: torch.Tensor, e: float, x: torch.Tensor) -> float:
    return float(0.5 * x @ h @ x - c @ x) + e


def consensus_distance(x: torch.Tensor) -> float:
    """(1/N) sum_i |x_i - xbar|^2."""
    return float((x - x.mean(0)).pow(2).sum(1).mean())


# ------------------------------------------------------------------------------ mixing

@dataclass(frozen=True)
class Mixing:
    """One round's W as a padded neighbour table: (Wz)_i = W_ii z_i + sum_k w[i, k] z[nbr[i, k]],
    peers in increasing rank and padding (weight 0) pointing at i itself: round t's edges
    with the Metropolis–Hastings weights the algorithms gossip with (``base.mixing_table``)."""

    self_w: torch.Tensor   # (N, 1)
    nbr: torch.Tensor      # (N, K) int64
    w: torch.Tensor        # (N, K)

    @classmethod
    def of(cls, topo, t: int) -> Mixing:
        return cls(*mixing_table(topo, t))

    def apply(self, z: torch.Tensor) -> torch.Tensor:
        """W z for the stack z (N, d), one peer column at a time: memory N x d, not N x K x d."""
        out = z * self.self_w
        for col in range(self.nbr.shape[1]):
            out.addcmul_(self.w[:, col:col + 1], z[self.nbr[:, col]])
        return out


# ------------------------------------------------------------------------------ outer rules

class GossipRule:
    """GASLoC's outer step on the stack: (y, z) from ``gasloc.outer_proposal``, then z mixed."""

    def __init__(self, eta: float, gamma: float, topo):
        self.eta, self.gamma, self.topo = eta, gamma, topo
        self._fixed = None if topo.time_varying else Mixing.of(topo, 0)

    def begin(self, x: torch.Tensor) -> None:
        self.anchor, self.y_prev = x.clone(), x.clone()

    def step(self, t: int, x_plus: torch.Tensor) -> torch.Tensor:
        y, z = outer_proposal(self.anchor, x_plus, self.y_prev, self.eta, self.gamma)
        self.y_prev = y
        self.anchor = (self._fixed or Mixing.of(self.topo, t)).apply(z)
        return self.anchor.clone()


class MeanRule:
    """DiLoCo's outer step: one shared anchor, ``diloco.nesterov_step`` with the mean of the
    weighted drifts anchor - x_i^+ (the All-Reduce's result)."""

    def __init__(self, lr: float, mu: float, weights: torch.Tensor):
        self.lr, self.mu, self.weights = lr, mu, weights.unsqueeze(1)
        self.buf: torch.Tensor | None = None

    def begin(self, x: torch.Tensor) -> None:
        self.anchor = x.mean(0)

    def step(self, t: int, x_plus: torch.Tensor) -> torch.Tensor:
        delta = ((self.anchor - x_plus) * self.weights).mean(0)
        self.buf = nesterov_step(self.anchor, self.buf, delta, self.lr, self.mu)
        return self.anchor.expand_as(x_plus).clone()


def _gossip(eta_gamma: Callable) -> Callable:
    return lambda plan, steps: GossipRule(*eta_gamma(plan.cfg.algo, plan.topology),
                                          plan.topology)


def _mean(plan: RunPlan, steps: list[int]) -> MeanRule:
    """DiLoCo's weights w_i: 1, or n H_i / sum_j H_j with ``pseudo_grad_mean = steps``."""
    acfg = plan.cfg.algo
    h = torch.tensor(steps, dtype=torch.float64)
    weights = h * len(h) / h.sum() if plan.algo.weights_by_steps(acfg) else torch.ones_like(h)
    return MeanRule(float(acfg.outer_lr), momentum_value(acfg, None), weights)


# The algorithms whose outer step the surrogate runs, by class (a subclass takes its base's
# rule); dsgd and local-gossip are GASLoC with eta = 1, gamma = 0 (docs/ALGORITHM.md).
RULES: tuple[tuple[type, Callable], ...] = (
    (GASLoC, _gossip(lambda a, topo: (outer_lr_value(a, topo), momentum_value(a, topo)))),
    (PlainGossip, _gossip(lambda a, topo: (1.0, 0.0))),
    (DiLoCo, _mean),
)


def rule_for(plan: RunPlan, steps: list[int]):
    """The outer rule of the plan's algorithm on the stack; a ConfigError for what is not
    modelled (overlap, a scenario, a codec, an algorithm without one of ``RULES``)."""
    cfg = plan.cfg
    unmodelled = (("algo.overlap", cfg.algo.overlap, 0),
                  ("run.scenario", cfg.run.scenario, ""),
                  ("net.link_trace", cfg.net.link_trace, ""),
                  ("comm.codec", cfg.comm.codec, "none"))
    for key, value, plain in unmodelled:
        if value != plain:
            raise ConfigError(f"{key} = {value!r} is not modelled by the consensus surrogate; "
                              f"expected {plain!r}")
    for base, make in RULES:
        if issubclass(plan.algo, base):
            return make(plan, steps)
    names = ", ".join(b.name for b, _ in RULES)
    raise ConfigError(f"algo.name = {cfg.algo.name!r} has no consensus surrogate; expected an "
                      f"algorithm built on {names} (dsgd and local-gossip are plain gossip)")


# ------------------------------------------------------------------------------ one run

@dataclass(frozen=True)
class ConsensusRun:
    """One surrogate run: its settings, the spectral prediction, and the per-round series
    (index 0 is the start, index t the state after round t). Written as versioned JSON."""

    version: int
    algorithm: str
    topology: str
    workers: int
    rounds: int
    eta: float                   # the outer lr (DiLoCo's lr)
    gamma: float                 # the outer momentum (DiLoCo's mu)
    local_steps: list[int]
    settings: dict               # the config's surrogate section and seed
    lambda2: float | None        # W's second-largest eigenvalue modulus (fixed graphs)
    predicted_rate: float | None  # per-round factor of the consensus distance, from W's spectrum
    measured_rate: float | None   # the same, fitted on the second half of the rounds
    seconds: float
    consensus: list[float]
    loss_gap: list[float]        # f(xbar) - f*
    worker_gap: list[float]      # (1/N) sum_i f(x_i) - f*

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ConsensusRun:
        data = json.loads(text)
        if data.get("version") != VERSION:
            raise ValueError(f"consensus record version {data.get('version')!r}; expected "
                             f"{VERSION}")
        return cls(**data)

    def write_csv(self, path: Path) -> None:
        """One row per round: round, consensus, loss_gap, worker_gap."""
        with open(path, "w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow(["round", "consensus", "loss_gap", "worker_gap"])
            for t, row in enumerate(zip(self.consensus, self.loss_gap, self.worker_gap,
                                        strict=True)):
                out.writerow([t, *(repr(v) for v in row)])


def inner_phase(q: Quadratics, x: torch.Tensor, steps: list[int], lr: float, noise: float,
                gen: torch.Generator) -> torch.Tensor:
    """x^+: H_i gradient steps on f_i from x_i for every worker (a worker with fewer steps
    stops early), with Gaussian gradient noise of standard deviation ``noise``."""
    x = x.clone()
    h = torch.tensor(steps)
    for k in range(max(steps, default=0)):
        g = q.grad(x)
        if noise:
            g.add_(torch.randn(x.shape, generator=gen, dtype=x.dtype), alpha=noise)
        if k >= min(steps):
            g.mul_((h > k).unsqueeze(1).to(g.dtype))
        x.sub_(g, alpha=lr)
    return x


class Surrogate:
    """The run's state: the quadratics, the workers' stack ``x`` and the outer rule; ``round``
    advances one round. Everything random comes from ``cfg.seed``; H_i are the plan's (the
    compute model's, which a nominal time budget may make unequal)."""

    def __init__(self, plan: RunPlan):
        cfg = plan.cfg
        s = cfg.surrogate
        if plan.steps is None:
            raise ConfigError("compute.inner_budget_s without compute.step_time_s takes H_i from "
                              "measured step times, which the consensus surrogate does not have; "
                              "set compute.step_time_s or algo.local_steps")
        self.cfg = cfg
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.q = Quadratics.draw(cfg.workers, s.dim, s.rows, s.heterogeneity, self.gen)
        self.steps = list(plan.steps)
        self.rule = rule_for(plan, self.steps)
        spread = torch.randn(cfg.workers, s.dim, generator=self.gen, dtype=torch.float64)
        self.x = spread * (s.init_spread / math.sqrt(s.dim))
        self.rule.begin(self.x)

    def round(self, t: int) -> None:
        s = self.cfg.surrogate
        x_plus = inner_phase(self.q, self.x, self.steps, s.lr, s.grad_noise, self.gen)
        self.x = self.rule.step(t, x_plus)


def predicted_rate(rule, topo) -> float | None:
    """The asymptotic per-round factor of the consensus distance where theory gives one:
    pure gossip (eta = 0) with momentum gamma on a fixed graph, the square of the slowest root
    of x' = mu ((1 + gamma) x - gamma x_prev) over W's eigenvalues mu below the top one
    (``Topology.momentum_growth``; gamma = 0 gives lambda_2^2)."""
    if not isinstance(rule, GossipRule) or rule.eta != 0.0 or topo is None \
            or topo.time_varying:
        return None
    return topo.momentum_growth(rule.gamma) ** 2


def measured_rate(series: list[float]) -> float | None:
    """The per-round factor fitted on the second half of ``series`` (geometric mean of the
    ratios), over the rounds where it is still above ``FIT_FLOOR`` of its start and finite (a
    diverging run overflows); None when fewer than 4 rounds remain or it starts at 0."""
    if not series or series[0] <= 0.0:
        return None
    floor = FIT_FLOOR * series[0]
    last = max((t for t, v in enumerate(series) if floor < v < math.inf), default=0)
    first = len(series) // 2
    if last - first < 4:
        first = last // 2
    if last - first < 4:
        return None
    return (series[last] / series[first]) ** (1.0 / (last - first))


def run_consensus(plan: RunPlan, on_round: Callable[[int, float, float], None] | None = None
                  ) -> ConsensusRun:
    """Run the surrogate of ``plan`` (``plan.build_plan(cfg, data=False)``) for
    ``run.rounds`` rounds; ``on_round(t, consensus, loss_gap)`` after each."""
    started = time.perf_counter()
    cfg, topo = plan.cfg, plan.topology
    sur = Surrogate(plan)
    # the spectrum first, on every thread BLAS has: one dense eigensolve of W up to 1024
    # workers (O(N^3)), past that its two ends by Lanczos (``Topology.lambda2``)
    fixed = topo is not None and not topo.time_varying
    lambda2 = topo.lambda2 if fixed else None
    predicted = predicted_rate(sur.rule, topo)
    series: dict[str, list[float]] = {"consensus": [], "loss_gap": [], "worker_gap": []}

    def record(t: int) -> None:
        c = consensus_distance(sur.x)
        gap, worker = sur.q.gaps(sur.x)
        for key, v in zip(series, (c, gap, worker), strict=True):
            series[key].append(v)
        if on_round is not None:
            on_round(t, c, gap)

    with _one_thread():
        record(0)
        for t in range(cfg.run.rounds):
            sur.round(t)
            record(t + 1)
    rule = sur.rule
    eta, gamma = (rule.eta, rule.gamma) if isinstance(rule, GossipRule) else (rule.lr, rule.mu)
    return ConsensusRun(
        VERSION, plan.algo.name, topo.name if topo is not None else "all-reduce", cfg.workers,
        cfg.run.rounds, eta, gamma, sur.steps,
        {"seed": cfg.seed, **dataclasses.asdict(cfg.surrogate)},
        lambda2, predicted, measured_rate(series["consensus"]),
        time.perf_counter() - started, **series)


@contextlib.contextmanager
def _one_thread():
    """torch on one thread while the rounds run: the tensors are small (N x d), and a second
    intra-op thread made every step 30 times slower on this 2-core machine when it was busy
    (0.15 ms against 5.9 ms for one batched H_i x_i at N = 1024, d = 16)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
