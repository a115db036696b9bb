"""ZmqTransport over loopback TCP: real worker processes, plus single-process checks of its waits.

Worker processes come from one spawn pool shared by the module, so each test pays for sockets,
not for importing torch again. Scenario functions run in the workers and return plain data.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

import msgpack
import pytest
import torch
import zmq

from gasloc_emu.simulator.memory import Hub
from gasloc_emu.transport import auth, framing
from gasloc_emu.transport.base import TransportError
from gasloc_emu.transport.schema import WireSchema
from gasloc_emu.transport.zmq_transport import ZmqTransport

pytestmark = pytest.mark.integration

RECV_TIMEOUT_S = 20.0   # a broken exchange fails a worker well before the parent gives up
RESULT_TIMEOUT_S = 60.0
MAX_NUMEL = 1 << 21


def _transport(rank: int, addrs: dict[int, str], model_numel: int = MAX_NUMEL,
               extra: dict | None = None, **kw) -> ZmqTransport:
    """Worker ``rank``; its schema allows the model's messages plus ``extra`` kinds."""
    peers = {p: a for p, a in addrs.items() if p != rank}
    kw = dict(max_numel=MAX_NUMEL, recv_timeout_s=RECV_TIMEOUT_S,
              schema=WireSchema(rank, len(addrs), model_numel, extra)) | kw
    return ZmqTransport(rank, len(addrs), addrs[rank], peers, **kw)


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(max_workers=4, mp_context=mp.get_context("spawn")) as ex:
        yield ex


def _run_workers(pool, scenario, addrs: dict[int, str], **kw) -> list:
    futures = [pool.submit(scenario, rank, addrs, **kw) for rank in range(len(addrs))]
    return [f.result(timeout=RESULT_TIMEOUT_S) for f in futures]


# -- scenarios (run inside worker processes)

def _payload(src: int, dst: int, round_idx: int, numel: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float32) * (1 + src) + 1000 * dst + 0.5 * round_idx


def _exchange_all(rank: int, addrs: dict[int, str], rounds: int, sizes: list[int]) -> dict:
    """Every worker sends to every other, every round; checks what it received."""
    torch.set_num_threads(1)
    extra = {f"x{i}": (numel,) for i, numel in enumerate(sizes)}
    with _transport(rank, addrs, extra=extra) as tp:
        peers = [p for p in addrs if p != rank]
        for t in range(rounds):
            for size_idx, numel in enumerate(sizes):
                for p in peers:
                    tp.send(p, t, f"x{size_idx}", _payload(rank, p, t, numel))
                for p in peers:
                    got = tp.recv(p, t, f"x{size_idx}")
                    assert torch.equal(got, _payload(p, rank, t, numel)), (rank, p, t, numel)
        return tp.counters()


def _all_reduce(rank: int, addrs: dict[int, str], numel: int) -> bytes:
    torch.set_num_threads(1)
    with _transport(rank, addrs, model_numel=numel) as tp:  # the schema's ring chunks
        return tp.all_reduce_mean(3, _rank_input(rank, numel)).numpy().tobytes()


def _background_all_reduce(rank: int, addrs: dict[int, str], numel: int, busy_s: float) -> dict:
    """Start the All-Reduce, stay busy (not touching the transport) for ``busy_s``, then wait:
    the ring must progress meanwhile, so the wait is short."""
    torch.set_num_threads(1)
    with _transport(rank, addrs, model_numel=numel) as tp:
        time.sleep(0.5 * rank)  # staggered: worker 0's ring cannot finish before worker 2 starts
        t0 = time.perf_counter()
        pending = tp.start_all_reduce_mean(3, _rank_input(rank, numel))
        start_s = time.perf_counter() - t0
        time.sleep(busy_s)
        t0 = time.perf_counter()
        mean = pending.wait()
        return {"mean": mean.numpy().tobytes(), "wait_s": time.perf_counter() - t0,
                "start_s": start_s, "counted_wait_s": tp.counters()["wait_s"]}


def _rank_input(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 + rank))


