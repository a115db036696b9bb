"""Who may talk on the data and control planes: per-run credentials and a ZAP handler.

Credentials. The launcher draws a fresh 32-byte secret per run (``RunCredentials.new``); every
identity's PLAIN password and CURVE keypair are derived from it (HMAC-SHA256(secret, label)), so
the launcher and each worker compute every password and public key themselves and only the
secret travels. Identities (ZAP user ids): worker k is ``"w{k}"``, the launcher ``"launcher"``.

Hand-over. The secret reaches a worker in the environment of its Popen (``SECRET_ENV``, hex),
read and removed from ``os.environ`` at start (``Security.from_env``). Why the environment and
not a 0600 file: both are readable by the same user only (/proc/PID/environ is 0400), but the
environment never touches the disk, so nothing is left behind when a run is killed with -9, and
the run folder, which people copy and share, never holds it. It is never on a command line
(world-readable in /proc/PID/cmdline) and never in the run record.

Modes (``MODES``). ``plain``: ZAP with PLAIN username/password. The peer is authenticated at
the handshake and nothing is done per message, so a zero-copy 64 MiB send costs what it did;
the default on one host, where nobody can sniff loopback or the veths without being this user.
``curve``: authenticated and encrypted (CurveZMQ); the default once peers are on other hosts.
There is one host for now, so the setting ``auto`` means ``plain`` (``resolve_mode``).

ZAP. libzmq asks the REP socket bound at ``ZAP_ENDPOINT`` in the server socket's context about
every PLAIN or CURVE handshake. ``ZapHandler`` answers from its own thread with ``authorize``, a
pure function of the request, and counts refusals by reason. The authenticated user id comes
back on every received frame as the "User-Id" property, which is how the data plane knows who
really sent a message.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from collections import defaultdict
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from functools import cached_property

import zmq
from zmq.utils import z85

SECRET_ENV = "GASLOC_RUN_SECRET"     # hex of the run's secret, in the worker's environment only
SECURITY_ENV = "GASLOC_RUN_SECURITY"  # the mode the launcher resolved ("plain" or "curve")
SECRET_BYTES = 32
MODES = ("plain", "curve")
SETTINGS = ("auto", *MODES)           # the choices of the config setting run.security
LAUNCHER = "launcher"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by ZAP (RFC 27)
ZAP_VERSION = b"1.0"
ZAP_POLL_S = 0.1                      # how often the handler thread looks at its stop flag


class AuthError(ValueError):
    """Credentials or a security mode are missing or malformed."""


def user_id(rank: int) -> str:
    """The ZAP user id of worker ``rank``."""
    return f"w{rank}"


def resolve_mode(setting: str) -> str:
    """The mode for a ``run.security`` setting: ``auto`` is ``plain`` while every peer is on
    this host (``curve`` would encrypt what never leaves the machine)."""
    if setting not in SETTINGS:
        raise AuthError(f"security = {setting!r} is not allowed; expected one of "
                        f"{', '.join(SETTINGS)}")
    mode = "plain" if setting == "auto" else setting
    if mode == "curve" and not zmq.has("curve"):
        raise AuthError(f"security = {setting!r} needs a libzmq with CURVE; this one "
                        f"({zmq.zmq_version()}) has none: use plain")
    return mode


@dataclass(frozen=True, repr=False)
class RunCredentials:
    """A run's secret and what derives from it; never printed (``repr`` hides the secret)."""

    secret: bytes
    workers: int

    def __post_init__(self) -> None:
        if type(self.secret) is not bytes or len(self.secret) != SECRET_BYTES:
            size = len(self.secret) if isinstance(self.secret, bytes) else type(self.secret)
            raise AuthError(f"the run secret must be {SECRET_BYTES} bytes, got {size}")
        if type(self.workers) is not int or not 1 <= self.workers <= 1_000_000:
            raise AuthError(f"workers must be an int in [1, 1000000], got {self.workers!r}")

    @classmethod
    def new(cls, workers: int) -> RunCredentials:
        return cls(secrets.token_bytes(SECRET_BYTES), workers)

    def __repr__(self) -> str:
        return f"RunCredentials(workers={self.workers}, secret=<hidden>)"

    @cached_property
    def identities(self) -> tuple[str, ...]:
        return (*(user_id(k) for k in range(self.workers)), LAUNCHER)

    def _derive(self, label: str) -> bytes:
        return hmac.new(self.secret, label.encode(), hashlib.sha256).digest()

    def password(self, user: str) -> bytes:
        """``user``'s PLAIN password (32 bytes; PLAIN allows up to 255)."""
        return self._derive(f"plain/{self._known(user)}")

    def curve_keypair(self, user: str) -> tuple[bytes, bytes]:
        """``user``'s CURVE (public, secret) keys, z85-encoded as libzmq's options take them."""
        secret = z85.encode(self._derive(f"curve/{self._known(user)}"))
        return zmq.curve_public(secret), secret

    @cached_property
    def users_by_curve_key(self) -> Mapping[bytes, str]:
        """Binary (32-byte) public key -> user id: what a ZAP CURVE request carries."""
        return {z85.decode(self.curve_keypair(u)[0]): u for u in self.identities}

    def _known(self, user: str) -> str:
        if user not in self.identities:
            raise AuthError(f"user {user!r} is not an identity of this run "
                            f"(w0..w{self.workers - 1}, {LAUNCHER})")
        return user


