"""The emulator's data plane: one worker's ``Transport`` over ZeroMQ TCP sockets.

Sockets. Every worker binds one PULL socket on the data-plane address the launcher gave it
(port 0 picks a free port; ``address`` says which) and, on its first send to a peer, connects one
PUSH socket to that peer's address (given to the constructor or later to ``connect``). A PUSH
socket queues messages until the peer is up, so workers may start in any order. TCP only: the
data plane must cross the shaped veths, and binding a wildcard address would bypass them.

Zero copy. A send hands libzmq a view of the tensor's memory (``framing.encode``); libzmq keeps
the view, hence the tensor, alive until the bytes are out. That is why ``send`` takes ownership
of the tensor (``base``). A receive views the frame's memory as a tensor, so a received tensor
lives exactly as long as the algorithm holds it.

Mailbox. This worker reads its socket only while it waits inside ``recv`` or a blocked ``send``
(no background thread competing with training for the two cores). Whatever arrives is decoded
and validated (``framing``), then handed to a ``mailbox.Mailbox``, which owns every rule about
what is kept and for how long: the round window, duplicates, stale rounds, the shaper's release
queue and the per-peer bounds (``max_msgs_per_peer``, ``max_bytes_per_peer``; by default a
multiple of the model's size that no legitimate traffic reaches). A dropped message is counted
in ``dropped`` and in ``drop_reasons`` and never touches parameters.

Shaping. With a userspace shaper the sender stamps each message with ``shaping.stamp(...)``
(its delivery time, or None) and the receiver's mailbox holds it in a release queue until
``shaping.release_at(...)``. Arrival times then matter (a delay-only shaper releases a message
one latency after it arrived), so a small receive thread owns the bound socket, stamps each
message with its arrival time and forwards it over inproc:// to the worker thread; a message
that arrives while the worker computes is thus released on time, not one latency after the
worker next looks. Without a shaper the worker thread reads the socket itself. Waits are sliced
(at most POLL_SLICE_S, and never past the next release) so that ``should_stop`` can abort them
and releases are on time.

Link measurement. Every message carries ``sent_at``, when ``send`` was called; when ``recv``
hands a message to the algorithm, its bytes and its transfer time (from ``sent_at`` to when it
became available here) are noted by round and source (``recv_links``), so that the record can
say what rate a link delivered after a change. Only a measurement: nothing acts on it.

Authentication (``security``; ``auth``). The PULL socket is a ZAP server and every PUSH socket
a client logging in as this worker, with the run's credentials (PLAIN, or CURVE, which also
encrypts). A connection without the run's keys never completes its handshake, so nothing it
sends reaches the mailbox; the handshakes refused are counted in ``drop_reasons`` ("zap.*").
The sender of a message is the authenticated peer: a header whose ``src`` is not the
connection's user id is dropped as "spoofed". Without ``security`` (unit tests, the benchmark's
unauthenticated path) the plane is open; ``worker_process`` always passes it.

Exact validation. Every message must have the kind, dtype and shape that ``schema`` (by default
the algorithms' messages for a model of ``max_numel`` parameters) names for its sender.

One worker thread calls send/recv; nothing here is thread-safe for callers.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import torch
import zmq

from gasloc_emu.transport import auth, framing
from gasloc_emu.transport.base import (
    DEAD_PEER,
    PeerLost,
    PendingReduce,
    TransportBase,
    TransportError,
)
from gasloc_emu.transport.framing import FrameError
from gasloc_emu.transport.mailbox import (
    Key,
    LinkUse,
    Mailbox,
    PeerBounds,
    RecvLinks,
    Shaping,
)
from gasloc_emu.transport.schema import WireSchema
from gasloc_emu.transport.zmq_sockets import DataSockets, check_tcp_addr

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11

POLL_SLICE_S = 0.05        # longest wait between two should_stop checks
MAX_DRAIN_MSGS = 64        # messages read per wake-up before checking stop and deadlines again
DEFAULT_LINGER_S = 2.0
# CURVE wraps each frame in a MESSAGE command (8 bytes), nonce (8), flags (1) and MAC (16);
# libzmq checks MAXMSGSIZE against that, so a model-sized frame needs this much more room.
CURVE_FRAME_OVERHEAD = 64
DEFAULT_RECV_TIMEOUT_S = 600.0
# A neighbour can run ahead of this worker by about log2(world size) rounds under
# time-varying matchings; a message dropped for being "too early" would stall its round.
DEFAULT_MAX_ROUNDS_AHEAD = 16



class ZmqTransport(TransportBase):
    def __init__(self, rank: int, world_size: int, bind_addr: str,
                 peer_addrs: dict[int, str] | None = None, *, max_numel: int,
                 dtype: torch.dtype = torch.float32,
                 shaping: Shaping | None = None,
                 recv_timeout_s: float = DEFAULT_RECV_TIMEOUT_S,
                 max_rounds_ahead: int = DEFAULT_MAX_ROUNDS_AHEAD,
                 max_msgs_per_peer: int | None = None,
                 max_bytes_per_peer: int | None = None,
                 linger_s: float = DEFAULT_LINGER_S,
                 should_stop: Callable[[], bool] | None = None,
                 ctx: zmq.Context | None = None,
                 schema: WireSchema | None = None,
                 security: auth.Security | None = None,
                 link_ports: bool = False,
                 dead_peers: Callable[[], Collection[int]] | None = None):
        """``dead_peers``: the peers lost with their hosts, as known now
        (``scenario.hostloss``); asked while waiting, so that a wait for a message of theirs
        that is not here ends once the decision is in (``PeerLost``): it never comes."""
        _check_config(rank, world_size, max_numel, recv_timeout_s, max_rounds_ahead, linger_s)
        self.schema = _schema_for(rank, world_size, max_numel, schema)
        self.security = _check_security(security, world_size)
        bounds = _peer_bounds(max_numel * dtype.itemsize, world_size, max_rounds_ahead,
                              max_msgs_per_peer, max_bytes_per_peer)
        # before TransportBase zeroes ``dropped``, which the mailbox counts
        self.mailbox = Mailbox(rank, world_size, max_rounds_ahead, bounds, shaping)
        self.link_log = RecvLinks()  # what the messages taken say about their links
        self._numbers: dict[int, int] = {}  # this worker's messages so far, per peer
        self._renew: set[int] = set()  # peers whose next send connects afresh (a successor)
        self.first_round = 0   # a successor's first round (``begin_life``)
        super().__init__(rank, world_size)
        self.bind_addr = check_tcp_addr(bind_addr, "bind_addr", any_port=not link_ports)
        self.link_ports = link_ports
        self.peer_addrs: dict[int, str] = {}
        self.dtype, self.max_numel, self.shaping = dtype, max_numel, shaping
        self.recv_timeout_s, self.max_rounds_ahead = recv_timeout_s, max_rounds_ahead
        self.linger_s, self.should_stop = linger_s, should_stop
        self.dead_peers = dead_peers
        self._closed = False
        self._background: _BackgroundReduce | None = None  # an overlapped All-Reduce
        self.connect(peer_addrs or {})
        self._sockets = DataSockets(rank, world_size, self.bind_addr, link_ports=link_ports,
                                    security=security, ctx=ctx,
                                    frame_limit=_frame_limit(max_numel, dtype, security))
        self.address = self._sockets.address
        self._pull = self._sockets.pull
        self._rx: _ArrivalStamper | None = None
        if shaping is not None:
            self._rx = _ArrivalStamper(self._sockets.ctx, self._pull,
                                       f"inproc://arrivals-{id(self)}", self._peer_user)
            self._pull = self._rx.inbox

    @property
    def dropped(self) -> int:
        """Drops so far, the sum of ``drop_reasons``: messages the mailbox or framing refused,
        and handshakes ZAP refused (each stands for whatever that connection tried to send)."""
        return sum(self.drop_reasons().values())

    @dropped.setter
    def dropped(self, value: int) -> None:
        # TransportBase.__init__ zeroes the counter; any other write would disown the mailbox's
        if value != self.dropped:
            raise AttributeError(f"dropped is counted by the mailbox and ZAP ({self.dropped}), "
                                 f"it cannot be set to {value!r}")

    def drop_reasons(self) -> dict[str, int]:
        """Drops by reason: the mailbox's and framing's, and "zap.<reason>" for handshakes."""
        sockets = getattr(self, "_sockets", None)  # TransportBase.__init__ asks before it exists
        return self.mailbox.drop_reasons | ({} if sockets is None else sockets.refusals())

    def connect(self, peer_addrs: dict[int, str]) -> None:
        """Learn peers' data-plane addresses; sockets connect on the first send to each.

        An entry for this worker itself is ignored, so the launcher may send everyone the same
        table. Re-sending a known peer's address is fine; changing it is a ValueError.
        """
        for peer, addr in peer_addrs.items():
            if peer == self.rank:
                continue
            if not (type(peer) is int and 0 <= peer < self.world_size):
                raise ValueError(f"worker {self.rank}: peer rank {peer!r} outside "
                                 f"[0, {self.world_size})")
            check_tcp_addr(addr, f"address of peer {peer}")
            if self.peer_addrs.setdefault(peer, addr) != addr:
                raise ValueError(f"worker {self.rank}: peer {peer} is at "
                                 f"{self.peer_addrs[peer]!r}, not {addr!r}")

    # -- the interface TransportBase needs

    def _send(self, peer: int, round_idx: int, kind: str, tensor: torch.Tensor) -> None:
        self._check_open()
        self.mailbox.note_round(round_idx)
        tensor = self._wire_tensor(tensor)
        if peer in self._renew:
            self._renew.discard(peer)
            self._sockets.forget(peer)
        sock = self._sockets.to(peer, self.peer_addrs.get(peer))
        nbytes = tensor.numel() * tensor.element_size()
        sent_at = time.time()  # one instant for the stamp and the receiver's link measurement
        deliver_at = None if self.shaping is None else self.shaping.stamp(peer, nbytes, sent_at)
        seq = self._numbers.get(peer, 0)
        frames = framing.encode(self.rank, round_idx, kind, tensor, deliver_at, sent_at, seq)
        self._wait_until(lambda: _try_send(sock, frames) or self._dead(peer),
                         f"room to send {kind!r} of round {round_idx} to worker {peer}", sock)
        self._numbers[peer] = seq + 1   # a message to a dead peer is lost with it either way

    def _recv(self, peer: int, round_idx: int, kind: str) -> torch.Tensor:
        self._check_open()
        if round_idx < self.mailbox.window()[0]:
            raise TransportError(f"worker {self.rank}: round {round_idx} is behind the window "
                                 f"of round {self.mailbox.round}; its messages were dropped")
        self.mailbox.note_round(round_idx)
        key: Key = (peer, round_idx, kind)
        self._wait_until(lambda: self.mailbox.has(key) or self._dead(peer),
                         f"{kind!r} of round {round_idx} from worker {peer}")
        if not self.mailbox.has(key):   # its sender died before sending it
            self.mailbox.refuse(DEAD_PEER)
            self.dead_peer_losses.append((peer, round_idx, kind))
            raise PeerLost(self.rank, peer, round_idx, kind)
        msg, available_s = self.mailbox.take_timed(key)
        self.link_log.note(msg, available_s)
        return msg.tensor

    # -- more of the interface

    def counters(self) -> dict:
        reasons = self.drop_reasons()  # one copy: "dropped" is its sum even while ZAP counts
        return super().counters() | {"dropped": sum(reasons.values()), "drop_reasons": reasons}

    def recv_links(self, round_idx: int) -> dict[int, LinkUse]:
        """What the messages of round ``round_idx`` taken so far say about their links, by
        source (bytes, messages, summed transfer time, earliest sent_at); reported once."""
        return self.link_log.take(round_idx)

    def start_all_reduce_mean(self, round_idx: int, tensor: torch.Tensor,
                              members=None, reduce=None) -> PendingReduce:
        """The ring All-Reduce on a thread of its own, while the caller computes.

        The caller does not use this transport again before ``wait()`` (the algorithm's
        contract), so the sockets have one user at a time; the thread's start and join order
        every use. libzmq's I/O threads move the bytes, and this thread forwards each chunk as
        soon as it lands, which the worker's thread, busy with inner steps, could not.
        """
        self._check_open()
        if self._background is not None:
            raise TransportError(f"worker {self.rank}: an All-Reduce is already in flight")
        self._background = _BackgroundReduce(self, round_idx, tensor, members, reduce)
        return self._background

    def peer_restarted(self, peer: int) -> None:
        """Close the connection to ``peer``'s predecessor, so that the next send connects
        afresh to the successor bound on its address. The old connection may still look
        established here: a predecessor killed where its FIN or RST never arrived (a reset
        is sent once and not repaired when a link drops it) leaves it open until this worker
        writes to it, and what is written then is lost with it when the reset comes back
        (RFC 9293 section 3.10.7.1: a segment for no connection is answered by a reset).
        Queued messages were the predecessor's: they go (linger 0). Done at the next send to
        ``peer``, by whichever thread makes it: a background All-Reduce may be using the
        sockets now (one user at a time)."""
        self._check_peer(peer)
        self._renew.add(peer)

    def set_round(self, round_idx: int) -> None:
        """Move the round window to ``round_idx`` (e.g. when a run resumes at a later round)."""
        self.mailbox.set_round(round_idx)

    def begin_life(self, first_round: int) -> None:
        """This process is a successor that takes part from ``first_round``: the window starts
        there (a peer's message of that round may come before this worker asks for it), and
        a message of an earlier round was sent to its predecessor. Such messages go without
        a count here: they are the ones sent to a worker lost with its host in rounds it was
        a member but dead, which their senders' records count already (``dead_peer``,
        ``scenario.hostloss.sent_to_dead``), and ZeroMQ delivers them to this process only
        because it binds its predecessor's address."""
        self.first_round = first_round
        self.mailbox.set_round(first_round)

    def close(self, linger_s: float | None = None) -> None:
        """Flush queued sends for at most ``linger_s`` (default: the constructor's), then close;
        what is queued for a peer lost with its host is dropped at once (``close_pushes``).

        Idempotent. Never blocks longer than the linger: unsent messages are then discarded.
        """
        if self._closed:
            return
        self._closed = True
        if self._background is not None:  # it sees _closed at its next poll slice and ends
            self._background.join(timeout_s=2 * POLL_SLICE_S + 1)
        linger_ms = int(1000 * (self.linger_s if linger_s is None else linger_s))
        dead = frozenset(self.dead_peers()) if self.dead_peers is not None else frozenset()
        self._sockets.close_pushes(linger_ms, dead)
        if self._rx is not None:
            self._rx.stop()
        self._pull.close(linger=0)
        self.mailbox.clear()
        self._sockets.close_context()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- sending

    def _wire_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as a contiguous CPU tensor (copies only GPU or strided tensors); values of
        the plane's dtype, or a compressed frame (uint8)."""
        if tensor.dtype not in (self.dtype, torch.uint8):
            raise ValueError(f"worker {self.rank}: tensor dtype {tensor.dtype}, the data plane "
                             f"carries {self.dtype} (or uint8 frames)")
        limit = self.max_numel * self.dtype.itemsize
        if tensor.numel() * tensor.element_size() > limit:
            raise ValueError(f"worker {self.rank}: tensor of {tensor.numel()} elements exceeds "
                             f"the plane's {limit} bytes (max_numel {self.max_numel})")
        return tensor.detach().cpu().contiguous()

    # -- waiting

    def _wait_until(self, ready: Callable[[], bool], what: str,
                    out_sock: zmq.Socket | None = None) -> None:
        """Pump incoming messages until ``ready()``; TransportError on stop or timeout."""
        deadline = time.monotonic() + self.recv_timeout_s
        while True:
            self.mailbox.release_due()
            if ready():
                return
            self._check_abort(what, deadline)
            self._pump(self._slice_s(deadline), out_sock)

    def _dead(self, peer: int) -> bool:
        """Whether ``peer`` was lost with its host (node 0's decision, asked for as the wait
        goes): what it had sent is here or lost, and what it had not sent never comes."""
        return self.dead_peers is not None and peer in self.dead_peers()

    def _check_abort(self, what: str, deadline: float) -> None:
        if self._closed:
            raise TransportError(f"worker {self.rank}: closed while waiting for {what}")
        if self.should_stop is not None and self.should_stop():
            raise TransportError(f"worker {self.rank}: stopped while waiting for {what}")
        if time.monotonic() >= deadline:
            raise TransportError(f"worker {self.rank} waited {self.recv_timeout_s:g} s "
                                 f"for {what}")

    def _slice_s(self, deadline: float) -> float:
        """How long the next poll may sleep: short, and never past a due release or the deadline."""
        slice_s = min(POLL_SLICE_S, deadline - time.monotonic())
        release_s = self.mailbox.next_release_s()  # on the time.time() clock
        if release_s is not None:
            slice_s = min(slice_s, release_s - time.time())
        return max(0.0, slice_s)

    def _pump(self, timeout_s: float, out_sock: zmq.Socket | None) -> None:
        """Sleep until input (or room on ``out_sock``) or the timeout, then read what is there."""
        items = [(self._pull, zmq.POLLIN)]
        if out_sock is not None:
            items.append((out_sock, zmq.POLLOUT))
        # whole milliseconds, rounded down: a release due in under 1 ms is polled for, not slept
        # past
        zmq.zmq_poll(items, int(timeout_s * 1000))
        _drain(self._pull, self._on_frames)

    # -- receiving: decode, then the mailbox decides

    def _on_frames(self, frames: list) -> None:
        if self._rx is None:
            self._accept(frames, self._peer_user(frames[0]), time.time())
        else:  # [arrival time, user id, *the message's frames] from the receive thread
            user = frames[1].bytes.decode("utf-8", "replace") if self.security else None
            self._accept(frames[2:], user, float(frames[0].bytes))

    def _peer_user(self, frame: zmq.Frame) -> str | None:
        """Who ZAP says sent ``frame``; None on an unauthenticated plane."""
        return None if self.security is None else auth.peer_user(frame)

    def _accept(self, frames: list, user: str | None, arrival_s: float) -> None:
        lo, hi = self.mailbox.window()
        if self.first_round:   # a predecessor's rounds are decoded, to be told apart
            lo = 0             # (``begin_life``); every other worker refuses them at once
        try:
            msg = framing.decode(frames, world_size=self.world_size, self_rank=self.rank,
                                 dtype=self.dtype, max_numel=self.max_numel,
                                 round_window=(lo, hi), schema=self.schema,
                                 authenticated_as=user)
        except FrameError as exc:
            if exc.numbered is not None:
                self.mailbox.numbered(*exc.numbered)
            self.mailbox.refuse(exc.reason)
            return
        self.mailbox.numbered(msg.src, msg.seq)
        if msg.round < self.first_round:
            return   # sent to this rank's predecessor: counted by its sender (``begin_life``)
        self.mailbox.accept(msg, arrival_s)

    # -- lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"worker {self.rank}: transport is closed")



