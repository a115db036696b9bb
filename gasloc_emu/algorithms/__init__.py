"""One file per algorithm, all over the narrow ``Transport`` interface; ``make`` picks one."""
from __future__ import annotations

from ..topology import Topology
from ..transport.base import Transport
from .base import OuterAlgorithm
from .diloco import DiLoCo
from .gasloc import GASLoC
from .gossip import DSGD, PlainGossip

def momentum_value(acfg, topology: Topology | None) -> float:
    """gamma as a number: the configured one, or gamma* of the graph for 'auto'."""
    if acfg.momentum == "auto":
        if topology is None:
            raise ValueError("algo.momentum = 'auto' needs a gossip graph (not diloco)")
        return topology.gamma_star
    return float(acfg.momentum)

def make(acfg, rank: int, transport: Transport, topology: Topology | None) -> OuterAlgorithm:
    if acfg.name == "gasloc":
        return GASLoC(rank, transport, topology, acfg.outer_lr, momentum_value(acfg, topology))
    if acfg.name == "diloco":
        return DiLoCo(rank, transport, acfg.outer_lr, momentum_value(acfg, None))
    if acfg.name == "dsgd":
        return DSGD(rank, transport, topology)
    if acfg.name == "local-gossip":
        return PlainGossip(rank, transport, topology)
    raise ValueError(f"unknown algorithm {acfg.name!r}")

__all__ = ["OuterAlgorithm", "GASLoC", "DiLoCo", "DSGD", "PlainGossip", "make",
           "momentum_value"]
