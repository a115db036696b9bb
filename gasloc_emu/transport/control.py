"""Control plane between the launcher and its workers: ipc:// sockets in the run directory.

A Unix socket path reaches across network namespaces and is never shaped, so control traffic
(start, stop, heartbeats, metrics, final parameters) never competes with the emulated links.

    launcher ROUTER  <-  worker DEALER (identity b"w<rank>"): ready, metric, final, error,
                                                              departed (a scenario's leave),
                                                              avail (a2cid2), round (events
                                                              at a time);
                                                              start, stop, exit, pair,
                                                              fixings
    launcher PULL    <-  worker PUSH (heartbeat thread): hb {worker, round, step, state, peer,
                                                            sent, dropped, drop_reasons;
                                                            optional: speed, round_steps,
                                                            wait_share}

Every message is msgpack; final parameters travel as one extra raw frame. No pickle. Each is a
typed message whose ``to_wire`` is what is packed (``orders``: the launcher's to its workers).

What the launcher receives is untrusted: ``parse`` turns a decoded map into one of the frozen
message classes (``MESSAGES`` is the allow-list of types), checking every field's type and range
against what the launcher knows (``Expect``), and raises ``ControlError(reason)`` for anything
else, never another exception. Reasons are short codes from this module (``<type>.<field>``,
``type``, ``undecodable``...), never wire strings, so drop counters stay bounded.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import msgpack
import torch
import zmq

from gasloc_emu.transport import auth
from gasloc_emu.transport.orders import Back, Exit, Lost, Order, Stop, Wire, parse_order
from gasloc_emu.transport.zmq_sockets import check_tcp_addr


def ctl_paths(run_dir: str | os.PathLike) -> tuple[str, str]:
    """(control endpoint, heartbeat endpoint) for a run directory.

    Unix socket paths are limited to about 107 bytes, so long run directories get a short
    symlink-free path under the system's temp folder instead.
    """
    base = Path(run_dir).resolve()
    if len(str(base)) > 80:
        base = Path("/tmp") / f"gasloc-{os.getpid()}-{abs(hash(str(base))) % 10**8}"
        base.mkdir(parents=True, exist_ok=True)
    return f"ipc://{base}/ctl.sock", f"ipc://{base}/hb.sock"


def pack(msg: dict) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def unpack(raw: bytes) -> dict:
    """A control message, or a dict with type 'invalid' (never raises on bad bytes)."""
    try:
        msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError):
        return {"type": INVALID}
    return msg if isinstance(msg, dict) and isinstance(msg.get("type"), str) else {"type": INVALID}


# -- typed messages, worker -> launcher (untrusted: every field checked)

INVALID = "invalid"  # unpack's type for bytes that are not a msgpack map with a str type
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
# "joining": a successor process between its start and its first round (a join's copy)
STATES = ("starting", "joining", "computing", "waiting", "sending", "evaluating", "done")
MAX_ERROR_CHARS = 16_384  # a worker's exception text; anything longer is not an error report
MAX_DEVICE_CHARS = 64
MAX_ADDR_CHARS = 270      # tcp:// + a DNS name (at most 253) + :port
MAX_DROP_REASONS = 64     # distinct data-plane drop reasons (framing's and the mailbox's codes)
_DROP_REASON = re.compile(r"[a-z][a-z0-9_.-]{0,31}")
_DEVICE = re.compile(r"[a-z]+(:[0-9]{1,4})?")  # cpu, cuda:0, mps
_RANK_KEY = re.compile(r"0|[1-9][0-9]{0,5}")   # a rank as a map key in text (ASCII digits only)


class ControlError(ValueError):
    """A control message the launcher will not act on. ``reason`` is a short code for its drop
    counter, made here and never copied from the wire; ``str()`` says why in words."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Expect:
    """What the launcher knows that every message must agree with."""

    workers: int  # ranks are 0 .. workers-1
    rounds: int   # rounds are 0 .. rounds-1
    numel: int    # parameters of the configured model
    requests: int = 0  # a2cid2: exchange requests per worker at most (0: as many as rounds)