class _BackgroundReduce(PendingReduce):
    """``all_reduce_mean`` on a daemon thread; ``wait`` joins it and returns the mean, or raises
    what the thread raised (a timeout, a stop, a peer gone)."""

    def __init__(self, tp: ZmqTransport, round_idx: int, tensor: torch.Tensor, members,
                 reduce=None):
        super().__init__()
        self._tp, self._error = tp, None
        self._thread = threading.Thread(target=self._run,
                                        args=(round_idx, tensor, members, reduce),
                                        name="zmq-all-reduce", daemon=True)
        self._thread.start()

    def _run(self, round_idx: int, tensor: torch.Tensor, members, reduce) -> None:
        # the worker's waits are what ``wait`` blocks, not this thread's receives; saving and
        # restoring wait_s here instead raced with the worker's reads of it (a round's wait
        # came out negative and its metrics row was refused)
        self._tp.uncounted_thread = threading.get_ident()
        try:
            self._value = self._tp.all_reduce_mean(round_idx, tensor, members, reduce)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._error = exc
        finally:
            self._tp.uncounted_thread = None

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def wait(self) -> torch.Tensor:
        t0 = time.perf_counter()
        self._thread.join()
        self._tp.wait_s += time.perf_counter() - t0
        self._tp._background = None
        if self._error is not None:
            raise self._error
        return self._value


