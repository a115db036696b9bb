"""A bandwidth profile in one file: workers around a ring of sites, slower the farther apart.

Register it under the entry-point group ``gasloc_emu.profiles`` in your package's
pyproject.toml, then run with ``--bw-profile distance`` (or name it by path:
``--bw-profile distance_profile:distance``, with this file's folder importable)::

    [project.entry-points."gasloc_emu.profiles"]
    distance = "distance_profile:distance"

Worker i sits at site i of a ring of N; a pair h hops apart (the shorter way round) gets
net.rate_mbit / h, both ways. Latency, jitter and loss are net.*'s on every link.
"""
from __future__ import annotations


def distance(net, workers: int, seed: int) -> tuple[dict, str]:
    rates = {}
    for i in range(workers):
        for j in range(i + 1, workers):
            hops = min(j - i, workers - (j - i))
            rates[(i, j)] = round(net.rate_mbit / hops, 3)
    return rates, f"rate_mbit / hops around a ring of {workers} sites"