@dataclass(frozen=True)
class Heartbeat(Wire):
    """Every ``heartbeat_s`` on the PUSH socket: where the worker is, and its cumulative
    data-plane counters (bytes per peer for the link meters, drops by reason for the display)."""

    TYPE: ClassVar[str] = "hb"
    worker: int
    round: int               # -1 before the first round
    step: int
    state: str               # one of STATES
    peer: int | None         # the peer it waits for or sends to
    sent: dict[int, int]     # bytes sent per peer
    dropped: int
    drop_reasons: dict[str, int]
    # the compute model's view (absent from older workers): the worker's speed, the inner steps
    # of its last round, and the share of its time so far spent waiting for peers
    speed: float | None = None
    round_steps: int | None = None
    wait_share: float | None = None
    # bytes per source that reached this worker (the links' delivered side, for the meters)
    arrived: dict[int, int] | None = None

    @classmethod
    def from_wire(cls, wire: dict, expect: Expect) -> Heartbeat:
        _fields(wire, "hb", ("type", "worker", "round", "step", "state", "peer", "sent",
                             "dropped", "drop_reasons"), _HB_FIELDS)
        worker = _worker(wire, "hb", expect)
        dropped, reasons = _drops("hb", wire["dropped"], wire["drop_reasons"])
        extra = {name: check(f"hb.{name}", wire[name])
                 for name, check in _HB_OPTIONAL.items() if wire.get(name) is not None}
        if wire.get("arrived") is not None:
            extra["arrived"] = _peer_counts("hb.arrived", wire["arrived"], expect)
        return cls(worker, _int("hb.round", wire["round"], -1, expect.rounds - 1),
                   _int("hb.step", wire["step"], 0), _choice("hb.state", wire["state"], STATES),
                   _peer("hb.peer", wire["peer"], worker, expect),
                   _peer_counts("hb.sent", wire["sent"], expect), dropped, reasons, **extra)


@dataclass(frozen=True)
class Ready(Wire):
    """The worker built its model and bound its data-plane address; it waits for start."""

    TYPE: ClassVar[str] = "ready"
    worker: int
    addr: str    # tcp://HOST:PORT, a concrete host and port
    device: str  # as named inside the worker: cpu, cuda:0

    @classmethod
    def from_wire(cls, wire: dict, expect: Expect) -> Ready:
        _fields(wire, "ready", ("type", "worker", "addr", "device"))
        return cls(_worker(wire, "ready", expect), _addr("ready.addr", wire["addr"]),
                   _text("ready.device", wire["device"], MAX_DEVICE_CHARS, _DEVICE))


@dataclass(frozen=True)
class Metric(Wire):
    """One round's row of metrics.jsonl (``worker.RoundStats`` plus time_s and dropped)."""

    TYPE: ClassVar[str] = "metric"
    worker: int
    row: dict

    @classmethod
    def from_wire(cls, wire: dict, expect: Expect) -> Metric:
        _fields(wire, "metric", ("type", "worker", "row"))
        worker = _worker(wire, "metric", expect)
        return cls(worker, _row(wire["row"], worker, expect))


@dataclass(frozen=True)
class Final(Wire):
    """The worker's last words before exit: its eval loss, counters, and (in one extra raw
    frame) ``numel`` parameters of ``dtype``."""

    TYPE: ClassVar[str] = "final"
    worker: int
    eval_loss: float | None
    dtype: str     # a key of DTYPES
    numel: int     # the configured model's parameter count
    counters: dict  # bytes_sent, bytes_recv (per peer), dropped, wait_s, drop_reasons

    @classmethod
    def from_wire(cls, wire: dict, expect: Expect) -> Final:
        _fields(wire, "final", ("type", "worker", "eval_loss", "dtype", "numel", "counters"))
        loss = wire["eval_loss"]
        return cls(_worker(wire, "final", expect),
                   None if loss is None else _float("final.eval_loss", loss),
                   _choice("final.dtype", wire["dtype"], tuple(DTYPES)),
                   _int("final.numel", wire["numel"], expect.numel, expect.numel),
                   _counters(wire["counters"], expect))


@dataclass(frozen=True)
class Departed(Wire):
    """A worker leaving as its scenario says (its process is killed next): its counters so
    far, so that the record still counts what it sent once a successor counts from 0. Its
    peers hear nothing: this goes to the launcher only."""

    TYPE: ClassVar[str] = "departed"
    worker: int
    counters: dict  # as Final's

    @classmethod
    def from_wire(cls, wire: dict, expect: Expect) -> Departed:
        _fields(wire, "departed", ("type", "worker", "counters"))
        return cls(_worker(wire, "departed", expect),
                   _counters(wire["counters"], expect, "departed.counters"))