class _ArrivalStamper:
    """Reads the bound socket in a thread of its own and forwards [arrival time, user, *frames].

    The thread only blocks in zmq_poll (no GIL held) and wakes per message, so it costs training
    nothing measurable. Frames are forwarded zero-copy over inproc://, which loses their
    User-Id property: ``user_of`` reads it here (None: unauthenticated) and it travels as a frame.
    """

    def __init__(self, ctx: zmq.Context, pull: zmq.Socket, addr: str,
                 user_of: Callable[[zmq.Frame], str | None]):
        self.inbox = ctx.socket(zmq.PULL)
        self.inbox.bind(addr)
        self._out = ctx.socket(zmq.PUSH)
        self._out.connect(addr)
        self._pull, self._user_of, self._halt = pull, user_of, threading.Event()
        self._thread = threading.Thread(target=self._run, name="zmq-arrivals", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            if self._pull.poll(int(POLL_SLICE_S * 1000)):
                _drain(self._pull, self._forward)

    def _forward(self, frames: list) -> None:
        user = (self._user_of(frames[0]) or "").encode()
        self._out.send_multipart([repr(time.time()).encode(), user, *frames], copy=False)

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=2 * POLL_SLICE_S + 1)
        self._pull.close(linger=0)
        self._out.close(linger=0)


