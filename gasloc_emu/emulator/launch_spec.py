"""The launcher–worker contract: what every worker process of a run is told before it starts.

The launcher writes one ``LaunchSpec`` as ``launch.json`` in the run folder; each worker reads it
back (with its rank from the command line) and checks it field by field. A missing, unknown or
mistyped field is a ``SpecError`` naming the field, never a KeyError deep inside a worker.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

FILE_NAME = "launch.json"
# at most this long a worker that leaves as the scenario says flushes its last messages before
# it dies (its heartbeats stopped): the launcher counts it in before calling it silent
LEAVE_FLUSH_S = 10.0


class SpecError(ValueError):
    """launch.json does not hold a valid LaunchSpec."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a worker process needs besides the resolved config (config.toml)."""

    ctl_addr: str                   # control plane: the launcher's ROUTER (ipc://)
    heartbeat_addr: str             # control plane: the launcher's heartbeat PULL (ipc://)
    devices: tuple[str, ...]        # torch device per worker, as named inside it ("cpu", "cuda:0")
    bind_addrs: tuple[str, ...]     # data-plane address per worker (tcp://HOST:PORT, port 0 = any)
    shaping: dict | None            # the userspace shaper's spec (netem.userspace.spec_for) or None
    threads: int                    # torch CPU threads per worker
    heartbeat_s: float              # seconds between two heartbeats of a worker
    peer_timeout_s: float           # backstop for one wait on a peer's message
    start_timeout_s: float          # how long a ready worker waits for the launcher's start
    exit_timeout_s: float           # how long a finished worker waits for the launcher's exit
    link_ports: bool                # bind one port per sender (base + sender's rank): host tc
    resume_round: int = -1          # --resume: every worker restores its checkpoint of it

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "bind_addrs", tuple(self.bind_addrs))
        _check(self)

    @property
    def workers(self) -> int:
        return len(self.devices)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> LaunchSpec:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise SpecError(f"{FILE_NAME} is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise SpecError(f"{FILE_NAME} must hold an object, got {type(raw).__name__}")
        names = {f.name for f in fields(cls)}
        if set(raw) != names:
            raise SpecError(f"{FILE_NAME}: missing {sorted(names - set(raw))}, "
                            f"unknown {sorted(set(raw) - names)}")
        return cls(**raw)

    def write(self, run_dir: Path) -> Path:
        path = Path(run_dir) / FILE_NAME
        path.write_text(self.to_json())
        return path

    @classmethod
    def read(cls, run_dir: Path) -> LaunchSpec:
        return cls.from_json((Path(run_dir) / FILE_NAME).read_text())


_TYPES = {"ctl_addr": str, "heartbeat_addr": str, "threads": int, "resume_round": int,
          "heartbeat_s": float,
          "peer_timeout_s": float, "start_timeout_s": float, "exit_timeout_s": float}


def _check(spec: LaunchSpec) -> None:
    for name, typ in _TYPES.items():
        _check_type(name, getattr(spec, name), typ)
    for name in ("devices", "bind_addrs"):
        if not all(isinstance(v, str) for v in getattr(spec, name)):
            raise SpecError(f"{FILE_NAME}: {name} must be a list of strings")
    if not spec.devices or len(spec.devices) != len(spec.bind_addrs):
        raise SpecError(f"{FILE_NAME}: {len(spec.devices)} devices and {len(spec.bind_addrs)} "
                        "bind addresses; expected one of each per worker, at least one worker")
    if spec.shaping is not None and not isinstance(spec.shaping, dict):
        raise SpecError(f"{FILE_NAME}: shaping must be an object or null")
    if not isinstance(spec.link_ports, bool):
        raise SpecError(f"{FILE_NAME}: link_ports = {spec.link_ports!r}; expected true or false")
    if spec.resume_round < -1:
        raise SpecError(f"{FILE_NAME}: resume_round = {spec.resume_round}; expected -1 (a "
                        "fresh run) or a round")
    if spec.threads < 1:
        raise SpecError(f"{FILE_NAME}: threads = {spec.threads}; expected at least 1")


def _check_type(name: str, value, typ: type) -> None:
    ok = isinstance(value, typ) and not isinstance(value, bool)
    if typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value > 0
    if not ok:
        raise SpecError(f"{FILE_NAME}: {name} = {value!r}; expected "
                        + ("a positive number of seconds" if typ is float else typ.__name__))