def _early_sender_or_receiver(rank: int, addrs: dict[int, str]) -> dict:
    """Worker 1 sends rounds 3, 2, 1 before round 0 and leaves; worker 0 asks in round order."""
    torch.set_num_threads(1)
    with _transport(rank, addrs, extra={"a": (5,), "go": (1,)}, linger_s=10.0) as tp:
        if rank == 1:
            for t in (3, 2, 2, 1):  # round 2 twice: the second is a duplicate
                tp.send(0, t, "a", torch.full((5,), float(t)))
            tp.send(0, 0, "go", torch.zeros(1))
            return tp.counters()  # close() flushes within the linger
        tp.recv(1, 0, "go")  # same connection, in order: rounds 1..3 are all in by now
        time.sleep(0.3)
        for t in (1, 2, 3):
            assert torch.equal(tp.recv(1, t, "a"), torch.full((5,), float(t)))
        return tp.counters()


def _gossip_rounds(rank: int, addrs: dict[int, str], rounds: int) -> dict:
    """Workers 0 and 1 swap tensors for a few rounds; worker 0 first waits for the garbage."""
    torch.set_num_threads(1)
    with _transport(rank, addrs, model_numel=50_000, extra=GARBAGE_KINDS) as tp:
        if rank == 0:
            tp.recv(1, 0, "sync")  # a spoofed, valid message sent after the whole garbage burst
        for t in range(rounds):
            tp.send(1 - rank, t, "z", _payload(rank, 1 - rank, t, 50_000))
            assert torch.equal(tp.recv(1 - rank, t, "z"), _payload(1 - rank, rank, t, 50_000))
        return tp.counters()


# -- the tests with worker processes

@pytest.mark.parametrize("world", [2, 4])
def test_exchange_delivers_exactly_what_was_sent(pool, world, loopback_addrs):
    sizes = [1_000_003, 10, 0]  # a zero-copy 4 MB payload, a copied small one, an empty one
    results = _run_workers(pool, _exchange_all, loopback_addrs(world), rounds=3, sizes=sizes)
    expected_bytes = 3 * 4 * sum(sizes)
    for rank, counters in enumerate(results):
        assert counters["dropped"] == 0
        assert set(counters["bytes_recv"].values()) == {expected_bytes}, rank


def _in_memory_mean(world: int, numel: int) -> list[bytes]:
    """The simulator's all_reduce_mean over the same inputs (the same ring, from base)."""
    hub, out = Hub(world), [b""] * world

    def run(rank: int) -> None:
        with hub.cond:
            mean = hub.transport(rank).all_reduce_mean(3, _rank_input(rank, numel))
            out[rank] = mean.numpy().tobytes()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(RESULT_TIMEOUT_S)
    return out


@pytest.mark.parametrize("world", [3, 4])
def test_ring_all_reduce_matches_in_memory_bit_for_bit(pool, world, loopback_addrs):
    numel = 100_003  # not a multiple of the world size: unequal chunks
    got = _run_workers(pool, _all_reduce, loopback_addrs(world), numel=numel)
    reference = _in_memory_mean(world, numel)
    assert got == reference
    assert len(set(got)) == 1  # every worker holds the same bits


def test_a_background_all_reduce_progresses_while_the_worker_is_busy(pool, loopback_addrs):
    """The overlapped DiLoCo contract: the mean is the ring's, bit for bit, and it is done
    by the time the worker comes back from 1.5 s of other work (a staggered start included:
    each worker's ring waits only for its neighbours' threads, never for their main threads)."""
    numel = 100_003
    got = _run_workers(pool, _background_all_reduce, loopback_addrs(3), numel=numel,
                       busy_s=1.5)
    assert [g["mean"] for g in got] == _in_memory_mean(3, numel)
    assert max(g["start_s"] for g in got) < 0.2, [g["start_s"] for g in got]
    assert max(g["wait_s"] for g in got) < 0.2, [g["wait_s"] for g in got]
    # the worker's own waiting is what it blocked in wait(), not the ring thread's waits
    assert all(g["counted_wait_s"] == pytest.approx(g["wait_s"], abs=0.05) for g in got)