@dataclass(frozen=True)
class Error(Wire):
    """The worker failed and is exiting; ``diverged_at`` ({worker, round}) when it saw
    non-finite numbers, so the launcher can tell a divergence from a failure."""

    TYPE: ClassVar[str] = "error"
    worker: int
    error: str
    diverged_at: dict | None = None

    @classmethod
    def from_wire(cls, wire: dict, expect: Expect) -> Error:
        _fields(wire, "error", ("type", "worker", "error"), ("diverged_at",))
        where = wire.get("diverged_at")
        return cls(_worker(wire, "error", expect),
                   _text("error.error", wire["error"], MAX_ERROR_CHARS),
                   None if where is None else _where("error.diverged_at", where, expect))


@dataclass(frozen=True)
class Avail(Wire):
    """Asynchronous gossip (a2cid2): the worker's exchange request number ``request`` (from 0,
    at most ``Expect.requests`` in a run) waits for a peer (the launcher's pairer answers with a
    ``pair`` message), or, with ``finished``, it has taken its last step and will not ask
    again."""

    TYPE: ClassVar[str] = "avail"
    worker: int
    request: int
    finished: bool

    @classmethod
    def from_wire(cls, wire: dict, expect: Expect) -> Avail:
        return cls(*_rank_round_flag(wire, "avail", "request", "finished", expect,
                                     expect.requests or expect.rounds))


@dataclass(frozen=True)
class RoundStart(Wire):
    """A scenario with leaves, joins or partitions at a time: the worker starts round
    ``round`` and waits for every fixing so far (``fixing.RoundFixer``); with ``waiting`` it
    is absent until a join not fixed yet, and the answer comes once that join is fixed (or
    ``released`` when the run ends first)."""

    TYPE: ClassVar[str] = "round"
    worker: int
    round: int
    waiting: bool

    @classmethod
    def from_wire(cls, wire: dict, expect: Expect) -> RoundStart:
        return cls(*_rank_round_flag(wire, "round", "round", "waiting", expect))


def _rank_round_flag(wire: dict, kind: str, round_key: str, flag_key: str,
                     expect: Expect, count: int | None = None) -> tuple[int, int, bool]:
    """(worker, a number below ``count`` (the run's rounds by default), a bool) of a message
    with exactly those fields."""
    _fields(wire, kind, ("type", "worker", round_key, flag_key))
    if type(wire[flag_key]) is not bool:
        raise ControlError(f"{kind}.{flag_key}", f"expected a bool, got {_show(wire[flag_key])}")
    hi = (expect.rounds if count is None else count) - 1
    return (_worker(wire, kind, expect), _int(f"{kind}.{round_key}", wire[round_key], 0, hi),
            wire[flag_key])


Message = Heartbeat | Ready | Metric | Final | Departed | Error | Avail | RoundStart
# the allow-list: a type name off the wire only ever selects one of these
MESSAGES: dict[str, type] = {cls.TYPE: cls for cls in (Heartbeat, Ready, Metric, Final, Departed,
                                                        Error, Avail, RoundStart)}


def parse(msg, expect: Expect) -> Message:
    """The typed message in a decoded map; ControlError for anything else, on any input."""
    if not isinstance(msg, dict):
        raise ControlError("map", f"a control message is a map, got {type(msg).__name__}")
    kind = msg.get("type")
    if kind == INVALID and type(kind) is str:
        raise ControlError("undecodable", "not a msgpack map with a str type")
    cls = MESSAGES.get(kind) if type(kind) is str else None
    if cls is None:
        raise ControlError("type", f"unknown message type {_show(kind)}")
    return cls.from_wire(msg, expect)


def decode(raw: bytes, expect: Expect) -> Message:
    """``parse(unpack(raw))``: the typed message in raw bytes, or ControlError."""
    return parse(unpack(raw), expect)


# -- field checks: each returns the checked value or raises ControlError(reason)

