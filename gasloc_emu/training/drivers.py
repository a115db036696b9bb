"""How an algorithm organises a worker's time: the one place that tells round-based algorithms
from asynchronous ones.

An algorithm names its driver (``Algorithm.driver``); this registry turns the name into
a ``Drive``, and the runners ask the drive what they need (its training loop, its transport's
bounds, its pairer, what it cannot do) instead of asking which kind the algorithm is.

- ``rounds``: every worker makes the same numbered rounds (``training.rounds``); what a
  round sends is fixed by its number, so a run replays to the bit at any link timing.
- ``pairwise``: gradient steps and pairwise exchanges side by side, no rounds
  (``training.async_worker``); partners are paired as they become free, so who meets whom
  follows the links' timing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gasloc_emu.training import async_worker
from gasloc_emu.training.pairing import Pairer
from gasloc_emu.training.rounds import RoundDriver


class Drive:
    """What the runners ask of a kind of algorithm."""

    name: ClassVar[str]
    # whether a run's messages are fixed by round numbers, so that one simulation replays any
    # run of the same settings to the bit (else: pairings follow the links' timing)
    replays_exactly: ClassVar[bool]
    # whether run.rounds counts each worker's gradient steps (else rounds of local steps)
    rounds_count_steps: ClassVar[bool] = False

    def train(self, host, worker, world, rank: int, rounds: int, first: int = 0,
              checkpoints=None) -> bool:
        """One worker's training on its host (an emulator process) from round ``first``,
        checkpointed into ``checkpoints`` where it is not None; False when stopped."""
        raise NotImplementedError

    def transport_limits(self, model_bytes: int) -> dict:
        """The data plane's window and per-peer bounds beyond the defaults."""
        return {}

    def exchange_requests(self, algo, acfg, steps: int) -> int:
        """The most pairing requests a worker may make in ``steps`` steps (the launcher's bound
        on what it may ask)."""
        return 0

    def pairer(self, workers: int, topology, seed: int):
        """The launcher's pairer of exchange requests, or None when there is none to pair."""
        return None

    def batched_refusal(self) -> str | None:
        """Why the batched simulator cannot run it, or None."""
        return None


@dataclass(frozen=True)
class Rounds(Drive):
    name: ClassVar[str] = "rounds"
    replays_exactly: ClassVar[bool] = True

    def train(self, host, worker, world, rank: int, rounds: int, first: int = 0,
              checkpoints=None) -> bool:
        return RoundDriver(host, worker, world, rank, rounds, checkpoints).run(first)


@dataclass(frozen=True)
class Pairwise(Drive):
    name: ClassVar[str] = "pairwise"
    replays_exactly: ClassVar[bool] = False
    rounds_count_steps: ClassVar[bool] = True

    def train(self, host, worker, world, rank: int, rounds: int, first: int = 0,
              checkpoints=None) -> bool:
        return async_worker.run_async(worker, rounds, host.t0, host.ask_peer, host.report_step)

    def transport_limits(self, model_bytes: int) -> dict:
        return async_worker.transport_limits(model_bytes)

    def exchange_requests(self, algo, acfg, steps: int) -> int:
        return algo.exchange_requests(acfg, steps)

    def pairer(self, workers: int, topology, seed: int):
        return Pairer(workers, topology.possible_edges, seed)

    def batched_refusal(self) -> str | None:
        return "the algorithm has no rounds"


DRIVES: dict[str, Drive] = {d.name: d for d in (Rounds(), Pairwise())}


def drive_of(algo) -> Drive:
    """The drive an algorithm class names (``Algorithm.driver``)."""
    try:
        return DRIVES[algo.driver]
    except KeyError:
        raise ValueError(f"{algo.name}: driver = {algo.driver!r} is not one of "
                         f"{', '.join(sorted(DRIVES))}") from None
