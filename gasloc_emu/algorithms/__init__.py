"""One file per algorithm, all over the narrow ``Transport`` interface; ``make`` picks one."""
from __future__ import annotations

import math

from ..config import ONE_MINUS_MOMENTUM, auto_factor
from ..topology import Topology, build_topology
from ..transport.base import Transport
from .a2cid2 import KIND as A2CID2_KIND
from .a2cid2 import A2CiD2
from .base import OuterAlgorithm
from .diloco import DiLoCo
from .diloco import wire_kinds as diloco_wire_kinds
from .gasloc import GASLoC
from .gossip import DSGD, PlainGossip


def momentum_value(acfg, topology: Topology | None) -> float:
    """gamma as a number: the configured one, or gamma* of the graph for 'auto' (times F for
    'auto*F')."""
    if isinstance(acfg.momentum, str):
        if topology is None:
            raise ValueError(f"algo.momentum = {acfg.momentum!r} needs a gossip graph (not diloco)")
        return auto_factor(acfg.momentum) * topology.gamma_star
    return float(acfg.momentum)


def outer_lr_value(acfg, topology: Topology | None) -> float:
    """eta as a number: the configured one, or 1 - gamma for '1-momentum'."""
    if acfg.outer_lr == ONE_MINUS_MOMENTUM:
        return 1.0 - momentum_value(acfg, topology)
    return float(acfg.outer_lr)


def momentum_warning(cfg) -> str | None:
    """A warning when GASLoC's gamma makes gossip on this graph diverge, else None.

    The outer momentum accelerates gossip only below the stability edge of its two-term
    recursion on W's spectrum (docs/ALGORITHM.md, "gamma*"); past it a mode grows every round.
    """
    topo = build_topology(cfg)
    if cfg.algo.name != "gasloc" or topo is None:
        return None
    gamma = momentum_value(cfg.algo, topo)
    growth = topo.momentum_growth(gamma)
    if growth < 1.0 - 1e-9:
        return None
    return (f"algo.momentum = {gamma:g} makes gossip on this {topo.name} graph unstable "
            f"(a mode grows {growth:.3f}x per round); gamma* = {topo.gamma_star:.3f} is stable")

def overlap_refusal(cfg, topo: Topology | None, scenario: bool) -> str | None:
    """Why ``algo.overlap = 1`` cannot run as configured, or None.

    Overlapped GASLoC takes the inner phase's drift at the unmixed z; on a W with a negative
    eigenvalue mu that drift adds to mu's sign flip and, with outer momentum, a disagreement
    grows every round (docs/ALGORITHM.md, "Overlapped GASLoC": stable when W has no negative
    eigenvalue). A scenario's membership and link changes are not overlapped yet.
    """
    if not cfg.algo.overlap:
        return None
    if scenario:
        return ("algo.overlap = 1 does not take a scenario or a link trace yet (leaves, joins "
                "and partitions assume a round's exchange ends in that round)")
    if cfg.algo.name != "gasloc" or topo is None:
        return None
    low = topo.min_eigenvalue()
    if low >= -1e-12:
        return None
    return (f"algo.overlap = 1 needs gossip weights with no negative eigenvalue (W >= 0); this "
            f"{topo.name} graph's W has {low:.3f} at algo.alpha = {topo.alpha:g}; set "
            f"algo.alpha <= {math.floor(topo.lazy_alpha() * 1000) / 1000:g}")


def async_refusal(cfg, topo: Topology | None, scenario: bool) -> str | None:
    """Why asynchronous gossip (a2cid2) cannot run as configured, or None: it has no rounds for
    a scenario's events to happen at, and takes one step per exchange."""
    if cfg.algo.name != "a2cid2":
        return None
    if scenario:
        return ("algo.name = a2cid2 does not take a scenario or a link trace yet (their events "
                "happen at rounds, and it has none)")
    if cfg.compute.inner_budget_s > 0:
        return (f"compute.inner_budget_s = {cfg.compute.inner_budget_s:g} does not apply to "
                "a2cid2, which takes one step per exchange; set it to 0")
    if topo is None or not topo.possible_edges:
        return "algo.name = a2cid2 needs a graph with at least one edge"
    return None


def make(acfg, rank: int, transport: Transport, topology: Topology | None,
         weight: float = 1.0, members=None, heals=None) -> OuterAlgorithm:
    """``weight``: what DiLoCo multiplies this worker's pseudo-gradient by before the mean
    (``compute.pseudo_grad_weight``); gossip algorithms mix by W alone and ignore it.
    ``members(t)``: the living workers of round t, for DiLoCo's ring (gossip algorithms get a
    graph over the living as ``topology`` instead); ``heals(t)``: whether a partition ends in
    round t (DiLoCo merges the groups' states then)."""
    if acfg.name == "gasloc":
        return GASLoC(rank, transport, topology, outer_lr_value(acfg, topology),
                      momentum_value(acfg, topology),
                      acfg.overlap)
    if acfg.name == "diloco":
        return DiLoCo(rank, transport, acfg.outer_lr, momentum_value(acfg, None), weight,
                      members, heals, acfg.overlap)
    if acfg.name == "dsgd":
        return DSGD(rank, transport, topology)
    if acfg.name == "local-gossip":
        return PlainGossip(rank, transport, topology)
    if acfg.name == "a2cid2":
        return A2CiD2(rank, transport, topology, momentum=acfg.continuous_momentum)
    raise ValueError(f"unknown algorithm {acfg.name!r}")


def wire_kinds(acfg, numel: int) -> dict[str, tuple[int]]:
    """The messages an algorithm sends besides gossip's ``z``, the ring's and the join's: the
    receivers' schema allows exactly these."""
    if acfg.name == "a2cid2":
        return {A2CID2_KIND: (numel,)}
    return diloco_wire_kinds(numel) if acfg.name == "diloco" else {}


__all__ = ["A2CiD2", "DSGD", "DiLoCo", "GASLoC", "OuterAlgorithm", "PlainGossip", "async_refusal",
           "make", "momentum_value", "momentum_warning", "outer_lr_value", "wire_kinds"]