@dataclass(frozen=True)
class Security:
    """Credentials and mode together: what the socket helpers and the planes are given."""

    creds: RunCredentials
    mode: str

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise AuthError(f"mode = {self.mode!r} is not allowed; expected one of "
                            f"{', '.join(MODES)}")
        if not isinstance(self.creds, RunCredentials):
            raise AuthError(f"creds must be RunCredentials, got {type(self.creds).__name__}")

    def env(self) -> dict[str, str]:
        """What a worker's Popen environment gets (and nothing else ever sees)."""
        return {SECRET_ENV: self.creds.secret.hex(), SECURITY_ENV: self.mode}

    @classmethod
    def from_env(cls, workers: int, environ: MutableMapping[str, str] = os.environ) -> Security:
        """A worker's security from its environment; removes the secret from ``environ`` so that
        nothing this process starts inherits it."""
        raw, mode = environ.pop(SECRET_ENV, None), environ.get(SECURITY_ENV)
        if raw is None or mode is None:
            raise AuthError(f"{SECRET_ENV} and {SECURITY_ENV} must be set by the launcher; "
                            f"a worker cannot join a run without them")
        try:
            secret = bytes.fromhex(raw)
        except ValueError:
            raise AuthError(f"{SECRET_ENV} is not hex ({len(raw)} characters)") from None
        return cls(RunCredentials(secret, workers), mode)


# -- ZAP: the pure decision, then the thread that answers libzmq

@dataclass(frozen=True)
class Verdict:
    user: str | None    # the authenticated user id, None when refused
    reason: str | None  # why it was refused (a short code for counters), None when accepted


def judge(mechanism: bytes | str, credentials: list[bytes], creds: RunCredentials) -> Verdict:
    """``authorize`` with the reason for a refusal."""
    mech = mechanism.decode("ascii", "replace") if isinstance(mechanism, bytes) else mechanism
    if mech == "PLAIN" and len(credentials) == 2:
        return _judge_plain(*credentials, creds)
    if mech == "CURVE" and len(credentials) == 1:
        user = creds.users_by_curve_key.get(bytes(credentials[0]))
        return Verdict(user, None if user else "zap.key")
    return Verdict(None, "zap.mechanism")  # NULL, or a request libzmq would not make


def _judge_plain(username: bytes, password: bytes, creds: RunCredentials) -> Verdict:
    user = bytes(username).decode("utf-8", "replace")
    if user not in creds.identities:
        return Verdict(None, "zap.user")
    if not hmac.compare_digest(bytes(password), creds.password(user)):
        return Verdict(None, "zap.password")
    return Verdict(user, None)


def authorize(mechanism: bytes | str, credentials: list[bytes],
              creds: RunCredentials) -> str | None:
    """The user id a ZAP request authenticates as, or None to refuse it. No sockets."""
    return judge(mechanism, credentials, creds).user