def _fields(wire: dict, reason: str, required: tuple[str, ...],
            optional: tuple[str, ...] = ()) -> None:
    """Exactly these fields: a missing or an unknown one means sender and launcher disagree."""
    missing = [name for name in required if name not in wire]
    unknown = set(wire) - set(required) - set(optional)
    if missing or unknown:
        shown = sorted(_show(k) for k in list(unknown)[:5])
        raise ControlError(f"{reason}.fields", f"missing {missing}, unknown {shown}")


def _worker(wire: dict, kind: str, expect: Expect) -> int:
    return _int(f"{kind}.worker", wire["worker"], 0, expect.workers - 1)


def _int(reason: str, value, lo: int, hi: int | None = None) -> int:
    """An int (a bool is not one here) in [lo, hi]."""
    if type(value) is not int or value < lo or (hi is not None and value > hi):
        raise ControlError(reason, f"{_show(value)} is not an int in "
                                   f"[{lo}, {'inf' if hi is None else hi}]")
    return value


def _float(reason: str, value, lo: float = -math.inf) -> float:
    """A finite number >= lo, as a float (an int up to 2**53 is taken exactly; a bool is not)."""
    if type(value) is int and abs(value) <= 2**53:
        value = float(value)
    if type(value) is not float or not math.isfinite(value) or value < lo:
        raise ControlError(reason, f"{_show(value)} is not a finite number >= {lo}")
    return value


def _choice(reason: str, value, options: tuple[str, ...]) -> str:
    if type(value) is not str or value not in options:
        raise ControlError(reason, f"{_show(value)} is not one of {list(options)}")
    return value


def _text(reason: str, value, max_chars: int, pattern: re.Pattern | None = None) -> str:
    """A str of 1..max_chars printable characters (newlines and tabs allowed), matching
    ``pattern`` when given: it ends up on the user's terminal and in the record."""
    ok = type(value) is str and 0 < len(value) <= max_chars
    if ok and pattern is not None:
        ok = pattern.fullmatch(value) is not None
    if not ok or not all(c.isprintable() or c in "\n\t" for c in value):
        raise ControlError(reason, f"{_show(value)} is not printable text of 1..{max_chars} "
                                   f"characters" + (" of the expected form" if pattern else ""))
    return value


def _addr(reason: str, value) -> str:
    _text(reason, value, MAX_ADDR_CHARS)
    try:
        return check_tcp_addr(value, "ready.addr")
    except ValueError as exc:
        raise ControlError(reason, str(exc)) from None


def _peer(reason: str, value, worker: int, expect: Expect) -> int | None:
    """None, or a rank other than the worker's own."""
    if value is None:
        return None
    peer = _int(reason, value, 0, expect.workers - 1)
    if peer == worker:
        raise ControlError(reason, f"worker {worker} names itself as its peer")
    return peer


def _rank_key(reason: str, key, expect: Expect) -> int:
    """A rank as a map key: an int, or its decimal text (JSON-shaped senders)."""
    if type(key) is str and _RANK_KEY.fullmatch(key):
        key = int(key)
    return _int(reason, key, 0, expect.workers - 1)


def _rank_map(reason: str, value, expect: Expect, what: str, item) -> dict[int, Any]:
    """{rank: item(entry)}, at most one entry per rank (``what``: the entries, for errors)."""
    if not isinstance(value, dict) or len(value) > expect.workers:
        raise ControlError(reason, f"{_show(value)} is not a map of at most {expect.workers} "
                                   f"ranks to {what}")
    out: dict[int, Any] = {}
    for key, entry in value.items():
        rank = _rank_key(reason, key, expect)
        if rank in out:
            raise ControlError(reason, f"rank {rank} appears twice")
        out[rank] = item(entry)
    return out


def _peer_counts(reason: str, value, expect: Expect) -> dict[int, int]:
    """{rank: count >= 0}, at most one entry per rank."""
    return _rank_map(reason, value, expect, "counts", lambda count: _int(reason, count, 0))