def test_early_messages_are_kept_until_asked_for(pool, loopback_addrs):
    receiver, _sender = _run_workers(pool, _early_sender_or_receiver, loopback_addrs(2))
    assert receiver["drop_reasons"] == {"duplicate": 1}


GARBAGE_KINDS = {"junk": (2,), "dup": (2,), "sync": (1,)}


def _garbage_burst(self_rank: int = 0) -> tuple[list[list[bytes]], dict[str, int]]:
    """Junk for worker 0 of 2, and the drop reasons it must produce."""
    def msg(payload: bytes = bytes(8), **changes) -> list[bytes]:
        header = {"v": 1, "src": 1, "round": 0, "kind": "junk", "dtype": "float32",
                  "shape": [2], "nbytes": 8} | changes
        return [msgpack.packb(header), payload]

    burst = [
        [b"junk"], [b"junk", b"junk", b"junk"],                          # frames
        [b"\xc1\xc1", b""], [msgpack.packb([1, 2, 3]), b""],              # header
        msg(bytes(5)),                                                    # nbytes (truncated)
        msg(src=7), msg(src=self_rank),                                   # src
        msg(round=100),                                                   # round
        msg(dtype="float64"),                                             # dtype
        msg(shape=[2**40], nbytes=8), msg(shape=[1, 2]),                  # shape
        msg(bytes(4), shape=[1], nbytes=4),                               # shape (consistent)
        msg(bytes(200_000), kind="ag0", shape=[50_000], nbytes=200_000),  # shape: not a chunk
        msg(kind="zz"), msg(kind="rs1"), msg(kind="ag7"),                 # kind (ring of 2: s=0)
        msg(v=9),                                                         # version
        msg(kind="dup"), msg(kind="dup"),                                 # duplicate, then stale
    ]
    expected = {"frames": 2, "header": 2, "nbytes": 1, "src": 2, "round": 1, "dtype": 1,
                "shape": 4, "kind": 3, "version": 1, "duplicate": 1, "stale": 1}
    return burst + [msg(kind="sync", shape=[1], nbytes=4, payload=bytes(4))], expected


def test_garbage_sender_is_dropped_and_counted_while_the_exchange_completes(pool, loopback_addrs):
    addrs = loopback_addrs(2)
    burst, expected = _garbage_burst()
    ctx = zmq.Context()
    junk = ctx.socket(zmq.PUSH)
    junk.connect(addrs[0])  # queued until worker 0 binds; one connection keeps the order
    try:
        futures = [pool.submit(_gossip_rounds, r, addrs, rounds=3) for r in range(2)]
        for frames in burst:
            junk.send_multipart(frames)
        worker0, worker1 = [f.result(timeout=RESULT_TIMEOUT_S) for f in futures]
    finally:
        junk.close(linger=0)
        ctx.term()
    assert worker0["drop_reasons"] == expected
    assert worker0["dropped"] == sum(expected.values())
    assert worker1["dropped"] == 0


# -- single-process checks: waits, shaping, lifecycle (ports picked by the OS, as the launcher does)

EPHEMERAL = "tcp://127.0.0.1:0"


@contextmanager
def _local_pair(model_numel: int = 10, extra: dict | None = None, **kw):
    """Two transports in this process, bound first, then told each other's address; their
    schemas allow a model of ``model_numel`` and the ``extra`` kinds."""
    kw = dict(max_numel=MAX_NUMEL, recv_timeout_s=RECV_TIMEOUT_S) | kw
    with ZmqTransport(0, 2, EPHEMERAL, schema=WireSchema(0, 2, model_numel, extra), **kw) as a, \
            ZmqTransport(1, 2, EPHEMERAL, schema=WireSchema(1, 2, model_numel, extra), **kw) as b:
        table = {0: a.address, 1: b.address}
        a.connect(table)
        b.connect(table)
        yield a, b


def _lone(free_ports, **kw) -> ZmqTransport:
    """Worker 0 of 2 whose peer never comes up (its port was free a moment ago)."""
    kw = dict(max_numel=MAX_NUMEL, recv_timeout_s=RECV_TIMEOUT_S) | kw
    return ZmqTransport(0, 2, EPHEMERAL, {1: f"tcp://127.0.0.1:{free_ports(1)[0]}"}, **kw)


