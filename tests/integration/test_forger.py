"""A forger without the run's keys against a live run: nothing it sends changes a single bit.

The run is started through the CLI like any other. Once ``workers.json`` names the workers'
data-plane addresses, a separate process (its environment has no run secret) connects to every
worker and to the launcher's control plane and tries what a hostile local user tried before the
planes were authenticated: a forged neighbour with NaN parameters, wrong shapes and dtypes, a
flood (bounded in count and time), a far-future delivery time; fake heartbeats and control
messages. It logs in as NULL, as a known user with a guessed password, as an unknown user and
with a stray CURVE key. The run must exit 0 with a final eval loss equal, bit for bit, to the
simulator's for the same settings (one CPU thread a worker, as in simulate: the same sums), and
no worker's mailbox may have seen any of it.

The forger's interpreter starts with the run and waits until every worker has finished round 1,
so it acts within a moment of that however slow the host is to start a process; training lasts
its nominal steps (3.2 s; the forger is done at most 2.5 s after round 1, its flood 1.5 s).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gasloc_emu import config as C
from gasloc_emu.training.model import count_parameters
from gasloc_emu.transport import auth

pytestmark = pytest.mark.integration

WORKERS, ROUNDS, STEP_S = 2, 16, 0.1  # 3.2 s of nominal steps: the forger acts while they run
BASE = ["--workers", str(WORKERS), "--model", "tiny", "-H", "2", "-R", str(ROUNDS), "--seed", "5",
        "--algo", "gasloc", "--topology", "ring", "--no-dashboard", "--step-time-s", str(STEP_S),
        "--set", "data.max_corpus_mb=0.5", "--set", "data.eval_batches=1",
        "--set", "run.threads_per_worker=1", "--set", "net.probe=false"]
SHAPERS = {"unshaped": [], "userspace": ["--bw-profile", "uniform", "--shaper", "userspace"]}
FLOOD_MSGS, FLOOD_S = 2000, 1.5   # per socket, and for all 8 data sockets together
# both shapers every time: the same authentication, which the userspace shaper's held messages
# must not get around

# Runs in its own interpreter: argv = run folder, model size, flood, the launcher's pid, workers.
# Prints what it managed to queue.
FORGER = r'''
import json, math, sys, time
from pathlib import Path
import msgpack, zmq

run_dir, numel = Path(sys.argv[1]), int(sys.argv[2])
FLOOD_MSGS, FLOOD_S, launcher = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
WORKERS = int(sys.argv[6])


def launcher_alive():
    try:
        stat = Path(f"/proc/{launcher}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has exited


def rows(path):
    return len(path.read_text().splitlines()) if path.exists() else 0


# started with the run: wait until every worker has finished round 1 (training under way)
metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 180
while not (run_dir / "workers.json").exists() or rows(metrics) < 2 * WORKERS:
    if not launcher_alive() or time.monotonic() > deadline:
        sys.exit(f"training never got under way: launcher alive {launcher_alive()}")
    time.sleep(0.02)
workers = json.loads((run_dir / "workers.json").read_text())
spec = json.loads((run_dir / "launch.json").read_text())
now = rows(metrics) // len(workers)
ctx = zmq.Context()
queued = {"data": 0, "control": 0, "refused_by_hwm": 0}


def logins(user):
    def null(sock):
        pass
    def guessed(sock):
        sock.plain_username, sock.plain_password = user.encode(), b"password"
    def stranger(sock):
        sock.plain_username, sock.plain_password = b"mallory", b"x"
    def stray_curve(sock):
        sock.curve_serverkey = zmq.curve_keypair()[0]
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    return [null, guessed, stranger, stray_curve]


def sock_to(kind, addr, login, **opts):
    sock = ctx.socket(kind)
    sock.linger, sock.sndhwm = 0, 100_000
    for key, value in opts.items():
        setattr(sock, key, value)
    login(sock)
    sock.connect(addr)
    return sock


def send(sock, frames, plane):
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
        queued[plane] += 1
    except zmq.Again:
        queued["refused_by_hwm"] += 1


def msg(src, rnd, kind="z", shape=None, dtype="float32", fill=b"\x00\x00\xc0\x7f", **extra):
    shape = [numel] if shape is None else shape
    size = {"float32": 4, "float64": 8}[dtype]
    header = {"v": 1, "src": src, "round": rnd, "kind": kind, "dtype": dtype, "shape": shape,
              "nbytes": size * math.prod(shape)} | extra
    return [msgpack.packb(header), fill * (size * math.prod(shape) // 4)]


flood_until = time.monotonic() + FLOOD_S  # for all sockets together
for w in workers:
    rank, neighbour = w["rank"], (w["rank"] + 1) % len(workers)
    for login in logins(f"w{neighbour}"):
        sock = sock_to(zmq.PUSH, w["addr"], login)
        for rnd in range(now, now + 12):              # a forged neighbour, NaN, rounds ahead
            send(sock, msg(neighbour, rnd), "data")
        send(sock, msg(neighbour, now, shape=[numel + 1]), "data")      # wrong shapes, dtype
        send(sock, msg(neighbour, now, shape=[2, numel // 2]), "data")
        send(sock, msg(neighbour, now, dtype="float64"), "data")
        send(sock, msg(neighbour, now + 1, deliver_at=time.time() + 1e6), "data")  # far future
        sent = 0
        while sent < FLOOD_MSGS and time.monotonic() < flood_until:  # a bounded flood
            send(sock, msg(neighbour, now + sent % 12, kind=f"rs{sent % 3}", shape=[1]),
                 "data")
            sent += 1

for login in logins("w0"):                                      # the control plane
    hb = sock_to(zmq.PUSH, spec["heartbeat_addr"], login)
    for rank in range(len(workers)):
        send(hb, [msgpack.packb({"type": "hb", "worker": rank, "round": 0, "step": 0,
                                 "state": "computing", "peer": None})], "control")
    for identity in (b"w0", b"w9"):
        dealer = sock_to(zmq.DEALER, spec["ctl_addr"], login, identity=identity)
        send(dealer, [msgpack.packb({"type": "error", "worker": 0, "error": "forged"})],
             "control")

time.sleep(1.0)  # let libzmq try (and fail) the handshakes
print(json.dumps(queued))
ctx.destroy(linger=0)
'''


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gasloc_emu", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _keyless_env() -> dict[str, str]:
    """The forger's environment: this user's, without any run's secret."""
    return {k: v for k, v in os.environ.items() if k not in (auth.SECRET_ENV, auth.SECURITY_ENV)}


