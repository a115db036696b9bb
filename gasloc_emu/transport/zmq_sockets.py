"""The data plane's sockets, apart from what travels on them: one PULL bound where this worker
listens (every link's own port with ``link_ports``), one PUSH per peer connected on the first
send, ZAP in front of both when the plane is authenticated, and the context they live in.
"""
from __future__ import annotations

import re

import zmq

from gasloc_emu.transport import auth
from gasloc_emu.transport.base import TransportError

# Messages queued per peer and direction. Zero-copy sends queue views, not copies, so this
# bounds how many of the algorithm's tensors libzmq may hold, not extra memory.
HWM_MSGS = 256
_TCP_ADDR = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\[\]*]+):(?P<port>\d{1,5})")
_WILDCARD_HOSTS = {"*", "0.0.0.0", "[::]", "[::0]"}


class DataSockets:
    """Bound on construction; ``address`` is the real one (the port chosen for port 0)."""

    def __init__(self, rank: int, world_size: int, bind_addr: str, *, link_ports: bool,
                 security: auth.Security | None, frame_limit: int, ctx: zmq.Context | None):
        self.rank, self.world_size, self.bind_addr = rank, world_size, bind_addr
        self.link_ports, self.security = link_ports, security
        self.own_context = ctx is None
        self.ctx = zmq.Context() if ctx is None else ctx
        self.push: dict[int, zmq.Socket] = {}
        # before the bind: a handshake that finds no handler fails
        self.zap = None if security is None else auth.ZapHandler(self.ctx, security.creds)
        self.pull = self._bind_pull(frame_limit)
        # the real port; with link ports the base that every link's port is counted from
        self.address: str = bind_addr if link_ports else \
            self.pull.getsockopt_string(zmq.LAST_ENDPOINT)

    def socket(self, kind: int, addr: str) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.IPV6, addr.startswith("tcp://["))  # libzmq needs it for [::1]
        return sock

    def _bind_pull(self, frame_limit: int) -> zmq.Socket:
        sock = self.socket(zmq.PULL, self.bind_addr)
        sock.setsockopt(zmq.RCVHWM, HWM_MSGS)
        # libzmq drops the connection of a peer that sends a bigger frame, before allocating it
        sock.setsockopt(zmq.MAXMSGSIZE, frame_limit)
        if self.security is not None:
            auth.make_server(sock, self.security, auth.user_id(self.rank))
        addrs = [link_address(self.bind_addr, src) for src in range(self.world_size)
                 if src != self.rank] if self.link_ports else [self.bind_addr]
        try:
            for addr in addrs:
                sock.bind(addr)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self.close_context()
            raise TransportError(f"worker {self.rank} cannot bind {addr}: {exc}") from exc
        return sock

    def to(self, peer: int, addr: str | None) -> zmq.Socket:
        """The PUSH socket to ``peer`` at ``addr``, connected on first use."""
        sock = self.push.get(peer)
        if sock is None:
            if addr is None:
                raise TransportError(f"worker {self.rank}: no address for peer {peer}")
            sock = self.socket(zmq.PUSH, addr)
            sock.setsockopt(zmq.SNDHWM, HWM_MSGS)
            if self.security is not None:
                auth.make_client(sock, self.security, auth.user_id(self.rank),
                                 auth.user_id(peer))
            sock.connect(link_address(addr, self.rank) if self.link_ports else addr)
            self.push[peer] = sock
        return sock

    def forget(self, peer: int) -> None:
        """Close the PUSH socket to ``peer`` now, discarding what it queued; the next ``to``
        connects a new one."""
        sock = self.push.pop(peer, None)
        if sock is not None:
            sock.close(linger=0)

    def refusals(self) -> dict[str, int]:
        """Handshakes ZAP refused, as "zap.<reason>"; none on an unauthenticated plane."""
        return {} if self.zap is None else self.zap.refusals()

    def close_pushes(self, linger_ms: int, dead: frozenset = frozenset()) -> None:
        """Close every socket to a peer, flushing what is queued for at most ``linger_ms``;
        at once for the ``dead`` peers (lost with their hosts: what is queued for them is lost
        with them, and counted so by its sender; waiting would only keep this process)."""
        for peer, sock in self.push.items():
            sock.close(linger=0 if peer in dead else linger_ms)

    def close_context(self) -> None:
        if self.zap is not None:
            self.zap.stop()  # before term(), which waits for its socket
        if self.own_context:
            self.ctx.term()  # returns once every socket is closed and its linger is over


def check_tcp_addr(addr: str, what: str, *, any_port: bool = False) -> str:
    """``addr`` if it is tcp://HOST:PORT with a concrete host (and port, unless ``any_port``
    allows 0 for "pick a free one"), else ValueError."""
    m = _TCP_ADDR.fullmatch(addr) if isinstance(addr, str) else None
    lowest_port = 0 if any_port else 1
    if m is None or m["host"] in _WILDCARD_HOSTS or not lowest_port <= int(m["port"]) < 65536:
        raise ValueError(f"{what} must be tcp://HOST:PORT with a concrete host and port "
                         f"(no wildcard), got {addr!r}")
    return addr


def link_address(base_addr: str, src: int) -> str:
    """With link ports, where worker ``src`` sends to the worker whose base address this is:
    one port per directed link (base + src), so that tc on a real interface can tell links
    apart by destination address and port alone (``netem.hosttc``)."""
    m = _TCP_ADDR.fullmatch(base_addr)
    port = int(m["port"]) + src
    if port > 65535:
        raise ValueError(f"link port {port} of worker {src} is above 65535 (base {base_addr})")
    return f"tcp://{m['host']}:{port}"