def test_recv_timeout_names_peer_round_and_kind(free_ports):
    with _lone(free_ports, recv_timeout_s=0.3) as tp:
        t0 = time.monotonic()
        with pytest.raises(TransportError, match=r"'z' of round 4 from worker 1"):
            tp.recv(1, 4, "z")
        assert 0.3 <= time.monotonic() - t0 < 1.0


def test_should_stop_aborts_a_wait_within_a_poll_slice(free_ports):
    stop_at = time.monotonic() + 0.2
    with _lone(free_ports, should_stop=lambda: time.monotonic() >= stop_at) as tp:
        with pytest.raises(TransportError, match="stopped while waiting"):
            tp.recv(1, 0, "z")
        assert time.monotonic() - stop_at < 0.15


class FakeShaping:
    """Every message is due ``delay_s`` after it was sent (stamped by the sender), or, in
    delay-only mode, ``delay_s`` after it arrived (the sender stamps nothing)."""

    def __init__(self, delay_s: float, delay_only: bool = False):
        self.delay_s, self.delay_only, self.stamped, self.released = delay_s, delay_only, [], []

    def stamp(self, peer: int, nbytes: int, now_s: float) -> float | None:
        self.stamped.append((peer, nbytes))
        return None if self.delay_only else now_s + self.delay_s

    def release_at(self, src: int, deliver_at: float | None, arrival_s: float) -> float:
        self.released.append((src, deliver_at is None))
        if deliver_at is None:
            return arrival_s + self.delay_s
        return max(deliver_at, arrival_s)

    def latest_release_s(self, src: int, nbytes: int, arrival_s: float) -> float:
        return arrival_s + self.delay_s + 1.0


@pytest.mark.parametrize("delay_only", [False, True])
def test_shaped_messages_wait_in_the_release_queue(delay_only):
    shaper = FakeShaping(delay_s=0.25, delay_only=delay_only)
    with _local_pair(shaping=shaper) as (a, b):
        sent_s = time.time()
        a.send(1, 0, "z", torch.ones(10))
        got = b.recv(0, 0, "z")
        late_s = time.time() - (sent_s + shaper.delay_s)
    assert torch.equal(got, torch.ones(10))
    assert shaper.stamped == [(1, 40)] and shaper.released == [(0, delay_only)]
    assert 0.0 <= late_s < 0.05  # released on time: waits never sleep past a release


def test_delay_counts_from_arrival_even_while_the_worker_computes():
    """A message that arrives while the receiver is busy (not polling) is due one latency after
    it arrived, not one latency after the receiver next looks."""
    shaper = FakeShaping(delay_s=0.2, delay_only=True)
    with _local_pair(shaping=shaper) as (a, b):
        a.send(1, 0, "z", torch.ones(10))
        time.sleep(0.5)  # "computing": nobody calls recv, the message arrives meanwhile
        t0 = time.monotonic()
        got = b.recv(0, 0, "z")
        waited = time.monotonic() - t0
    assert torch.equal(got, torch.ones(10))
    assert waited < 0.15, f"waited {waited:.3f} s: the delay was counted from the recv call"


def test_shaped_messages_are_released_in_due_order_not_arrival_order():
    slow = FakeShaping(delay_s=0.3)
    with _local_pair(extra={"first": (1,), "second": (1,)}, shaping=slow) as (a, b):
        a.send(1, 0, "first", torch.zeros(1))
        slow.delay_s = 0.05
        a.send(1, 0, "second", torch.ones(1))
        b.recv(0, 0, "second")
        t0 = time.monotonic()
        b.recv(0, 0, "first")
        assert time.monotonic() - t0 > 0.15  # still held while "second" was handed out


def test_close_is_bounded_when_the_peer_never_comes(free_ports):
    tp = _lone(free_ports, linger_s=0.2)
    tp.send(1, 0, "z", torch.ones(1 << 20))
    t0 = time.monotonic()
    tp.close()
    tp.close()  # idempotent
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(TransportError, match="closed"):
        tp.recv(1, 0, "z")


