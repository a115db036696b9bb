"""Run credentials, the pure ZAP decision, and the handler thread that answers libzmq."""
from __future__ import annotations

import threading
import time

import pytest
import zmq
from zmq.utils import z85

from gasloc_emu.transport import auth
from gasloc_emu.transport.auth import (
    AuthError,
    RunCredentials,
    Security,
    ZapHandler,
    authorize,
    judge,
    resolve_mode,
    zap_reply,
)

CREDS = RunCredentials(bytes(range(32)), workers=3)


def _curve_key(creds: RunCredentials, user: str) -> bytes:
    """The binary public key a ZAP CURVE request carries for ``user``."""
    return z85.decode(creds.curve_keypair(user)[0])


# -- credentials

def test_identities_are_the_workers_and_the_launcher():
    assert CREDS.identities == ("w0", "w1", "w2", "launcher")
    assert auth.user_id(7) == "w7"


def test_everything_derives_from_the_secret_and_differs_per_user():
    again = RunCredentials(bytes(range(32)), workers=3)
    assert again.password("w1") == CREDS.password("w1")
    assert again.curve_keypair("w1") == CREDS.curve_keypair("w1")
    passwords = {CREDS.password(u) for u in CREDS.identities}
    publics = {CREDS.curve_keypair(u)[0] for u in CREDS.identities}
    assert len(passwords) == len(publics) == 4


def test_a_fresh_run_has_fresh_keys():
    a, b = RunCredentials.new(2), RunCredentials.new(2)
    assert a.secret != b.secret and a.password("w0") != b.password("w0")


def test_the_public_key_belongs_to_the_secret_key():
    public, secret = CREDS.curve_keypair("launcher")
    assert zmq.curve_public(secret) == public and len(public) == 40


def test_repr_never_shows_the_secret():
    text = repr(CREDS) + repr(Security(CREDS, "plain"))
    assert CREDS.secret.hex() not in text and "hidden" in text


@pytest.mark.parametrize(("secret", "workers", "match"), [
    (bytes(31), 2, "32 bytes, got 31"),
    ("00" * 32, 2, "32 bytes, got <class 'str'>"),
    (bytes(32), 0, r"workers must be an int in \[1, 1000000\], got 0"),
    (bytes(32), 2.0, "got 2.0"),
])
def test_bad_credentials_are_refused_naming_the_value(secret, workers, match):
    with pytest.raises(AuthError, match=match):
        RunCredentials(secret, workers)


def test_a_user_outside_the_run_has_no_password():
    with pytest.raises(AuthError, match=r"user 'w3' is not an identity of this run \(w0..w2"):
        CREDS.password("w3")


# -- modes and the hand-over

@pytest.mark.parametrize(("setting", "mode"), [("auto", "plain"), ("plain", "plain"),
                                               ("curve", "curve")])
def test_auto_is_plain_on_one_host(setting, mode):
    assert resolve_mode(setting) == mode


def test_an_unknown_mode_is_refused_naming_the_choices():
    with pytest.raises(AuthError, match="'none' is not allowed; expected one of auto, plain"):
        resolve_mode("none")
    with pytest.raises(AuthError, match="'auto' is not allowed; expected one of plain, curve"):
        Security(CREDS, "auto")


def test_the_environment_carries_the_secret_and_the_worker_takes_it_out():
    environ = {"PATH": "/bin"} | Security(CREDS, "curve").env()
    got = Security.from_env(3, environ)
    assert got.creds.secret == CREDS.secret and got.mode == "curve"
    assert auth.SECRET_ENV not in environ  # nothing this worker starts inherits it


@pytest.mark.parametrize("environ", [{}, {auth.SECRET_ENV: "zz" * 32, auth.SECURITY_ENV: "plain"},
                                     {auth.SECRET_ENV: "00" * 32}])
def test_a_worker_without_valid_credentials_cannot_start(environ):
    with pytest.raises(AuthError, match=auth.SECRET_ENV):
        Security.from_env(3, dict(environ))


# -- authorize: the pure decision

def test_plain_with_the_right_password_is_that_user():
    assert authorize(b"PLAIN", [b"w1", CREDS.password("w1")], CREDS) == "w1"
    assert authorize("PLAIN", [b"launcher", CREDS.password("launcher")], CREDS) == "launcher"


@pytest.mark.parametrize(("credentials", "reason"), [
    ([b"w1", CREDS.password("w2")], "zap.password"),       # another user's password
    ([b"w1", b""], "zap.password"),
    ([b"w1", RunCredentials.new(3).password("w1")], "zap.password"),  # another run's
    ([b"w9", CREDS.password("w1")], "zap.user"),
    ([b"mallory", b"x"], "zap.user"),
    ([b"\xff\xfe", b"x"], "zap.user"),
])
def test_plain_refusals_say_why(credentials, reason):
    assert authorize(b"PLAIN", credentials, CREDS) is None
    assert judge(b"PLAIN", credentials, CREDS).reason == reason


