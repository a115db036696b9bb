"""One file per algorithm, all over the narrow ``Transport`` interface; ``registry.resolve``
turns ``algo.name`` (a registered name or ``package.module:Class``) into one of them."""
from __future__ import annotations

from .a2cid2 import A2CiD2
from .base import Context, NoSettings, OuterAlgorithm, Supports
from .diloco import DiLoCo
from .gasloc import GASLoC
from .gossip import DSGD, PlainGossip
from .outer import momentum_value, outer_lr_value
from .registry import Resolved, known, load, resolve

__all__ = ["A2CiD2", "DSGD", "Context", "DiLoCo", "GASLoC", "NoSettings", "OuterAlgorithm",
           "PlainGossip", "Resolved", "Supports", "known", "load", "momentum_value",
           "outer_lr_value", "resolve"]
