"""Link plans held as a rule (``netem.profiles.BlockLinks``): every link, and every answer
about all links, equal to those of the dense dict of N(N-1) links the profile's rule means;
timing the same with either."""
from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from gasloc_emu import config as C
from gasloc_emu.config import NetConfig
from gasloc_emu.netplan import _tcp_limited, sim_link_model
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator import timing
from gasloc_emu.topology import Topology, lanczos_extremes, sparse_matvec
from netem import cloud
from netem.profiles import BlockLinks, Link, LinkPlan, build_link_plan, pairs_at

IMPAIR = {"latency_ms": 20.0, "jitter_ms": 1.0, "loss_pct": 0.5}


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def _dense_pair_rates(profile: str, n: int, seed: int, net: NetConfig) -> dict:
    """The pair profiles' rates as their docstrings define them, from a list of every pair."""
    fast, slow = net.rate_mbit, net.slow_rate_mbit
    if profile == "uniform":
        return dict.fromkeys(_pairs(n), fast)
    if profile == "skewed":
        pairs = _pairs(n)
        chosen = set(random.Random(seed).sample(pairs, math.ceil(0.1 * len(pairs))))
        return {p: slow if p in chosen else fast for p in pairs}
    if profile == "skewed-worker":
        worker = random.Random(seed).randrange(n)
        return {p: slow if worker in p else fast for p in _pairs(n)}
    half = (n + 1) // 2     # two-cluster
    return {(i, j): fast if (i < half) == (j < half) else slow for i, j in _pairs(n)}


def _dense_plan(profile: str, n: int, seed: int, net: NetConfig) -> LinkPlan:
    values = {k: getattr(net, k) for k in IMPAIR}
    links = {}
    for (i, j), rate in _dense_pair_rates(profile, n, seed, net).items():
        links[(i, j)] = Link(i, j, rate, **values)
        links[(j, i)] = Link(j, i, rate, **values)
    return LinkPlan(n, links, {}, profile=profile, mtu=net.mtu)


def _same_answers(rule: LinkPlan, dense: LinkPlan) -> None:
    n = dense.workers
    assert isinstance(rule.links, BlockLinks) and len(rule.links) == n * (n - 1)
    assert {k: rule.links[k] for k in dense.links} == dense.links
    assert sorted(rule.links) == sorted(dense.links)
    assert [rule.slowest_rate_mbit(s) for s in range(n)] == \
        [dense.slowest_rate_mbit(s) for s in range(n)]
    assert np.array_equal(rule.rate_matrix(), dense.rate_matrix())
    for attr in ("latency_ms", "jitter_ms", "loss_pct"):
        assert rule.max_of(attr) == dense.max_of(attr)
    assert rule.impaired == dense.impaired and _tcp_limited(rule) == _tcp_limited(dense)
    model, reference = rule.link_model(), dense.link_model()
    assert all(model(s, d, 123_457) == reference(s, d, 123_457) for s, d in dense.links)


@pytest.mark.parametrize("profile", ["uniform", "skewed", "skewed-worker", "two-cluster"])
@pytest.mark.parametrize("n", [2, 3, 9, 24])
def test_pair_rules_give_the_dense_links(profile, n):
    net = NetConfig(bw_profile=profile, rate_mbit=40.0, slow_rate_mbit=4.0, **IMPAIR)
    for seed in (0, 5):
        _same_answers(build_link_plan(net, n, seed), _dense_plan(profile, n, seed, net))


def test_cloud_rule_gives_the_measured_link_of_every_pair():
    placement = cloud.parse_placement("aws:us-west-2*3,aws:eu-west-1,aws:ap-south-1*2,"
                                      "aws:us-west-2,aws:eu-west-1")
    n, table = len(placement), cloud.load_table()
    net = NetConfig(bw_profile="cloud", placement=",".join(placement), latency_ms=2.0)
    links = {}
    for i in range(n):
        for j in range(n):
            a, b = placement[i], placement[j]
            if i == j:
                continue
            m = table.same_region(a)[0] if a == b else None
            rate, rtt = (m.capacity_mbit, m.rtt_ms) if m is not None else \
                (lambda c: (c.rate_mbit, c.rtt_ms))(cloud.pair_link(table, a, b, "capacity",
                                                                    "error"))
            links[(i, j)] = Link(i, j, rate, latency_ms=round(rtt / 2 + 2.0, 3))
    rule = build_link_plan(net, n, 0)
    _same_answers(rule, LinkPlan(n, links, {}, profile="cloud", mtu=net.mtu))
    assert "same region" in rule.note and "links 0->1 0->2" in rule.note


