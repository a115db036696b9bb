"""The packet line's control replies arrive whole whatever their size: a stats reply over many
links is larger than a pipe holds (64 KiB, pipe(7)), so one write cannot carry it.

The line runs as the launcher runs it (``python -m netem.packetline SPEC``, stdin and stdout
pipes) inside ``unshare -Urn`` with 12 unbridged veth ports: 132 directed links."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netem.impair import Impairment
from netem.packetline import PacketLineSpec, Port

REPO = Path(__file__).resolve().parents[2]
PORTS = 12                                # 12 x 11 = 132 directed links


def _read_lines(fd: int, count: int, deadline_s: float) -> list[dict]:
    buf, out = b"", []
    while len(out) < count:
        left = deadline_s - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{len(out)} of {count} replies, then {len(buf)} bytes "
                                 "without a newline")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise AssertionError(f"EOF after {len(out)} of {count} replies")
        buf += chunk
        *lines, buf = buf.split(b"\n")
        out += [json.loads(x) for x in lines if x.strip()]
    return out


@pytest.mark.parametrize("engine", ["python", "c"])
def test_a_stats_reply_over_132_links_arrives_whole(tc_caps, tmp_path, engine):
    from netem.packetline import engine_available
    if engine == "c" and not engine_available():
        pytest.skip("netem._linecore is not built (no compiler at install)")
    ports = tuple(Port(k, f"p{k}", f"198.18.0.{k + 1}") for k in range(PORTS))
    spec = PacketLineSpec(ports=ports, default=Impairment(delay_ms=1.0),
                          stats_path=str(tmp_path / "stats.json"), engine=engine)
    spec.save(str(tmp_path / "spec.json"))
    make = "; ".join(f"ip link add p{k} type veth peer name q{k} && ip link set p{k} up && "
                     f"ip link set q{k} up" for k in range(PORTS))
    proc = subprocess.Popen(
        ["unshare", "-Urn", "--", "sh", "-ec",
         f"{make}; exec {sys.executable} -m netem.packetline {tmp_path / 'spec.json'}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(REPO))
    try:
        links = [(s, d) for s in range(PORTS) for d in range(PORTS) if s != d]
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + 20.0
        for s, d in links:
            proc.stdin.write((json.dumps({"op": "set", "src": s, "dst": d,
                                          "delay_ms": 2.0 + s}) + "\n").encode())
        proc.stdin.flush()
        sets = _read_lines(fd, len(links), deadline)
        assert all(r["ok"] for r in sets), [r for r in sets if not r["ok"]][:3]
        # two stats requests before reading: the second queues behind the unread first
        proc.stdin.write(b'{"op": "stats"}\n{"op": "stats"}\n')
        proc.stdin.flush()
        time.sleep(0.3)
        replies = _read_lines(fd, 2, deadline)
        for r in replies:
            assert r["ok"] and len(r["stats"]["links"]) == len(links)
            assert r["stats"]["engine"] == engine
        assert len(json.dumps(replies[0])) > 64 << 10     # more than one pipe's worth
        by_link = {(e["src"], e["dst"]): e for e in replies[1]["stats"]["links"]}
        assert all(by_link[(s, d)]["impairment"]["delay_ms"] == 2.0 + s for s, d in links)
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
