"""Plain gossip of parameters after local steps: local-gossip (H > 1) and DSGD (H = 1).

Adapt-then-combine decentralized SGD/AdamW (Lian et al. 2017; Koloskova et al. 2020):
    theta_i <- sum_j W_t[i, j] theta_j^+
It equals GASLoC with eta = 1 and gamma = 0, bit for bit (a test checks it).
"""
from __future__ import annotations

import torch

from gasloc_emu.algorithms.base import Message, OuterAlgorithm, gossip, gossip_messages


class PlainGossip(OuterAlgorithm):
    name = "local-gossip"
    checkpoint_state = ()   # it keeps nothing between rounds

    def begin(self, theta: torch.Tensor) -> None:
        """Nothing to keep: plain gossip mixes the inner result, never its start."""

    @torch.no_grad()
    def outer_step(self, round_idx: int, theta: torch.Tensor) -> None:
        gossip(self.transport, self.topology, self.rank, round_idx, theta.clone(), theta,
               self.channel)

    def exchange(self, round_idx: int, last: bool, codec) -> list[Message]:
        return gossip_messages(self.topology, self.rank, round_idx)

    def _state(self) -> list[torch.Tensor | None]:
        return []


class DSGD(PlainGossip):
    name = "dsgd"
    default_local_steps = 1

    @classmethod
    def check_settings(cls, acfg, params) -> str | None:
        h = acfg.local_steps
        ones = isinstance(h, tuple) and set(h) == {1}
        if h not in (0, 1) and not ones:
            return (f"algo.local_steps = {list(h) if isinstance(h, tuple) else h!r} is not "
                    "allowed for dsgd, which takes one step per communication; use "
                    "local-gossip for H > 1")
        return super().check_settings(acfg, params)