def _drain(sock: zmq.Socket, handle: Callable[[list], None]) -> None:
    """Hand what ``sock`` holds to ``handle``, without blocking; at most MAX_DRAIN_MSGS messages,
    so that a flood cannot keep the caller from its stop and deadline checks."""
    for _ in range(MAX_DRAIN_MSGS):
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        handle(frames)


def _try_send(sock: zmq.Socket, frames) -> bool:
    """Queue a multipart message without blocking; False while the peer's queue is full."""
    try:
        sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return False
    return True


def _frame_limit(max_numel: int, dtype: torch.dtype, security: auth.Security | None) -> int:
    """libzmq's MAXMSGSIZE: it drops the connection of a peer that sends a bigger frame,
    before allocating it."""
    limit = max(max_numel * dtype.itemsize, framing.MAX_HEADER_BYTES)
    if security is not None and security.mode == "curve":
        limit += CURVE_FRAME_OVERHEAD  # the limit applies to the encrypted frame
    return limit


def _peer_bounds(model_bytes: int, world_size: int, max_rounds_ahead: int,
                 max_msgs: int | None, max_bytes: int | None) -> PeerBounds:
    """The mailbox's per-peer bounds: the defaults for this model, or the caller's."""
    default = PeerBounds.for_model(model_bytes, world_size, max_rounds_ahead)
    bounds = PeerBounds(default.max_msgs if max_msgs is None else max_msgs,
                        default.max_bytes if max_bytes is None else max_bytes)
    if bounds.max_bytes < model_bytes:  # every model-sized message would be an overflow
        raise ValueError(f"max_bytes_per_peer {max_bytes!r} is below one model-sized message; "
                         f"allowed: >= {model_bytes}")
    return bounds


