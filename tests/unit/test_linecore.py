"""The compiled core of the packet line (netem/_linecore.c) decides a fixed-delay link as
LinkLine does (netem/impair.py): the same frames at the same arrival times give the same
release times, to the bit, and the same queue and budget drops. No socket carries a frame:
``Core.frame`` decides one as if read from a port, ``Core.pop_due`` takes what is due."""
from __future__ import annotations

import heapq
import random
import socket
import struct

import pytest

from netem.impair import ByteBudget, Impairment, LinkLine
from netem.packetline import (
    GSO_TCPV4,
    PER_FRAME_COST_BYTES,
    VNET_HDR,
    PacketLine,
    PacketLineSpec,
    Port,
    engine_available,
)

pytestmark = pytest.mark.skipif(not engine_available(),
                                reason="netem._linecore is not built (no compiler at install)")

ADDR = ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
GLOBAL_LIMIT = 1 << 20


def _frame(dst: int, payload: int, gso_size: int = 0) -> bytes:
    vnet = VNET_HDR.pack(0, GSO_TCPV4 if gso_size else 0, 0, gso_size, 0, 0)
    eth = bytes(6) + bytes(6) + b"\x08\x00"
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40 + payload, 0, 0, 64, 6, 0,
                     socket.inet_aton(ADDR[0]), socket.inet_aton(ADDR[dst]))
    tcp = bytes(12) + bytes([0x50]) + bytes(7)
    return vnet + eth + ip + tcp + bytes(payload)


def _core_line(links: dict) -> tuple[PacketLine, list[socket.socket]]:
    spec = PacketLineSpec(ports=tuple(Port(k, f"p{k}", a) for k, a in enumerate(ADDR)),
                          links=links, global_limit_bytes=GLOBAL_LIMIT, engine="c")
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in ADDR]
    line = PacketLine(spec, control_fd=None)
    line.start_core([s.fileno() for s in socks])
    for key in links:
        line.line(*key)
    return line, socks


def _reference(links: dict, events: list) -> tuple[list, dict]:
    """LinkLine's answers on the same events, with the forwarder's heap around them."""
    budget = ByteBudget(GLOBAL_LIMIT, PER_FRAME_COST_BYTES)
    lines = {k: LinkLine(imp, 1, *k, budget=budget) for k, imp in links.items()}
    heap, seq, out = [], 0, []
    for kind, *ev in events:
        if kind == "frame":
            dst, frame, arrival, segments = ev
            line, size = lines[(0, dst)], len(frame) - 10
            if segments:
                v = line.admit_gso(size, arrival, segments)
                r, hb, hp = v.release_s, v.held_bytes, v.held_pkts
            else:
                r, hb, hp = line.admit(size, arrival), size, 1
            if r is not None:
                seq += 1
                heapq.heappush(heap, (r, seq, dst, len(frame), hb, hp))
        else:
            while heap and heap[0][0] <= ev[0]:
                r, _, dst, n, hb, hp = heapq.heappop(heap)
                lines[(0, dst)].released(hb, hp)
                out.append((r, dst, n, hb, hp))
    return out, {k: (ln.counters.as_dict(), ln.held_pkts, ln.held_bytes)
                 for k, ln in lines.items()}


def test_the_core_releases_and_drops_as_linkline_does():
    links = {(0, 1): Impairment(delay_ms=3.7, limit_pkts=40, limit_bytes=60_000),
             (0, 2): Impairment(delay_ms=30.0)}    # default queue: the budget is what binds
    rnd = random.Random(5)
    events, t = [], 1_700_000_000.123456789
    for _ in range(4000):
        t += rnd.expovariate(1 / 20e-6)
        if rnd.random() < 0.1:
            events.append(("due", t - rnd.random() * 1e-3))
            continue
        dst = rnd.choice((1, 2))
        gso = 1448 if rnd.random() < 0.2 else 0
        frame = _frame(dst, rnd.randint(1, 20_000 if gso else 1460), gso)
        # arrivals a little out of order, as two ports' stamps read in turn are
        arrival = t - rnd.random() * 50e-6
        events.append(("frame", dst, frame, arrival, -(-(len(frame) - 64) // gso) if gso
                       else 0))
    events.append(("due", t + 1.0))
    want, want_links = _reference(links, events)

    line, socks = _core_line(links)
    got = []
    for kind, *ev in events:
        if kind == "frame":
            line.core.frame(0, ev[1], ev[2])
        else:
            got += line.core.pop_due(ev[0])
    for s in socks:
        s.close()
    assert len(want) > 1000
    assert got == want                          # release times equal to the bit
    stats = line.stats()
    for entry in stats["links"]:
        counters, held_pkts, held_bytes = want_links[(entry["src"], entry["dst"])]
        assert entry["counters"] == counters
        assert (entry["held_pkts"], entry["held_bytes"]) == (held_pkts, held_bytes)
    drops = {(e["src"], e["dst"]): e["counters"]["dropped_pkts"]["queue"]
             for e in stats["links"]}
    assert drops[(0, 1)] > 0 and drops[(0, 2)] > 0, drops   # both limits acted
    assert stats["budget"]["refused"] > 0 and stats["engine"] == "c"


def test_a_link_that_starts_drawing_hands_its_queue_to_its_linkline():
    line, socks = _core_line({(0, 1): Impairment(delay_ms=5.0)})
    t = 1_700_000_000.0
    for i in range(10):
        line.core.frame(0, _frame(1, 100), t + i * 1e-3)
    line.control({"op": "set", "src": 0, "dst": 1, "loss_pct": 50.0})
    ll = line.lines[(0, 1)]
    assert (ll.held_pkts, ll.counters.admitted_pkts) == (10, 10)
    assert ll._last_release_s == t + 9e-3 + 5e-3
    released = line.core.pop_due(t + 1)
    for _si, _di, nbytes, pkts in line.core.take_released():
        ll.released(nbytes, pkts)
    for s in socks:
        s.close()
    assert len(released) == 10 and ll.held_pkts == 0 and ll.counters.forwarded_pkts == 10


def test_the_spec_and_the_environment_pick_the_engine(monkeypatch):
    from netem.packetline import ENGINE_ENV, SpecError
    ports = (Port(0, "p0", ADDR[0]),)
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    assert PacketLineSpec(ports=ports).engine_to_run() == "c"
    assert PacketLineSpec(ports=ports, engine="python").engine_to_run() == "python"
    data = PacketLineSpec(ports=ports).to_json()
    del data["engine"]                           # a spec from before the field: auto
    assert PacketLineSpec.from_json(data).engine == "auto"
    monkeypatch.setenv(ENGINE_ENV, "python")
    assert PacketLineSpec(ports=ports).engine_to_run() == "python"
    assert PacketLineSpec(ports=ports, engine="c").engine_to_run() == "c"
    monkeypatch.setenv(ENGINE_ENV, "fast")
    with pytest.raises(SpecError, match="NETEM_PACKETLINE_ENGINE = 'fast'"):
        PacketLineSpec(ports=ports).engine_to_run()
    with pytest.raises(SpecError, match="engine = 'gpu' is not allowed"):
        PacketLineSpec(ports=ports, engine="gpu")