def test_what_is_queued_for_a_peer_lost_with_its_host_is_not_waited_for(free_ports):
    """A worker that leaves flushes its last messages for a long linger, but not those for a
    peer lost with its host: they are lost with it (and counted so by the sender)."""
    tp = _lone(free_ports, linger_s=5.0, dead_peers=lambda: {1})
    tp.send(1, 0, "z", torch.ones(1 << 20))
    t0 = time.monotonic()
    tp.close()
    assert time.monotonic() - t0 < 1.0


def test_sending_what_the_data_plane_cannot_carry_is_refused(free_ports):
    with _lone(free_ports, max_numel=100) as tp:
        with pytest.raises(ValueError, match="float64"):
            tp.send(1, 0, "z", torch.ones(3, dtype=torch.float64))
        with pytest.raises(ValueError, match="101 elements"):
            tp.send(1, 0, "z", torch.ones(101))


@pytest.mark.parametrize("bind_addr", ["tcp://*:7000", "tcp://0.0.0.0:7000", "tcp://[::]:7000",
                                       "ipc:///tmp/x", "tcp://127.0.0.1", "tcp://127.0.0.1:*"])
def test_wildcard_or_non_tcp_bind_addresses_are_refused(bind_addr):
    with pytest.raises(ValueError, match="bind_addr"):
        ZmqTransport(0, 2, bind_addr, max_numel=10)


def test_connect_ignores_this_worker_and_refuses_bad_tables(free_ports):
    with _lone(free_ports) as tp:
        tp.connect({0: "tcp://10.9.9.9:1", 1: tp.peer_addrs[1]})  # own entry; same address
        with pytest.raises(ValueError, match="peer 1 is at"):
            tp.connect({1: "tcp://127.0.0.1:9"})
        with pytest.raises(ValueError, match="peer rank 5"):
            tp.connect({5: "tcp://127.0.0.1:9"})
        with pytest.raises(ValueError, match="address of peer 1"):
            ZmqTransport(0, 2, EPHEMERAL, {1: "tcp://127.0.0.1:0"}, max_numel=10)
    with ZmqTransport(0, 2, EPHEMERAL, max_numel=10) as unconnected, \
            pytest.raises(TransportError, match="no address for peer 1"):
        unconnected.send(1, 0, "z", torch.ones(1))


def test_a_message_for_a_round_behind_the_window_is_refused_at_once(free_ports):
    with _lone(free_ports) as tp:
        tp.set_round(5)
        with pytest.raises(TransportError, match="round 3 is behind"):
            tp.recv(1, 3, "z")


def test_a_successor_takes_its_first_rounds_and_none_of_its_predecessors_uncounted():
    """A successor binds its predecessor's address, so what its peers had queued for the dead
    predecessor may reach it: messages of rounds before its first are taken without a count
    (their senders count them lost with the dead), and one of its first round that comes
    before it asks is kept, however far that round is from 0."""
    with _local_pair() as (a, b):
        b.begin_life(40)
        for t in (3, 39, 40):
            a.send(1, t, "z", torch.full((10,), float(t)))
        assert torch.equal(b.recv(0, 40, "z"), torch.full((10,), 40.0))
        assert b.counters()["dropped"] == 0 and b.counters()["drop_reasons"] == {}
        # a worker that is no successor still counts a message behind its window
        a.set_round(10)
        b.send(0, 1, "z", torch.ones(10))
        b.send(0, 10, "z", torch.ones(10))
        a.recv(1, 10, "z")
        assert a.counters()["drop_reasons"] == {"round": 1}


def test_a_sent_tensor_stays_alive_until_it_is_out():
    with _local_pair(model_numel=1 << 20) as (a, b):
        a.send(1, 0, "z", torch.arange(1 << 20, dtype=torch.float32))  # no reference kept here
        gc.collect()
        torch.ones(1 << 20).add_(1)  # would reuse the freed memory
        assert torch.equal(b.recv(0, 0, "z"), torch.arange(1 << 20, dtype=torch.float32))


