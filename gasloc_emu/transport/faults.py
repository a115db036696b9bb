"""Deterministic fault injection: worker w fails at round r, the same way in ``simulate`` and
``run``.

A ``FaultyTransport`` wraps the worker's transport and, on the target worker's first send or
receive of round r or later (its inner steps of that round done, its outer step not yet begun),
fails in one of three ways (torchft's ``EventInjector.fail_at(rank, step)`` is the model):

- ``raise``: an ``InjectedFault`` exception, as a bug in the worker would raise;
- ``exit``: the process ends at once with ``exit_code``, no last words (in the simulator, whose
  workers are threads, the worker's thread ends with the same report);
- ``hang``: the worker stops dead, heartbeat included, as under SIGSTOP; the launcher's silence
  check (``run.heartbeat_timeout_s``), or the simulator's stall check, has to notice;
- ``poison``: the worker keeps going but every tensor it sends from then on is NaN, as a numeric
  blow-up on one worker would be: its peers' divergence check has to notice.

Every other call goes to the wrapped transport, so a run without a fault is bit for bit a run
without the wrapper.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gasloc_emu.config import FAULT_MODES


class InjectedFault(RuntimeError):
    """The failure a fault plan asked for."""


@dataclass(frozen=True)
class FaultPlan:
    """Fail ``worker`` at ``round`` by ``mode``; ``exit_code`` is the status of an ``exit``."""

    worker: int
    round: int
    mode: str
    exit_code: int = 3

    def __post_init__(self) -> None:
        if self.mode not in FAULT_MODES:
            raise ValueError(f"fault mode {self.mode!r}; expected one of {FAULT_MODES}")
        if self.worker < 0 or self.round < 0:
            raise ValueError(f"fault at worker {self.worker}, round {self.round}; "
                             "both must be >= 0")
        if not 1 <= self.exit_code <= 255:
            raise ValueError(f"fault exit_code {self.exit_code}; expected 1..255")

    def describe(self) -> str:
        return f"injected fault: worker {self.worker} {self.mode} at round {self.round}"


class FaultyTransport:
    """A transport that fails as ``plan`` says; ``on_exit(code)`` and ``on_hang()`` never return."""

    def __init__(self, inner, plan: FaultPlan, on_exit: Callable[[int], None],
                 on_hang: Callable[[], None]):
        self.inner, self.plan = inner, plan
        self._on_exit, self._on_hang = on_exit, on_hang
        self.injected = 0  # how many times the fault fired (0 or 1: the failure ends the worker)

    def send(self, peer: int, round_idx: int, kind: str, tensor: torch.Tensor,
             raw_nbytes: int | None = None) -> None:
        if self.plan.mode == "poison" and round_idx >= self.plan.round:
            self.injected += 1
            tensor = _poisoned(tensor)  # a fresh tensor: ownership holds
        else:
            self._maybe_fail(round_idx)
        if raw_nbytes is None:  # an uncompressed message: the protocol's four arguments
            self.inner.send(peer, round_idx, kind, tensor)
        else:
            self.inner.send(peer, round_idx, kind, tensor, raw_nbytes=raw_nbytes)

    def recv(self, peer: int, round_idx: int, kind: str) -> torch.Tensor:
        self._maybe_fail(round_idx)
        return self.inner.recv(peer, round_idx, kind)

    def all_reduce_mean(self, round_idx: int, tensor: torch.Tensor,
                        members=None, reduce=None) -> torch.Tensor:
        self._maybe_fail(round_idx)
        return self.inner.all_reduce_mean(round_idx, tensor, members, reduce)

    def start_all_reduce_mean(self, round_idx: int, tensor: torch.Tensor, members=None,
                              reduce=None):
        self._maybe_fail(round_idx)
        return self.inner.start_all_reduce_mean(round_idx, tensor, members, reduce)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # counters, clock, and each transport's own calls

    def _maybe_fail(self, round_idx: int) -> None:
        if round_idx < self.plan.round or self.plan.mode == "poison":
            return
        self.injected += 1
        if self.plan.mode == "exit":
            self._on_exit(self.plan.exit_code)
        elif self.plan.mode == "hang":
            self._on_hang()
        raise InjectedFault(self.plan.describe())


def plan_from_config(cfg) -> FaultPlan | None:
    """The fault a resolved ``Config`` asks for (section ``fault``), or None."""
    f = cfg.fault
    if f.worker < 0:
        return None
    return FaultPlan(f.worker, f.round, f.mode, f.exit_code)


def with_fault(transport, plan: FaultPlan | None, rank: int, on_exit: Callable[[int], None],
               on_hang: Callable[[], None]):
    """``transport`` wrapped for the worker the plan names; every other worker's as it is."""
    if plan is None or plan.worker != rank:
        return transport
    return FaultyTransport(transport, plan, on_exit, on_hang)


def _poisoned(tensor: torch.Tensor) -> torch.Tensor:
    """NaN values; a compressed frame all 0xff bytes (NaN scales and bf16 values; a sparse
    codec's indices out of range, so its receivers drop it)."""
    if tensor.is_floating_point():
        return torch.full_like(tensor, float("nan"))
    return torch.full_like(tensor, 255)
