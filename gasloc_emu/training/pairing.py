"""Who exchanges with whom in asynchronous pairwise gossip (A2CiD2): no sockets, no clock.

A worker whose communication lane wants an exchange says it is ready (``a2cid2.Slots``:
rate_com requests per gradient step); the pairer matches it at once with a neighbour that is
already waiting (the neighbours are tried in a random order, from a generator seeded by the
run), or leaves it waiting until one becomes ready. This is the orchestrator of the A2CiD2
authors' implementation: a worker never waits for a given peer, only for any free one. Two
neighbours are never both waiting (the second to arrive takes the first), so a waiting worker's
neighbours are all exchanging or at their slot's end, waiting for their own gradient steps,
which end; one of them comes.

A worker that has ended its last slot says it is ``finished``; a waiting worker whose
neighbours have all finished is released without a partner (``Pairing.peer`` None) and goes on
alone, as is a ready worker with no neighbour left. Every pairing gets a label, counting from 1
in the order they were made: both sides tag their messages with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Pairing:
    """What a ready worker is told: its peer and the exchange's label, or peer None (alone)."""

    worker: int
    peer: int | None
    label: int = 0

    def to_json(self) -> dict:
        return {"worker": self.worker, "peer": self.peer, "label": self.label}

    @classmethod
    def from_json(cls, d: dict) -> Pairing:
        return cls(int(d["worker"]), None if d["peer"] is None else int(d["peer"]),
                   int(d["label"]))


class Pairer:
    def __init__(self, n: int, edges, seed: int):
        self.n = n
        self.adj: list[list[int]] = [[] for _ in range(n)]
        for a, b in sorted(edges):
            self.adj[a].append(b)
            self.adj[b].append(a)
        self.rng = np.random.default_rng([seed, 0xA2C1D2])
        self.waiting: set[int] = set()
        self.finished_workers: set[int] = set()
        self.labels = 0
        self.requests = [0] * n  # ready calls: one per exchange asked for
        self.alone = [0] * n  # requests that found no partner
        self.pair_counts: dict[tuple[int, int], int] = {}

    def ready(self, worker: int, request: int | None = None) -> list[Pairing]:
        """``worker`` asks for a partner (its ``request``-th time, counting from 0, when given:
        checked against the count so far): the pairings this makes (both sides of one
        exchange, ``worker`` alone, or none while it waits)."""
        self._check(worker)
        if worker in self.waiting:
            raise ValueError(f"worker {worker} is ready twice without being paired")
        if request is not None and request != self.requests[worker]:
            raise ValueError(f"worker {worker} says request {request}; it has made "
                             f"{self.requests[worker]} so far")
        self.requests[worker] += 1
        for peer in self.rng.permutation(self.adj[worker]).tolist():
            if peer in self.waiting:
                return self._pair(worker, peer)
        if self._stranded(worker):
            return self._alone([worker])
        self.waiting.add(worker)
        return []

    def _pair(self, a: int, b: int) -> list[Pairing]:
        self.waiting.remove(b)
        self.labels += 1
        edge = (min(a, b), max(a, b))
        self.pair_counts[edge] = self.pair_counts.get(edge, 0) + 1
        return [Pairing(a, b, self.labels), Pairing(b, a, self.labels)]

    def _alone(self, workers: list[int]) -> list[Pairing]:
        for w in workers:
            self.alone[w] += 1
        return [Pairing(w, None) for w in workers]

    def finished(self, worker: int) -> list[Pairing]:
        """``worker`` will not be ready again: release the waiting workers it strands."""
        self._check(worker)
        self.finished_workers.add(worker)
        freed = sorted(w for w in self.waiting if self._stranded(w))
        self.waiting.difference_update(freed)
        return self._alone(freed)

    def record(self) -> dict:
        """What summary.json keeps: requests per worker, the exchanges on each edge ("i-j"),
        and the requests that found no partner (the end of the run, when the neighbours had
        finished)."""
        return {"requests": list(self.requests), "unpaired": list(self.alone),
                "exchanges": self.labels,
                "pairings": {f"{a}-{b}": c for (a, b), c in sorted(self.pair_counts.items())}}

    def _stranded(self, worker: int) -> bool:
        return all(p in self.finished_workers for p in self.adj[worker])

    def _check(self, worker: int) -> None:
        if not 0 <= worker < self.n or worker in self.finished_workers:
            raise ValueError(f"worker {worker} is not a running worker of [0, {self.n})")
