"""What ``simulate`` and ``run`` check and build before they create anything.

Bad input (an impossible graph, a broken bandwidth profile or network settings that would not
be applied, a model whose width does not split into its heads, a corpus too small for the
workers) fails here, before a run folder, a namespace or a process exists. The
checks that are only worth a warning (an outer momentum that makes gossip diverge) come back as
text for the command layer to print.
"""
from __future__ import annotations

from dataclasses import dataclass

from .algorithms import async_refusal, momentum_warning, overlap_refusal
from .compute import check as check_compute
from .config import Config, ConfigError
from .data import Corpus, build_corpus
from .devices import simulator_device
from .model import shape_from_config
from .netplan import check_network
from .topology import Topology, build_topology
from .world import World
from .world import from_config as world_from_config


@dataclass(frozen=True)
class Preflight:
    """The checked pieces of one run: its graph, its corpus, and the warnings to show."""

    topology: Topology | None  # None for DiLoCo, whose peers are the ring All-Reduce's
    corpus: Corpus
    warnings: tuple[str, ...] = ()
    world: World | None = None  # what the scenario does in each round; None without one


def preflight(cfg: Config) -> Preflight:
    """Check ``cfg`` against everything a run needs; raises the first bad-input error."""
    topo = build_topology(cfg)
    check_network(cfg)
    check_compute(cfg)  # speeds, profile file, budget vs. weighting: before anything runs
    shape_from_config(cfg.model)
    simulator_device(cfg.run.device)  # run.device = cuda without a GPU
    # the scenario and the link trace: every event and row checked before the run
    world = world_from_config(cfg, topo)
    refusal = overlap_refusal(cfg, topo, world is not None) \
        or async_refusal(cfg, topo, world is not None)
    if refusal:
        raise ConfigError(refusal)
    warnings = tuple(w for w in (momentum_warning(cfg),) if w)
    return Preflight(topo, build_corpus(cfg), warnings, world)
