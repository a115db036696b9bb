"""The control plane's typed messages on the send side: ``Wire`` (each message's ``to_wire``,
the map ``control.pack`` sends) and what the launcher tells its workers (``Start``, ``Stop``,
``Exit``, ``Fixings``, ``Pair``), read back on the worker's side by ``parse_order``.

The worker's messages to the launcher (``control.Heartbeat``, ``Ready``, ...) are ``Wire``s
too, so no sender writes a message as a dict: a message's fields are its wire keys, plus
``type``. What the launcher says is trusted more than what it hears (the worker authenticated
the launcher's socket), but it is still read field by field: a message of another shape is an
``OrderError`` naming it, never a KeyError deep in the worker.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar


class OrderError(ValueError):
    """A launcher's message the worker cannot read: its type, or the field that is off."""


class Wire:
    """A control message's wire form: ``{"type": TYPE, field: value, ...}``; an optional field
    (one with a default) that holds None is left out, as the readers allow."""

    TYPE: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or f.default is dataclasses.MISSING:
                out[f.name] = value
        return out


@dataclass(frozen=True)
class Start(Wire):
    """Train: the peers' data-plane addresses (every worker ready so far) and the run's clock
    origin (a time.time() value)."""

    TYPE: ClassVar[str] = "start"
    peers: dict[int, str]
    t0: float

    def to_wire(self) -> dict[str, Any]:   # ranks as text, the JSON-shaped map it always was
        return super().to_wire() | {"peers": {str(r): a for r, a in self.peers.items()}}

    @classmethod
    def from_wire(cls, wire: dict) -> Start:
        _shape(wire, ("peers", "t0"))
        peers = wire["peers"]
        if not isinstance(peers, dict) or not all(isinstance(a, str) for a in peers.values()):
            raise OrderError(f"start.peers: {peers!r} is not a map of ranks to addresses")
        return cls({_rank("start.peers", k): a for k, a in peers.items()},
                   _number("start.t0", wire["t0"]))


@dataclass(frozen=True)
class Stop(Wire):
    """Stop now (Ctrl-C, a failure elsewhere): the worker leaves without its final report."""

    TYPE: ClassVar[str] = "stop"

    @classmethod
    def from_wire(cls, wire: dict) -> Stop:
        _shape(wire, ())
        return cls()


@dataclass(frozen=True)
class Exit(Wire):
    """The run is over and the final parameters are in: the worker may exit."""

    TYPE: ClassVar[str] = "exit"

    @classmethod
    def from_wire(cls, wire: dict) -> Exit:
        _shape(wire, ())
        return cls()


@dataclass(frozen=True)
class Fixings(Wire):
    """The answer to a ``round`` message: every fixing of a leave, join or partition at a time
    so far (``scenario.fixing.Fixing.to_json``), and ``released`` when the run ends before the
    waiting worker's join."""

    TYPE: ClassVar[str] = "fixings"
    released: bool
    fixings: list[dict]

    @classmethod
    def from_wire(cls, wire: dict) -> Fixings:
        _shape(wire, ("released", "fixings"))
        if type(wire["released"]) is not bool:
            raise OrderError(f"fixings.released: {wire['released']!r} is not a bool")
        if not isinstance(wire["fixings"], list) or \
                not all(isinstance(f, dict) for f in wire["fixings"]):
            raise OrderError("fixings.fixings: not a list of maps")
        return cls(wire["released"], list(wire["fixings"]))


@dataclass(frozen=True)
class Lost(Wire):
    """Node 0's decision on a host lost without warning (``scenario.hostloss.HostLoss``'s
    JSON, versioned; the worker checks it against its run): its workers leave at the loss's
    round, and their messages of the rounds before it that have not come never will. Sent to
    every surviving worker once, as soon as decided, before any later answer."""

    TYPE: ClassVar[str] = "lost"
    loss: dict

    @classmethod
    def from_wire(cls, wire: dict) -> Lost:
        _shape(wire, ("loss",))
        if not isinstance(wire["loss"], dict):
            raise OrderError("lost.loss: not a map")
        return cls(dict(wire["loss"]))


@dataclass(frozen=True)
class Back(Wire):
    """Node 0's decision on a lost host that came back (``scenario.hostloss.HostBack``'s
    JSON, versioned; checked by the worker against its run): its workers join at the
    decision's round. Sent to every living worker once, as soon as decided, and to each
    returning worker with every earlier decision before its start."""

    TYPE: ClassVar[str] = "back"
    back: dict

    @classmethod
    def from_wire(cls, wire: dict) -> Back:
        _shape(wire, ("back",))
        if not isinstance(wire["back"], dict):
            raise OrderError("back.back: not a map")
        return cls(dict(wire["back"]))


@dataclass(frozen=True)
class Pair(Wire):
    """Asynchronous gossip: worker ``worker``'s partner for its exchange (None: alone) and the
    exchange's label (``training.pairing.Pairing``)."""

    TYPE: ClassVar[str] = "pair"
    worker: int
    peer: int | None
    label: int

    @classmethod
    def from_wire(cls, wire: dict) -> Pair:
        _shape(wire, ("worker", "peer", "label"))
        peer = wire["peer"]
        return cls(_rank("pair.worker", wire["worker"]),
                   None if peer is None else _rank("pair.peer", peer),
                   _rank("pair.label", wire["label"]))


Order = Start | Stop | Exit | Fixings | Lost | Back | Pair
ORDERS: dict[str, type] = {cls.TYPE: cls for cls in (Start, Stop, Exit, Fixings, Lost, Back,
                                                     Pair)}


def parse_order(wire) -> Order:
    """The typed message in a decoded map from the launcher; OrderError for anything else."""
    kind = wire.get("type") if isinstance(wire, dict) else None
    cls = ORDERS.get(kind) if type(kind) is str else None
    if cls is None:
        raise OrderError(f"the launcher sent a message of unknown type {kind!r}")
    return cls.from_wire(wire)


def _shape(wire: dict, names: tuple[str, ...]) -> None:
    keys = set(wire) - {"type"}
    if keys != set(names):
        raise OrderError(f"{wire['type']}: fields {sorted(keys)}, expected {sorted(names)}")


def _rank(reason: str, value) -> int:
    """A rank or count >= 0: an int, or its decimal text (a JSON-shaped map's key)."""
    if type(value) is str and value.isdigit():
        value = int(value)
    if type(value) is not int or value < 0:
        raise OrderError(f"{reason}: {value!r} is not an int >= 0")
    return value


def _number(reason: str, value) -> float:
    if type(value) not in (int, float):
        raise OrderError(f"{reason}: {value!r} is not a number")
    return float(value)