def test_an_oversized_frame_is_cut_off_by_libzmq_and_the_transport_carries_on():
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.PUSH)
    try:
        with _local_pair(model_numel=1000, max_numel=1000) as (a, b):
            rogue.connect(b.address)
            rogue.send_multipart([b"h", bytes(4 * 1000 + 1)])  # over MAXMSGSIZE: never allocated
            time.sleep(0.3)  # libzmq's I/O thread reads and refuses it while nobody polls
            a.send(1, 0, "z", torch.ones(1000))
            assert torch.equal(b.recv(0, 0, "z"), torch.ones(1000))
            assert b.dropped == 0  # libzmq drops the connection before the message exists
    finally:
        rogue.close(linger=0)
        ctx.term()


def test_a_numbered_message_cut_at_the_size_limit_is_counted_as_lost():
    """A peer's frame over MAXMSGSIZE never exists here (libzmq drops its connection), but the
    sender's next message, after it reconnects, is numbered past it: one "lost" drop."""
    ctx = zmq.Context()
    peer = ctx.socket(zmq.PUSH)
    try:
        with _local_pair(model_numel=1000, max_numel=1000) as (_, b):
            peer.connect(b.address)
            peer.send_multipart(framing.encode(0, 0, "z", torch.ones(1000), seq=0))
            assert torch.equal(b.recv(0, 0, "z"), torch.ones(1000))
            peer.send_multipart(framing.encode(0, 1, "z", torch.ones(1001), seq=1))  # cut
            time.sleep(0.3)   # libzmq reads and cuts it; the PUSH socket reconnects
            peer.send_multipart(framing.encode(0, 1, "z", torch.full((1000,), 2.0), seq=2))
            assert torch.equal(b.recv(0, 1, "z"), torch.full((1000,), 2.0))
            assert b.counters()["drop_reasons"] == {"lost": 1}
    finally:
        peer.close(linger=0)
        ctx.term()


def test_a_pair_numbers_its_messages_and_loses_none():
    with _local_pair() as (a, b):
        for r in range(3):
            a.send(1, r, "z", torch.full((10,), float(r)))
        assert [float(b.recv(0, r, "z")[0]) for r in range(3)] == [0.0, 1.0, 2.0]
        assert b.mailbox.numbering.note(0, 3) == 0 and a._numbers == {1: 3}
        assert b.counters()["drop_reasons"] == {}


# -- authenticated planes (ZAP): who may connect, and who a message is really from

def _security(mode: str = "plain", workers: int = 2) -> auth.Security:
    return auth.Security(auth.RunCredentials.new(workers), mode)


@contextmanager
def _pushers(addr: str, logins: list):
    """PUSH sockets to ``addr``, each set up by its login function (or left as NULL: None)."""
    ctx = zmq.Context()
    socks = []
    try:
        for login in logins:
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            if login is not None:
                login(sock)
            sock.connect(addr)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()


def _as(security: auth.Security, user: str, server: str = "w0"):
    return lambda sock: auth.make_client(sock, security, user, server)


@pytest.mark.parametrize("shaped", [False, True], ids=["direct", "arrival-thread"])
@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_an_authenticated_pair_exchanges_and_drops_nothing(mode, shaped):
    kw = {"shaping": FakeShaping(delay_s=0.0)} if shaped else {}
    # max_numel = the model: a model-sized frame is exactly at the MAXMSGSIZE cut (for CURVE,
    # the encrypted frame is a little bigger and must still get through)
    with _local_pair(1000, security=_security(mode), max_numel=1000, **kw) as (a, b):
        a.send(1, 0, "z", torch.arange(1000.0))
        b.send(0, 0, "z", torch.ones(1000))
        assert torch.equal(b.recv(0, 0, "z"), torch.arange(1000.0))
        assert torch.equal(a.recv(1, 0, "z"), torch.ones(1000))
        assert a.counters()["drop_reasons"] == {} == b.counters()["drop_reasons"]


