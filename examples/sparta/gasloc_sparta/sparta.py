"""SPARTA: sparse parameter averaging, as a gasloc-emu algorithm plugin.

The idea is EXO Labs' SPARTA (Beton, Baioumy, van der Ouderaa, Reed, Howes, Cheema, Vrabie,
"SPARTA: sparse parameter averaging", 2025; the strategy ships in EXO Gym): instead of
averaging whole models now and then, average a small random share of the parameters often.
The original averages the chosen share over all workers after every step; this plugin is the
decentralized form, one neighbour per round. The code is written for gasloc-emu, not taken
from either.

Per worker i and round t, after the round's H inner steps:

    j          = i's one neighbour of round t (a matching; none: nothing happens)
    S_t(i, j)  = k = round(p * n) distinct indices of the flat parameter vector (n entries),
                 drawn from a generator seeded by (settings.seed, t, min(i, j), max(i, j))
    theta_i[S] <- (theta_lo[S] + theta_hi[S]) / 2      lo, hi = the pair in rank order

Both ends of a pair draw the same S from the shared seed, so only the k values travel (wire
kind ``"sparta"``, shape ``(k,)``), and both compute the mean with the lower rank's values
first, so the two ends hold the same bits afterwards, in every transport. Nothing is kept
between rounds but the model itself (``state_bytes`` is 0), so a joiner needs nothing from
its donor beyond the parameters the runner hands over.

H defaults to 1 (``default_local_steps``), as in the original, which averages after every
step; ``--local-steps`` raises it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from gasloc_emu.algorithms import Context, OuterAlgorithm
from gasloc_emu.config import ConfigError, setting

KIND = "sparta"   # the wire kind of a round's k values
CHECKED_ROUNDS = 8  # rounds of a time-varying graph looked at for workers with two neighbours


@dataclass(frozen=True)
class SpartaSettings:
    """``algo.params`` of sparta (``--set algo.params.KEY=VALUE``)."""

    fraction: float = setting(0.05, "Share p of the parameters averaged with the round's "
                                    "neighbour, in (0, 1]; k = round(p * n) values travel.",
                              lo=0.0, hi=1.0)
    seed: int = setting(0, "Seed of the index draws; every worker must use the same.",
                        lo=0, hi=2**63 - 1)

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ConfigError(f"algo.params.fraction = {self.fraction!r} is out of range; "
                              "expected a value in (0, 1]")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"algo.params.seed = {self.seed!r} is out of range; expected a "
                              "value in [0, 2**63 - 1]")


def message_size(numel: int, fraction: float) -> int:
    """k: how many of ``numel`` parameters a round averages (at least one, at most all)."""
    return max(1, min(numel, round(fraction * numel)))


def pair_seed(seed: int, round_idx: int, a: int, b: int) -> int:
    """The generator seed of the pair {a, b} in round ``round_idx``: the same on both ends."""
    lo, hi = min(a, b), max(a, b)
    digest = hashlib.blake2b(f"{seed}:{round_idx}:{lo}:{hi}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def pair_indices(seed: int, round_idx: int, a: int, b: int, numel: int, k: int) -> torch.Tensor:
    """The k distinct indices the pair {a, b} averages in round ``round_idx``, sorted (CPU)."""
    gen = torch.Generator(device="cpu").manual_seed(pair_seed(seed, round_idx, a, b))
    return torch.randperm(numel, generator=gen)[:k].sort().values


class SPARTA(OuterAlgorithm):
    """One worker's side of sparse pairwise averaging (module docstring)."""

    name = "sparta"
    Settings = SpartaSettings
    default_local_steps = 1
    compressed_kinds = ()   # its messages are already a few values: they travel as they are

    @classmethod
    def create(cls, ctx: Context) -> SPARTA:
        return cls(ctx.rank, ctx.transport, ctx.topology, ctx.params)

    @classmethod
    def refusal(cls, cfg, topo, scenario: bool) -> str | None:
        """A pair averages with each other only: a graph that gives a worker two neighbours in
        a round would leave a message unanswered."""
        if topo is not None:
            rounds = range(min(cfg.run.rounds, CHECKED_ROUNDS) if topo.time_varying else 1)
            for t in rounds:
                for rank, peers in enumerate(topo.neighbors(t)):
                    if len(peers) > 1:
                        return (f"algo.name = sparta averages with one neighbour per round, "
                                f"but topology {topo.name} gives worker {rank} {len(peers)} "
                                f"neighbours in round {t}; use --topology matching")
        return super().refusal(cfg, topo, scenario)

    @classmethod
    def wire_kinds(cls, numel: int, params: SpartaSettings) -> dict[str, tuple[int, ...]]:
        """One message a round: the k values, k from the settings' fraction."""
        return {KIND: (message_size(numel, params.fraction),)}

    def __init__(self, rank, transport, topology, settings: SpartaSettings | None = None):
        super().__init__(rank, transport, topology)
        self.settings = settings if settings is not None else SpartaSettings()

    def begin(self, theta: torch.Tensor) -> None:
        """Nothing to keep: the round's result is the model itself."""

    @torch.no_grad()
    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        peers = self.peers(round_idx)
        if not peers:           # unpaired this round (an odd number alive): train alone
            return
        if len(peers) > 1:      # refused when planned; a living graph must not make one either
            raise RuntimeError(f"sparta: worker {self.rank} has {len(peers)} neighbours in "
                               f"round {round_idx}; it averages with one")
        j, numel = peers[0], theta.numel()
        k = message_size(numel, self.settings.fraction)
        idx = pair_indices(self.settings.seed, round_idx, self.rank, j, numel, k)
        idx = idx.to(theta.device)
        mine = theta[idx]       # a fresh tensor (advanced indexing copies): the transport's
        self.transport.send(j, round_idx, KIND, mine)
        theirs = self.transport.recv(j, round_idx, KIND).to(theta.device)
        lo, hi = (mine, theirs) if self.rank < j else (theirs, mine)
        theta.index_copy_(0, idx, torch.add(lo, hi).mul_(0.5))

    def _state(self) -> list[torch.Tensor | None]:
        return []