@pytest.fixture(scope="module")
def clean_loss(tmp_path_factory) -> float:
    """The simulator's final eval loss for the same settings: a run nobody attacked."""
    out = tmp_path_factory.mktemp("clean") / "sim"
    done = subprocess.run([sys.executable, "-m", "gasloc_emu", "simulate", *BASE, "--out",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return _summary(out)["final_eval_loss"]


@pytest.mark.parametrize("shaper", sorted(SHAPERS))
def test_a_forger_without_the_keys_changes_nothing(tmp_path, clean_loss, shaper):
    out = tmp_path / "run"
    numel = count_parameters(C.resolve(overrides={"model.preset": "tiny"}).model)
    proc = _cli("run", *BASE, *SHAPERS[shaper], "--out", str(out))
    try:
        forger = subprocess.run([sys.executable, "-c", FORGER, str(out), str(numel),
                                 str(FLOOD_MSGS), str(FLOOD_S), str(proc.pid), str(WORKERS)],
                                capture_output=True, text=True, timeout=240, env=_keyless_env())
        _, err = proc.communicate(timeout=300)
        assert forger.returncode == 0, (forger.stderr, proc.returncode, err[-3000:])
        queued = json.loads(forger.stdout)
    finally:
        proc.kill()
    assert queued["data"] > 1000 and queued["control"] > 0, queued
    assert proc.returncode == 0, err
    summary = _summary(out)
    assert summary["status"] == "ok"
    assert summary["final_eval_loss"] == clean_loss  # bit for bit
    by_reason = summary["drops"]["by_reason"]
    # the workers refused the forger's handshakes while they ran; no message got past one
    assert {"zap.password", "zap.user"} <= set(by_reason), by_reason
    assert all(reason.startswith("zap.") for reason in by_reason), by_reason
