"""One file per algorithm, all over the narrow ``Transport`` interface; ``registry.resolve``
turns ``algo.name`` (a registered name or ``package.module:Class``) into one of them."""
from __future__ import annotations

from gasloc_emu.algorithms.a2cid2 import A2CiD2
from gasloc_emu.algorithms.base import (
    Algorithm,
    Context,
    NoSettings,
    OuterAlgorithm,
    PairwiseAlgorithm,
    Supports,
)
from gasloc_emu.algorithms.diloco import DiLoCo
from gasloc_emu.algorithms.gasloc import GASLoC
from gasloc_emu.algorithms.gossip import DSGD, PlainGossip
from gasloc_emu.algorithms.outer import momentum_value, outer_lr_value
from gasloc_emu.algorithms.registry import Resolved, known, load, resolve

__all__ = ["A2CiD2", "DSGD", "Algorithm", "Context", "DiLoCo", "GASLoC", "NoSettings",
           "OuterAlgorithm", "PairwiseAlgorithm", "PlainGossip", "Resolved", "Supports", "known",
           "load", "momentum_value", "outer_lr_value", "resolve"]