def zap_reply(request: list[bytes], creds: RunCredentials) -> tuple[list[bytes], str | None]:
    """The ZAP 1.0 reply frames for ``request`` frames, and the refusal reason (or None).

    Request: version, request id, domain, address, identity, mechanism, credentials...
    Reply: version, request id, status code, status text, user id, metadata.
    """
    if len(request) < 6 or bytes(request[0]) != ZAP_VERSION:
        request_id = bytes(request[1]) if len(request) > 1 else b""
        return [ZAP_VERSION, request_id, b"500", b"malformed ZAP request", b"", b""], "zap.request"
    verdict = judge(bytes(request[5]), [bytes(f) for f in request[6:]], creds)
    if verdict.user is None:
        return [ZAP_VERSION, bytes(request[1]), b"400", verdict.reason.encode(), b"", b""], \
            verdict.reason
    return [ZAP_VERSION, bytes(request[1]), b"200", b"OK", verdict.user.encode(), b""], None


class ZapHandler:
    """Answers the ZAP requests of one zmq Context from a thread of its own.

    Start it before binding a server socket in that context (a handshake that finds no handler
    fails). It stops on ``stop()`` or when the context is terminated, closing its socket either
    way, so ``ctx.term()`` never waits for it. One per Context: ZAP_ENDPOINT is bound once.
    """

    def __init__(self, ctx: zmq.Context, creds: RunCredentials):
        self.creds = creds
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self._sock.close(linger=0)
            raise AuthError(f"cannot serve ZAP in this context ({exc}): one handler per "
                            f"Context, and this one has one") from exc
        self._refusals: dict[str, int] = defaultdict(int)
        self._lock, self._halt = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="zap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._halt.is_set():
                if self._sock.poll(int(ZAP_POLL_S * 1000)):
                    self._answer(self._sock.recv_multipart())
        except zmq.ContextTerminated:
            pass  # ctx.term() was called: closing the socket below lets it return
        finally:
            self._sock.close(linger=0)

    def _answer(self, request: list[bytes]) -> None:
        reply, reason = zap_reply(request, self.creds)
        if reason is not None:
            with self._lock:
                self._refusals[reason] += 1
        self._sock.send_multipart(reply)

    def refusals(self) -> dict[str, int]:
        """Handshakes refused so far, by reason ("zap.password", "zap.user", "zap.key"...)."""
        with self._lock:
            return dict(self._refusals)

    def stop(self) -> None:
        """Stop answering and close the socket; idempotent. Counters stay readable."""
        self._halt.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10 * ZAP_POLL_S + 1)


# -- socket helpers shared by the data plane and the control plane (call before bind/connect)

def make_server(sock: zmq.Socket, security: Security, user: str) -> None:
    """Make ``sock`` authenticate its peers through ZAP; ``user`` is who the server is (its
    CURVE keypair). Needs a ``ZapHandler`` in the socket's context."""
    if security.mode == "plain":
        sock.setsockopt(zmq.PLAIN_SERVER, 1)
        return
    public, secret = security.creds.curve_keypair(user)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)


def make_client(sock: zmq.Socket, security: Security, user: str, server: str) -> None:
    """Make ``sock`` log in as ``user`` to a server that is ``server`` (for CURVE, whose public
    key the client must know beforehand)."""
    creds = security.creds
    if security.mode == "plain":
        sock.setsockopt(zmq.PLAIN_USERNAME, user.encode())
        sock.setsockopt(zmq.PLAIN_PASSWORD, creds.password(user))
        return
    public, secret = creds.curve_keypair(user)
    sock.setsockopt(zmq.CURVE_SERVERKEY, creds.curve_keypair(server)[0])
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)


def peer_user(frame: zmq.Frame) -> str:
    """The user id ZAP authenticated for the connection ``frame`` came in on ("" if none)."""
    try:
        return frame.get("User-Id") or ""
    except zmq.ZMQError:  # the frame carries no metadata: not from an authenticated connection
        return ""