def _drops(kind: str, dropped, reasons) -> tuple[int, dict[str, int]]:
    """(dropped, {reason: count}), with dropped the sum of the counts, as the mailbox keeps them."""
    reason = f"{kind}.drop_reasons"
    if not isinstance(reasons, dict) or len(reasons) > MAX_DROP_REASONS:
        raise ControlError(reason, f"{_show(reasons)} is not a map of at most "
                                   f"{MAX_DROP_REASONS} reasons to counts")
    out: dict[str, int] = {}
    for key, count in reasons.items():
        if type(key) is not str or _DROP_REASON.fullmatch(key) is None:
            raise ControlError(reason, f"{_show(key)} is not a drop reason code")
        out[key] = _int(reason, count, 0)
    total = _int(f"{kind}.dropped", dropped, 0)
    if total != sum(out.values()):
        raise ControlError(f"{kind}.dropped", f"{total} dropped, but the reasons add up to "
                                              f"{sum(out.values())}")
    return total, out


def _counters(value, expect: Expect, where: str = "final.counters") -> dict:
    """The data-plane transport's counters (``ZmqTransport.counters()``)."""
    if not isinstance(value, dict):
        raise ControlError(where, f"{_show(value)} is not a map")
    _fields(value, where, ("bytes_sent", "bytes_recv", "raw_bytes_sent", "dropped", "wait_s",
                           "drop_reasons"))
    dropped, reasons = _drops(where, value["dropped"], value["drop_reasons"])
    peers = {k: _peer_counts(f"{where}.{k}", value[k], expect)
             for k in ("bytes_sent", "bytes_recv", "raw_bytes_sent")}
    return peers | {"dropped": dropped, "drop_reasons": reasons,
                    "wait_s": _float(f"{where}.wait_s", value["wait_s"], 0.0)}


def _where(reason: str, value, expect: Expect) -> dict:
    if not isinstance(value, dict):
        raise ControlError(reason, f"{_show(value)} is not a map")
    _fields(value, reason, ("worker", "round"))
    return {"worker": _int(reason, value["worker"], 0, expect.workers - 1),
            "round": _int(reason, value["round"], 0, expect.rounds - 1)}


def _speed(reason: str, value) -> float:
    """A worker's speed: a number in (0, 1]."""
    speed = _float(reason, value, 0.0)
    if not 0.0 < speed <= 1.0:
        raise ControlError(reason, f"{_show(value)} is not a speed in (0, 1]")
    return speed


def _share(reason: str, value) -> float:
    """A fraction of time: a number in [0, 1]."""
    share = _float(reason, value, 0.0)
    if share > 1.0:
        raise ControlError(reason, f"{_show(value)} is not a share in [0, 1]")
    return share


# the heartbeat's optional fields: field -> check(reason, value)
_HB_OPTIONAL = {
    "speed": _speed,
    "round_steps": lambda r, v: _int(r, v, 0),
    "wait_share": _share,
}
_HB_FIELDS = (*_HB_OPTIONAL, "arrived")

# a metrics row: field -> check(reason, value, expect); eval_loss only in evaluated rounds, the
# compute model's fields (steps, speed, overruns, overrun_ratio) and the recipe's (tokens, lr:
# the scheduled lr) absent from older workers
_ROW = {
    "worker": lambda r, v, e: _int(r, v, 0, e.workers - 1),
    "round": lambda r, v, e: _int(r, v, 0, e.rounds - 1),
    "step": lambda r, v, e: _int(r, v, 0),
    "train_loss": lambda r, v, e: _float(r, v),
    "compute_s": lambda r, v, e: _float(r, v, 0.0),
    "comm_s": lambda r, v, e: _float(r, v, 0.0),
    "wait_s": lambda r, v, e: _float(r, v, 0.0),
    "bytes_sent": lambda r, v, e: _int(r, v, 0),
    "bytes_recv": lambda r, v, e: _int(r, v, 0),
    "peers": lambda r, v, e: _ranks(r, v, e),
    "time_s": lambda r, v, e: _float(r, v),
    "dropped": lambda r, v, e: _int(r, v, 0),
    "eval_loss": lambda r, v, e: _float(r, v),
    "steps": lambda r, v, e: _int(r, v, 0),
    "speed": lambda r, v, e: _speed(r, v),
    "overruns": lambda r, v, e: _int(r, v, 0),
    "overrun_ratio": lambda r, v, e: _float(r, v, 0.0),
    "tokens": lambda r, v, e: _int(r, v, 0),
    "lr": lambda r, v, e: _float(r, v, 0.0),
    "recv_links": lambda r, v, e: _recv_links(r, v, e),
    "step_span_s": lambda r, v, e: _span(r, v),
    "exchange_spans_s": lambda r, v, e: _spans(r, v),
    "dead_peer": lambda r, v, e: _dead_peer(r, v, e),
    "uncommitted": lambda r, v, e: _true(r, v),
}
_ROW_OPTIONAL = ("eval_loss", "steps", "speed", "overruns", "overrun_ratio", "tokens", "lr",
                 "recv_links", "step_span_s", "exchange_spans_s", "dead_peer", "uncommitted")