def _schema_for(rank: int, world_size: int, max_numel: int,
                schema: WireSchema | None) -> WireSchema:
    """The caller's schema, checked against this transport, or the algorithms' own."""
    if schema is None:
        return WireSchema(rank, world_size, max_numel)
    if (schema.rank, schema.world_size) != (rank, world_size) or schema.max_numel() > max_numel:
        raise ValueError(f"schema is for worker {schema.rank} of {schema.world_size} with "
                         f"messages up to {schema.max_numel()} elements; this transport is "
                         f"worker {rank} of {world_size}, max_numel {max_numel}")
    return schema


def _check_security(security: auth.Security | None, world_size: int) -> auth.Security | None:
    if security is not None and (not isinstance(security, auth.Security)
                                 or security.creds.workers != world_size):
        raise ValueError(f"security must be an auth.Security for {world_size} workers, "
                         f"got {security!r}")
    return security


def _check_config(rank: int, world_size: int, max_numel: int, recv_timeout_s: float,
                  max_rounds_ahead: int, linger_s: float) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, {world_size})")
    if not (isinstance(max_numel, int) and max_numel > 0):
        raise ValueError(f"max_numel must be a positive int, got {max_numel!r}")
    if not recv_timeout_s > 0 or not linger_s >= 0 or not max_rounds_ahead >= 1:
        raise ValueError(f"need recv_timeout_s > 0, linger_s >= 0, max_rounds_ahead >= 1; got "
                         f"{recv_timeout_s!r}, {linger_s!r}, {max_rounds_ahead!r}")
