"""A family of gossip graphs in one file: the hypercube.

Register it under the entry-point group ``gasloc_emu.topologies`` in your package's
pyproject.toml, then run with ``--topology hypercube`` (or name it by path:
``--topology hypercube_topology:Hypercube``, with this file's folder importable)::

    [project.entry-points."gasloc_emu.topologies"]
    hypercube = "hypercube_topology:Hypercube"

N = 2^d workers; i and j are peers when their indices differ in one bit, so every worker has
log2 N peers and any two are at most log2 N hops apart. With Metropolis–Hastings weights
W = I - L / (d + 1), and the Laplacian's eigenvalues of the d-cube 2k for k = 0..d, the
second-largest eigenvalue modulus is (d - 1) / (d + 1).
"""
from __future__ import annotations

from gasloc_emu.topology import Family, Topology, TopologyError


class Hypercube(Family):
    name = "hypercube"

    def edges(self, topo: Topology) -> set[tuple[int, int]]:
        n = topo.n
        if n & (n - 1):
            raise TopologyError(f"hypercube needs a power of two workers; got N = {n}")
        return {(i, i ^ bit) for i in range(n) for bit in _bits(n) if i < i ^ bit}

    def rule(self, topo: Topology) -> str:
        return f"hypercube: workers whose indices differ in one of {topo.n.bit_length() - 1} bits"


def _bits(n: int) -> list[int]:
    return [1 << k for k in range(n.bit_length() - 1)]
