"""A successor bound on its predecessor's address gets what is sent to it, even when the
predecessor vanished without a word: its FIN or RST never reached the sender, so the sender's
old connection still looks established (a crashed host, a reset dropped on the way).

The lab (this file run as a script, ``--lab``, inside ``unshare -Urnm``): a bridge and three
nodes, each a process in a network namespace of its own (``unshare -n``) with ``eth0`` on
the bridge: the sender A, the predecessor B1 and, after B1 is gone, its successor B2 with B1's
address and MAC. B1's namespace goes with its process and its link, so nothing of B1's
close leaves it. What A then writes on the old connection reaches B2's kernel, which has no
such connection and answers with a reset (RFC 9293 section 3.10.7.1): the message is lost
with the connection, unless A was told that B2 is a new process (``peer_restarted``).
The nodes use the real ``ZmqTransport``; B2's receive, with a timeout, is the measurement.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
SUBNET = "198.18.7"
PORT = 29600
B_MAC = "02:00:c6:12:07:02"
RECV_TIMEOUT_S = 2.0
LAB_TIMEOUT_S = 90.0


# ================================================================ a node (one process)

def node_main(spec: dict) -> None:
    """Wait for ``eth0``'s address, then serve lines from stdin: ``send R``, ``renew`` and
    ``recv R`` (one line back each)."""
    sys.path.insert(0, str(REPO))
    import torch

    from gasloc_emu.transport.base import TransportError
    from gasloc_emu.transport.zmq_transport import ZmqTransport
    _await_address(spec["ip"])
    rank, other = spec["rank"], 1 - spec["rank"]
    tp = ZmqTransport(rank, 2, f"tcp://{spec['ip']}:{PORT}",
                      {other: f"tcp://{spec['peer_ip']}:{PORT}"}, max_numel=16,
                      recv_timeout_s=RECV_TIMEOUT_S, linger_s=0.0)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "send":
            tp.send(other, int(arg[0]), "z", torch.full((16,), float(arg[0])))
            print("sent", flush=True)
        elif cmd == "renew":
            tp.peer_restarted(other)
            print("renewed", flush=True)
        elif cmd == "recv":
            try:
                print(f"got {tp.recv(other, int(arg[0]), 'z')[0].item():g}", flush=True)
            except TransportError:
                print("timeout", flush=True)


def _await_address(ip: str, timeout_s: float = 20.0) -> None:
    """Until ``ip`` can be bound here (the lab moves eth0 in and configures it)."""
    import socket
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.socket() as s:
                s.bind((ip, 0))
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


# ================================================================ the lab

def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _await_own_netns(pid: int, timeout_s: float = 10.0) -> None:
    """Until ``unshare -n`` has made the process's namespace (before, a link moved to its
    pid would land in the lab's)."""
    lab = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + timeout_s
    while os.readlink(f"/proc/{pid}/ns/net") == lab:
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} has no network namespace of its own")
        time.sleep(0.005)


class Node:
    """A node process in its own network namespace, with eth0 on the lab's bridge."""

    def __init__(self, name: str, rank: int, host: int, peer_host: int, mac: str | None = None):
        spec = {"rank": rank, "ip": f"{SUBNET}.{host}", "peer_ip": f"{SUBNET}.{peer_host}"}
        self.proc = subprocess.Popen(
            ["unshare", "-n", "--", sys.executable, str(HERE), "--node", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(REPO))
        self.port = f"v{name}"
        pid = str(self.proc.pid)
        _await_own_netns(self.proc.pid)
        _ip("link", "add", self.port, "type", "veth", "peer", "name", "eth0",
            *(["address", mac] if mac else []), "netns", pid)
        _ip("link", "set", self.port, "master", "br0", "up")
        inside = ["nsenter", "-t", pid, "-n", "ip"]
        for args in (["addr", "add", f"{spec['ip']}/24", "dev", "eth0"],
                     ["link", "set", "eth0", "up"], ["link", "set", "lo", "up"]):
            subprocess.run(inside + args, check=True, capture_output=True)
        self.expect("ready")

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def expect(self, what: str) -> None:
        got = self.proc.stdout.readline().strip()
        assert got == what, f"node said {got!r}, not {what!r}"

    def vanish(self) -> None:
        """Gone without a word: the link first, then the process, its namespace with it."""
        _ip("link", "del", self.port)
        self.proc.kill()
        self.proc.wait()


def _await_acked(pid: int, timeout_s: float = 5.0) -> None:
    """Until every byte the node sent is acknowledged (an empty Send-Q): a connection left
    idle, as the one to a crashed worker is between rounds. Unacknowledged data would be
    retransmitted into the successor, whose reset tells the sender before its next message."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = subprocess.run(["nsenter", "-t", str(pid), "-n", "ss", "-tnH", "state",
                               "established"], capture_output=True, text=True,
                              check=True).stdout.split("\n")
        if all(int(r.split()[1]) == 0 for r in rows if r.strip()):
            return
        time.sleep(0.02)
    raise AssertionError(f"the sender's data was not acknowledged within {timeout_s} s")


def lab_main(args: dict) -> dict:
    _ip("link", "set", "lo", "up")
    _ip("link", "add", "br0", "type", "bridge")
    _ip("link", "set", "br0", "up")
    a = Node("a", 0, 1, 2)
    b1 = Node("b1", 1, 2, 1, mac=B_MAC)
    try:
        out = {"first": (a.ask("send 0"), b1.ask("recv 0"))}
        _await_acked(a.proc.pid)
        b1.vanish()
        b2 = Node("b2", 1, 2, 1, mac=B_MAC)
        try:
            if args["renew"]:
                out["renew"] = a.ask("renew")
            out["after"] = (a.ask("send 1"), b2.ask("recv 1"))
            # and the link goes on: the next message too
            out["next"] = (a.ask("send 2"), b2.ask("recv 2"))
        finally:
            b2.proc.kill()
    finally:
        a.proc.kill()
        b1.proc.kill()
    return out


def run_labs(*renews: bool) -> list[dict]:
    """One lab per entry of ``renews``, side by side (each in namespaces of its own)."""
    procs = [subprocess.Popen(["unshare", "-Urnm", "--", sys.executable, str(HERE), "--lab",
                               json.dumps({"renew": renew})], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(REPO))
             for renew in renews]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=LAB_TIMEOUT_S)
            lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
            assert proc.returncode == 0 and lines, \
                f"lab failed ({proc.returncode}): {err[-3000:]}"
            results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return results


if __name__ == "__main__" and sys.argv[1:2] == ["--lab"]:
    print("RESULT " + json.dumps(lab_main(json.loads(sys.argv[2]))), flush=True)
    sys.exit(0)
if __name__ == "__main__" and sys.argv[1:2] == ["--node"]:
    node_main(json.loads(sys.argv[2]))
    sys.exit(0)


# ================================================================ the test

def test_a_successor_gets_the_first_message_after_its_predecessor_vanished(tc_caps):
    """With ``peer_restarted`` the message of the successor's first round arrives, and the
    next one too. Without it (the contrast, same lab) the first one is lost: that is the
    lost message that held a crashed worker's successor in its first round for good."""
    renewed, stale = run_labs(True, False)
    assert renewed["first"] == ["sent", "got 0"]
    assert renewed["renew"] == "renewed"
    assert renewed["after"] == ["sent", "got 1"]
    assert renewed["next"] == ["sent", "got 2"]
    assert stale["first"] == ["sent", "got 0"]
    assert stale["after"] == ["sent", "timeout"], \
        "the old connection delivered: this lab no longer makes a stale connection"