MAX_KIND_CHARS = 32   # a wire kind's name ("z", "rs3", ...)
MAX_SPANS = 8  # a2cid2's exchanges per slot at most (algorithms.a2cid2.MAX_EXCHANGES_PER_SLOT)


def _true(reason: str, value) -> bool:
    """A flag present only when set (a row's ``uncommitted``)."""
    if value is not True:
        raise ControlError(reason, f"{_show(value)} is not true (leave the field out instead)")
    return True


def _dead_peer(reason: str, value, expect: Expect) -> list[list]:
    """The messages a worker did without since its last row, their sender lost with its host:
    [[src rank, round, kind], ...], at most one per peer and kind of a round of each peer
    (a row covers one round; overlapped GASLoC's lands the one before): 2 per other worker."""
    if type(value) is not list or not 0 < len(value) <= 2 * expect.workers:
        raise ControlError(reason, f"{_show(value)} is not a list of 1 to {2 * expect.workers} "
                                   "messages")
    out = []
    for item in value:
        if type(item) is not list or len(item) != 3 or type(item[2]) is not str or \
                not 0 < len(item[2]) <= MAX_KIND_CHARS:
            raise ControlError(reason, f"{_show(item)} is not a [src, round, kind] triple")
        out.append([_int(reason, item[0], 0, expect.workers - 1),
                    _int(reason, item[1], 0, expect.rounds - 1), item[2]])
    return out


def _span(reason: str, value) -> list[float]:
    """[start, end] on the run's clock, start <= end."""
    if type(value) is not list or len(value) != 2:
        raise ControlError(reason, f"{_show(value)} is not a [start, end] pair")
    a, b = _float(reason, value[0]), _float(reason, value[1])
    if b < a:
        raise ControlError(reason, f"span [{a}, {b}] ends before it starts")
    return [a, b]


def _spans(reason: str, value) -> list[list[float]]:
    if type(value) is not list or len(value) > MAX_SPANS:
        raise ControlError(reason, f"{_show(value)} is not a list of at most {MAX_SPANS} spans")
    return [_span(reason, v) for v in value]
_LINK_USE = ("bytes", "messages", "transfer_s", "sent_s")


def _recv_links(reason: str, value, expect: Expect) -> dict[str, dict]:
    """A row's link observations (``worker.link_row``): {rank text: {bytes, messages,
    transfer_s, sent_s}}. Only a measurement, never acted on, but checked like any field."""
    uses = _rank_map(reason, value, expect, "link observations", lambda u: _link_use(reason, u))
    return {str(rank): use for rank, use in uses.items()}


def _link_use(reason: str, use) -> dict:
    if not isinstance(use, dict):
        raise ControlError(reason, f"{_show(use)} is not a map")
    _fields(use, reason, _LINK_USE)
    return {"bytes": _int(reason, use["bytes"], 0), "messages": _int(reason, use["messages"], 1),
            "transfer_s": _float(reason, use["transfer_s"], 0.0),
            "sent_s": _float(reason, use["sent_s"])}


def _row(value, worker: int, expect: Expect) -> dict:
    if not isinstance(value, dict):
        raise ControlError("metric.row", f"{_show(value)} is not a map")
    _fields(value, "metric.row", tuple(k for k in _ROW if k not in _ROW_OPTIONAL), _ROW_OPTIONAL)
    row = {name: check(f"metric.row.{name}", value[name], expect)
           for name, check in _ROW.items() if name in value}
    if row["worker"] != worker:
        raise ControlError("metric.row.worker", f"row of worker {row['worker']} sent by {worker}")
    return row


def _ranks(reason: str, value, expect: Expect) -> list[int]:
    if type(value) is not list or len(value) > expect.workers:
        raise ControlError(reason, f"{_show(value)} is not a list of at most {expect.workers} "
                                   f"ranks")
    return [_int(reason, v, 0, expect.workers - 1) for v in value]