def test_curve_keys_map_to_their_users():
    for user in CREDS.identities:
        assert authorize(b"CURVE", [_curve_key(CREDS, user)], CREDS) == user
    stranger = z85.decode(zmq.curve_keypair()[0])
    assert judge(b"CURVE", [stranger], CREDS).reason == "zap.key"
    assert authorize(b"CURVE", [_curve_key(RunCredentials.new(3), "w0")], CREDS) is None


@pytest.mark.parametrize(("mechanism", "credentials"), [
    (b"NULL", []), (b"GSSAPI", [b"x"]), (b"PLAIN", [b"w1"]), (b"CURVE", []), (b"", [])])
def test_other_mechanisms_or_shapes_are_refused(mechanism, credentials):
    assert judge(mechanism, credentials, CREDS).reason == "zap.mechanism"


def test_zap_replies_follow_zap_1_0():
    request = [b"1.0", b"7", b"", b"127.0.0.1", b"", b"PLAIN", b"w2", CREDS.password("w2")]
    assert zap_reply(request, CREDS) == ([b"1.0", b"7", b"200", b"OK", b"w2", b""], None)
    refused, reason = zap_reply(request[:-1] + [b"no"], CREDS)
    assert refused[:3] == [b"1.0", b"7", b"400"] and refused[4] == b"" and reason == "zap.password"
    assert zap_reply([b"2.0", b"8"], CREDS)[0][:3] == [b"1.0", b"8", b"500"]


# -- the handler thread

def _ask(ctx: zmq.Context, request: list[bytes]) -> list[bytes]:
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.RCVTIMEO, 5000)
    req.connect(auth.ZAP_ENDPOINT)
    try:
        req.send_multipart(request)
        return req.recv_multipart()
    finally:
        req.close()


def test_the_handler_answers_and_counts_refusals_by_reason():
    ctx = zmq.Context()
    handler = ZapHandler(ctx, CREDS)
    try:
        head = [b"1.0", b"1", b"", b"127.0.0.1", b""]
        assert _ask(ctx, head + [b"PLAIN", b"w0", CREDS.password("w0")])[2:5] == [b"200", b"OK",
                                                                                  b"w0"]
        for creds in ([b"PLAIN", b"w0", b"bad"], [b"PLAIN", b"w0", b"bad"],
                      [b"PLAIN", b"eve", b"x"], [b"NULL"]):
            assert _ask(ctx, head + creds)[2] == b"400"
        assert handler.refusals() == {"zap.password": 2, "zap.user": 1, "zap.mechanism": 1}
    finally:
        handler.stop()
        ctx.term()
    assert handler.refusals()["zap.password"] == 2  # still readable once stopped


def test_one_handler_per_context():
    ctx = zmq.Context()
    first = ZapHandler(ctx, CREDS)
    try:
        with pytest.raises(AuthError, match="one handler per Context"):
            ZapHandler(ctx, CREDS)
    finally:
        first.stop()
        ctx.term()


def test_terminating_the_context_stops_the_handler():
    ctx = zmq.Context()
    handler = ZapHandler(ctx, CREDS)
    done = threading.Event()
    threading.Thread(target=lambda: (ctx.term(), done.set()), daemon=True).start()
    assert done.wait(5), "ctx.term() waited for the handler's socket"
    handler._thread.join(2)
    assert not handler._thread.is_alive()


def test_stop_is_prompt_and_idempotent():
    ctx = zmq.Context()
    handler = ZapHandler(ctx, CREDS)
    t0 = time.monotonic()
    handler.stop()
    handler.stop()
    assert time.monotonic() - t0 < 1.0
    ctx.term()


# -- the socket helpers, over loopback TCP

@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_a_server_and_client_made_by_the_helpers_authenticate_as_the_client(mode):
    sec = Security(CREDS, mode)
    ctx = zmq.Context()
    handler = ZapHandler(ctx, CREDS)
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        auth.make_server(pull, sec, "launcher")
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        auth.make_client(push, sec, "w2", "launcher")
        push.connect(f"tcp://127.0.0.1:{port}")
        push.send(b"hello")
        assert pull.poll(5000)
        frame = pull.recv(copy=False)
        assert auth.peer_user(frame) == "w2"
        assert handler.refusals() == {}
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        handler.stop()
        ctx.term()


def test_a_frame_from_an_unauthenticated_plane_has_no_user():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://no-auth")
        b.connect("inproc://no-auth")
        a.send(b"x")
        assert auth.peer_user(b.recv(copy=False)) == ""
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def test_the_config_offers_exactly_the_security_settings_auth_knows():
    # config stays free of zmq imports, so the two lists are kept equal here
    from gasloc_emu import config as C
    assert C.setting_spec("run.security").meta["choices"] == auth.SETTINGS