@pytest.mark.parametrize("shaped", [False, True], ids=["direct", "arrival-thread"])
def test_a_header_naming_another_sender_is_dropped_as_spoofed(shaped):
    """Worker 2 holds the run's keys but claims to be worker 1: the connection says w2."""
    sec = _security(workers=3)
    kw = {"shaping": FakeShaping(delay_s=0.0)} if shaped else {}
    with ZmqTransport(0, 3, EPHEMERAL, max_numel=10, recv_timeout_s=RECV_TIMEOUT_S,
                      security=sec, **kw) as tp, \
            _pushers(tp.address, [_as(sec, "w2"), _as(sec, "w1")]) as (w2, w1):
        w2.send_multipart(framing.encode(1, 0, "z", torch.full((10,), float("nan"))))
        w2.send_multipart(framing.encode(2, 0, "z", torch.full((10,), 2.0)))
        w1.send_multipart(framing.encode(1, 0, "z", torch.full((10,), 1.0)))
        assert torch.equal(tp.recv(2, 0, "z"), torch.full((10,), 2.0))
        assert torch.equal(tp.recv(1, 0, "z"), torch.full((10,), 1.0))
        assert tp.counters()["drop_reasons"] == {"spoofed": 1}


def test_an_authenticated_peer_still_gets_exact_validation():
    sec = _security()
    with _local_pair(security=sec) as (_, b), _pushers(b.address, [_as(sec, "w0", "w1")]) as (w0,):
        for tensor, kind in ((torch.ones(11), "z"), (torch.ones(10, dtype=torch.float64), "z"),
                             (torch.ones(5), "rs3"), (torch.ones(10), "x"),
                             (torch.ones(10), "z")):  # last on this connection: the valid one
            w0.send_multipart(framing.encode(0, 0, kind, tensor))
        assert torch.equal(b.recv(0, 0, "z"), torch.ones(10))
        assert b.counters()["drop_reasons"] == {"shape": 1, "dtype": 1, "kind": 2}


def _keyless_logins(sec: auth.Security) -> tuple[list, set[str]]:
    """Clients without this run's keys, and the ZAP refusals they cause on a worker's PULL."""
    other = _security(sec.mode)  # another run: the right user names, the wrong secret
    if sec.mode == "plain":
        def unknown(sock):
            sock.setsockopt(zmq.PLAIN_USERNAME, b"mallory")
            sock.setsockopt(zmq.PLAIN_PASSWORD, b"guess")
        return [None, _as(other, "w0", "w1"), unknown], {"zap.password", "zap.user"}

    def known_server_key(sock):  # public keys may leak; the client's secret key is what counts
        public, secret = zmq.curve_keypair()
        sock.setsockopt(zmq.CURVE_SERVERKEY, sec.creds.curve_keypair("w1")[0])
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    return [None, _as(other, "w0", "w1"), known_server_key], {"zap.key"}


@pytest.mark.parametrize("mode", ["plain", "curve"])
def test_connections_without_the_runs_keys_deliver_nothing_and_are_counted(mode):
    sec = _security(mode)
    logins, refusals = _keyless_logins(sec)
    with _local_pair(security=sec) as (a, b), _pushers(b.address, logins) as forgers:
        for sock in forgers:  # a forged neighbour: NaN parameters claiming to be worker 0
            # a refused handshake may already have torn the connection down: then libzmq has
            # no pipe to queue on (EAGAIN), which is the same outcome, nothing delivered
            with contextlib.suppress(zmq.Again):
                sock.send_multipart(framing.encode(0, 0, "z", torch.full((10,), float("nan"))),
                                    zmq.NOBLOCK)
        time.sleep(0.5)  # the handshakes fail while nobody polls
        a.send(1, 0, "z", torch.ones(10))
        assert torch.equal(b.recv(0, 0, "z"), torch.ones(10))
        reasons = b.counters()["drop_reasons"]
    assert set(reasons) == refusals and b.mailbox.dropped == 0  # connections, no message
    assert b.dropped >= len(refusals)


