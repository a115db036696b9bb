"""The launcher's end of the control plane: a ROUTER for workers' messages and replies, a PULL
for their heartbeats, both behind ZAP with the run's keys (``transport.auth``).

Sockets only: what a message means is the Supervisor's, how it is parsed ``transport.control``'s.
"""
from __future__ import annotations

import contextlib
import math

import zmq

from gasloc_emu.transport import auth, control


class ControlPlane:
    """Bound on construction (ipc:// paths, or tcp:// port 0 read back after binding)."""

    def __init__(self, security: auth.Security, ctl_addr: str, hb_addr: str):
        self.ctx = zmq.Context()
        self.security = security
        # answers the handshakes; stops when ctx.term() is called (close)
        self.zap = auth.ZapHandler(self.ctx, security.creds)
        self.router, self.ctl_addr = self._bind(zmq.ROUTER, ctl_addr)
        self.pull, self.hb_addr = self._bind(zmq.PULL, hb_addr)

    def _bind(self, kind: int, addr: str):
        """The socket and the address it got (a tcp:// port 0 becomes the port chosen)."""
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        auth.make_server(sock, self.security, auth.LAUNCHER)
        sock.bind(addr)
        return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def poll(self, timeout_s: float) -> tuple[list, list]:
        """Wait up to ``timeout_s`` for traffic; return every heartbeat frame and every ROUTER
        message (a list of frames) waiting now, heartbeats first."""
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pull, zmq.POLLIN)
        events = dict(poller.poll(math.ceil(timeout_s * 1000)))  # never wake before the time
        beats, messages = [], []
        while self.pull in events and self.pull.poll(0):
            beats.append(self.pull.recv(copy=False))
        while self.router in events and self.router.poll(0):
            messages.append(self.router.recv_multipart(copy=False))
        return beats, messages

    def tell(self, rank: int, msg: dict) -> None:
        with contextlib.suppress(zmq.ZMQError):  # that worker is gone; supervision notices
            self.router.send_multipart([f"w{rank}".encode(), control.pack(msg)], zmq.NOBLOCK)

    def refusals(self) -> dict[str, int]:
        """Connections ZAP refused, by reason ("zap.<why>")."""
        return self.zap.refusals()

    @property
    def closed(self) -> bool:
        return self.ctx.closed

    def close(self) -> None:
        self.router.close()
        self.pull.close()
        self.ctx.term()
