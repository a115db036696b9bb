"""The outer constants gamma and eta as numbers, from the settings and the graph: shared by the
algorithms with an outer momentum (GASLoC and DiLoCo) and by plugins that want the same words
('auto', 'auto*F', '1-momentum')."""
from __future__ import annotations

from gasloc_emu.config import ONE_MINUS_MOMENTUM, auto_factor
from gasloc_emu.topology import Topology


def momentum_value(acfg, topology: Topology | None) -> float:
    """gamma as a number: the configured one, or gamma* of the graph for 'auto' (times F for
    'auto*F')."""
    if isinstance(acfg.momentum, str):
        if topology is None:
            raise ValueError(f"algo.momentum = {acfg.momentum!r} needs a gossip graph")
        return auto_factor(acfg.momentum) * topology.gamma_star
    return float(acfg.momentum)


def outer_lr_value(acfg, topology: Topology | None) -> float:
    """eta as a number: the configured one, or 1 - gamma for '1-momentum'."""
    if acfg.outer_lr == ONE_MINUS_MOMENTUM:
        return 1.0 - momentum_value(acfg, topology)
    return float(acfg.outer_lr)


def outer_constants(acfg, topology: Topology | None) -> dict[str, float]:
    """{"gamma", "eta"} as the header and the summary show them."""
    return {"gamma": momentum_value(acfg, topology), "eta": outer_lr_value(acfg, topology)}