def test_security_and_schema_must_fit_the_transport():
    with pytest.raises(ValueError, match="security must be an auth.Security for 2 workers"):
        ZmqTransport(0, 2, EPHEMERAL, max_numel=10, security=_security(workers=3))
    with pytest.raises(ValueError, match="schema is for worker 1 of 2"):
        ZmqTransport(0, 2, EPHEMERAL, max_numel=10, schema=WireSchema(1, 2, 10))
    with pytest.raises(ValueError, match="messages up to 11 elements"):
        ZmqTransport(0, 2, EPHEMERAL, max_numel=10, schema=WireSchema(0, 2, 11))


# -- the real userspace shaper, measured on the receiver's clock

SHAPED_MBIT, SHAPED_LATENCY_S = 8.0, 0.02
BULK_NUMEL, BULK_MESSAGES = 25_000, 8      # 100 kB each: 0.1 s of wire at 8 Mbit/s


def _userspace_pair():
    """Workers 0 and 1 on loopback, each with the product's userspace shaper for a symmetric
    8 Mbit/s, 20 ms link, room for every bulk message at once."""
    from netem.userspace import MAX_QUEUE_S, shaping_from_spec
    spec = {"mode": "userspace", "workers": 2, "up_mbit": {}, "max_queue_s": MAX_QUEUE_S,
            "links": [[s, d, SHAPED_MBIT, SHAPED_LATENCY_S * 1e3] for s, d in ((0, 1), (1, 0))]}
    extra = {"ping": (1,)} | {f"b{i}": (BULK_NUMEL,) for i in range(BULK_MESSAGES)}
    kw = dict(max_numel=BULK_NUMEL, recv_timeout_s=RECV_TIMEOUT_S,
              max_msgs_per_peer=BULK_MESSAGES + 2,
              max_bytes_per_peer=(BULK_MESSAGES + 2) * BULK_NUMEL * 4)
    return [ZmqTransport(r, 2, EPHEMERAL, schema=WireSchema(r, 2, 10, extra),
                         shaping=shaping_from_spec(spec, r), **kw) for r in (0, 1)]


def test_the_userspace_shaper_delivers_its_rate_and_latency_on_the_receivers_clock():
    """What the algorithm sees, timed independently of the shaper's own arithmetic: the sender's
    send times against the receiver's clock when ``recv`` hands each message out. Nothing may
    be handed out before the configured link could have carried it (after the latency plus
    every byte sent so far at the rate), and the bytes arrive at the rate. A shaper that
    released messages early would still carry the right stamps (``deliver_at``) and so the
    right observed rates (``take_timed`` reports the stamp); it fails here."""
    a, b = _userspace_pair()
    with a, b:
        table = {0: a.address, 1: b.address}
        a.connect(table)
        b.connect(table)
        sent = time.time()
        a.send(1, 0, "ping", torch.ones(1))
        b.recv(0, 0, "ping")
        ping_s = time.time() - sent
        sends: list[float] = []

        def bulk():
            for i in range(BULK_MESSAGES):
                sends.append(time.time())
                a.send(1, 0, f"b{i}", torch.full((BULK_NUMEL,), float(i)))

        sender = threading.Thread(target=bulk)
        sender.start()
        got = []
        for i in range(BULK_MESSAGES):
            tensor = b.recv(0, 0, f"b{i}")
            got.append(time.time())
            assert torch.equal(tensor, torch.full((BULK_NUMEL,), float(i)))
        sender.join()
    assert SHAPED_LATENCY_S - 0.0005 <= ping_s <= SHAPED_LATENCY_S + 0.01, ping_s
    wire_s = BULK_NUMEL * 4 * 8 / (SHAPED_MBIT * 1e6)
    for i, at in enumerate(got):  # never early: the link carried i + 1 messages by then
        earliest = sends[0] + (i + 1) * wire_s + SHAPED_LATENCY_S
        assert at >= earliest - 0.001, (i, at - earliest)
    mbit = (BULK_MESSAGES - 1) * BULK_NUMEL * 4 * 8 / (got[-1] - got[0]) / 1e6
    assert mbit == pytest.approx(SHAPED_MBIT, rel=0.05), mbit