def _show(value) -> str:
    """A short rendering of a wire value for an error's text. Containers are named by type only
    (the repr of a deeply nested one can recurse too far), big ints by size (their repr can
    raise)."""
    if type(value) is int and abs(value) >= 2**64:
        return f"an int of {value.bit_length()} bits"
    if value is None or type(value) in (bool, int, float):
        return repr(value)
    if type(value) in (str, bytes):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def tensor_frame(t: torch.Tensor) -> memoryview:
    """A zero-copy view of a contiguous CPU tensor's bytes."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())  # via bytes: numpy has no bfloat16


def frame_tensor(frame: zmq.Frame | bytes, dtype: str, numel: int) -> torch.Tensor:
    """The final parameters from their raw frame; ControlError for a dtype outside ``DTYPES``
    (the name comes off the wire: never looked up on torch) or a frame that is not ``numel``
    values of it."""
    torch_dtype = DTYPES.get(dtype) if isinstance(dtype, str) else None
    if torch_dtype is None:
        raise ControlError("final.dtype", f"dtype {_show(dtype)} not in {sorted(DTYPES)}")
    buf = memoryview(frame.buffer if isinstance(frame, zmq.Frame) else frame)
    if buf.nbytes != numel * torch_dtype.itemsize:
        raise ControlError("final.frame", f"final parameters hold {buf.nbytes} bytes of {dtype} "
                                          f"({buf.nbytes / torch_dtype.itemsize:g} values); "
                                          f"expected {numel}")
    if numel == 0:
        return torch.empty(0, dtype=torch_dtype)  # frombuffer refuses empty buffers
    return torch.frombuffer(bytearray(buf), dtype=torch_dtype)


class WorkerControl:
    """The worker's end: a DEALER for requests and replies, a PUSH for heartbeats."""

    def __init__(self, ctx: zmq.Context, ctl_addr: str, rank: int,
                 security: auth.Security | None = None):
        self.rank, self.security = rank, security  # the worker's data plane uses it too
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"w{rank}".encode())
        self.sock.setsockopt(zmq.LINGER, 2000)
        if security is not None:  # the launcher's ROUTER authenticates every worker (ZAP)
            auth.make_client(self.sock, security, auth.user_id(rank), auth.LAUNCHER)
        self.sock.connect(ctl_addr)
        self.stop_requested = False
        # node 0's decisions on hosts lost without warning and back, in order (``orders.Lost``,
        # ``orders.Back``): kept whenever they come, the worker plays them at its next chance
        self.decisions: list[Lost | Back] = []
        # other orders read while polling for a stop (``poll_stop``), kept for ``wait_for``
        self.pending: list[Order] = []

    def send(self, msg: Wire, *frames) -> None:
        self.sock.send_multipart([pack(msg.to_wire()), *frames], copy=False)

    def wait_for(self, kind: type, timeout_s: float) -> Order:
        """Block until a message of ``kind`` (an ``orders`` class) or a ``Stop`` arrives."""
        for i, msg in enumerate(self.pending):
            if isinstance(msg, (kind, Stop)):
                return self.pending.pop(i)
        if self.sock.poll(int(timeout_s * 1000)):
            msg = parse_order(unpack(self.sock.recv()))
            self.stop_requested = self.stop_requested or isinstance(msg, Stop)
            if isinstance(msg, (Lost, Back)) and kind not in (Lost, Back):
                self.decisions.append(msg)
            return msg if isinstance(msg, (kind, Stop)) else self.wait_for(kind, timeout_s)
        raise TimeoutError(f"worker {self.rank}: no {kind.TYPE!r} from the launcher "
                           f"in {timeout_s:.0f} s")

    def poll_stop(self) -> bool:
        """True once the launcher asked this worker to stop (non-blocking)."""
        while not self.stop_requested and self.sock.poll(0):
            wire = unpack(self.sock.recv())
            if wire["type"] in (Stop.TYPE, Exit.TYPE):
                self.stop_requested = True
            elif wire["type"] in (Lost.TYPE, Back.TYPE):
                self.decisions.append(parse_order(wire))
            else:   # an answer its wait_for has not asked for yet: not lost for it
                self.pending.append(parse_order(wire))
        return self.stop_requested

    def close(self) -> None:
        self.sock.close()