def test_pairs_at_is_the_list_of_pairs_by_index():
    for n in (2, 3, 7, 64):
        assert pairs_at(n, range(n * (n - 1) // 2)) == _pairs(n)
    n = 4096
    assert pairs_at(n, [0, n - 2, n - 1, n * (n - 1) // 2 - 1]) == \
        [(0, 1), (0, n - 1), (1, 2), (n - 2, n - 1)]


def test_timing_with_a_rule_plan_equals_timing_with_its_dense_links(tmp_path):
    """The replay reads links from the rule; built from a dict of the same links instead, every
    row's times and every link's busy seconds are the same to the float, and a rule that gave
    one link a different rate would not be."""
    cfg = C.resolve(None, {"workers": 8, "model.preset": "tiny", "run.rounds": 3,
                           "algo.local_steps": 2, "compute.step_time_s": 0.05,
                           "run.dashboard": "off", "algo.name": "gasloc",
                           "topology.name": "expander", "net.bw_profile": "skewed",
                           "net.latency_ms": 20.0})
    plan = build_plan(cfg, data=False)
    dense = dataclasses.replace(plan.link_plan, links=dict(plan.link_plan.links.items()))
    edge = min(plan.topology.possible_edges)
    slower = dict(dense.links)
    slower[edge] = dataclasses.replace(slower[edge], rate_mbit=slower[edge].rate_mbit * 0.999)
    runs = []
    for link_plan in (plan.link_plan, dense, dataclasses.replace(dense, links=slower)):
        p = dataclasses.replace(plan, link_plan=link_plan,
                                link_model=sim_link_model(cfg, link_plan, plan.world))
        clock, _ = timing.timing_clock(p, emit=(rows := []).append)
        timing.play(clock)
        runs.append((rows, dict(clock.link_busy_s), clock.now_s))
    assert type(runs[0][0][0]["time_s"]) is float and runs[0] == runs[1]
    assert runs[2] != runs[1]


def test_lanczos_finds_the_ends_of_the_spectrum_a_dense_solve_finds():
    topo = Topology("expander", 128, 4, 3)
    mus = np.linalg.eigvalsh(topo.mixing_matrix())
    low, high = lanczos_extremes(sparse_matvec(topo.mixing_matrix()), 128, seed=3)
    assert low == pytest.approx(mus[0], abs=1e-12) and high == pytest.approx(mus[-2], abs=1e-12)
    ring = Topology("ring", 400, 2, 0)     # ends O(1 / N^2) apart: too few steps is no answer
    assert lanczos_extremes(sparse_matvec(ring.mixing_matrix()), 400, steps=30) is None


def _first_of_each_kind_walked(links: BlockLinks) -> list[tuple[int, int]]:
    """The exceptions walked one by one, each key's first pair kept (the reference)."""
    exc, group, first = links.exceptions, links.group, {}
    for (src, dst), kind in exc.items():
        key = (kind, exc.get((dst, src), -1), group[src], group[dst])
        if key not in first:
            first[key] = (src, dst)
    return list(first.values())


@pytest.mark.parametrize("seed", range(30))
def test_the_first_exception_of_each_kind_is_the_walked_one(seed):
    """Exceptions one way or both, of several kinds, between groups with any labels: the
    arrays find the pairs, and in the order, that walking the exceptions finds."""
    rng = random.Random(seed)
    workers = rng.randint(2, 14)
    labels = rng.sample([0, 1, 5, 9, 40], rng.randint(1, 3))
    group = [rng.choice(labels) for _ in range(workers)]
    block = {(a, b): {"rate_mbit": 10.0} for a in labels for b in labels}
    kinds = [{"rate_mbit": float(k + 1)} for k in range(rng.randint(1, 3))]
    pairs = [(i, j) for i in range(workers) for j in range(workers) if i != j]
    exceptions = {}
    for i, j in rng.sample(pairs, rng.randint(0, len(pairs))):
        exceptions[(i, j)] = rng.randrange(len(kinds))
        if rng.random() < 0.5:
            exceptions[(j, i)] = rng.randrange(len(kinds))
    links = BlockLinks(workers, group, block, kinds, exceptions)
    assert links._first_of_each_kind() == _first_of_each_kind_walked(links)
