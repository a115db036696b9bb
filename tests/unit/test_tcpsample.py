"""The senders' TCP during training (``netem.tcpsample``): ss output parsed, sockets grouped into
links, who held a sender back, and the sampler's bounds; no sockets needed."""
from __future__ import annotations

import pytest

from netem import tcpsample as ts

# captured on this machine (iproute2 6.1): a bulk cubic sender, then a bbr one held back by its
# receiver, then a listening-side socket of worker 1's namespace whose peer is worker 0
SS = """\
0      0      198.18.0.2:38764 198.18.0.3:5601
\t cubic wscale:10,10 rto:304 rtt:100.663/0.221 mss:1448 pmtu:1500 rcvmss:536 advmss:1448 \
cwnd:48 ssthresh:20 bytes_sent:4194304 bytes_acked:4194305 segs_out:80 segs_in:14 send \
99783619bps lastsnd:308 pacing_rate 199567238bps delivery_rate 20148615bps retrans:0/3 \
busy:4000ms rwnd_limited:100ms(2.5%) minrtt:100.019
0      0      198.18.0.2:38770 198.18.0.4:5601
\t bbr wscale:7,7 rto:204 rtt:0.252/0.1 mss:1448 cwnd:10 bytes_acked:1000 busy:1000ms \
rwnd_limited:600ms(60.0%) minrtt:0.019
0      0      [::ffff:198.18.0.2]:5600 [::ffff:198.18.0.3]:40000
\t cubic rtt:1.5/0.2 mss:1448 cwnd:10 bytes_acked:1
"""


def test_ss_output_is_parsed_into_sockets_with_their_tcp_info():
    socks = ts.parse_ss(SS)
    assert [s.peer for s in socks] == [("198.18.0.3", 5601), ("198.18.0.4", 5601),
                                       ("198.18.0.3", 40000)]
    a, b, _ = socks
    assert (a.congestion_control, a.rtt_ms, a.min_rtt_ms, a.cwnd_segs, a.ssthresh_segs) == \
        ("cubic", 100.663, 100.019, 48, 20)
    assert (a.bytes_acked, a.retrans_total, a.busy_ms, a.rwnd_limited_ms) == \
        (4194305, 3, 4000.0, 100.0)
    assert b.congestion_control == "bbr" and b.sndbuf_limited_ms == 0.0   # absent: zero
    assert ts.parse_ss("") == [] and ts.parse_ss("garbage line\n\t cwnd:3\n") == []


@pytest.mark.parametrize("busy, rwnd, sndbuf, who", [
    (0, 0, 0, None), (1000, 100, 0, "path"), (1000, 300, 0, "receiver"),
    (1000, 0, 260, "send buffer"), (1000, 250, 250, "path"),
])
def test_who_held_the_sender_back(busy, rwnd, sndbuf, who):
    assert ts.held_by(busy, rwnd, sndbuf) == who


def _sock(local_port, peer, **kw):
    return ts.SocketSample(("198.18.0.2", local_port), (peer, 5601), **kw)


def test_links_are_the_peers_addresses_and_counters_are_deltas_over_training():
    addr = {"198.18.0.2": 0, "198.18.0.3": 1}
    links: dict = {}
    ts.group({0: [_sock(1, "198.18.0.3", rtt_ms=40.0, cwnd_segs=10, busy_ms=100.0,
                        retrans_total=2, bytes_acked=10),
                  _sock(2, "10.0.0.9")]}, addr, links)            # not a worker: ignored
    ts.group({0: [_sock(1, "198.18.0.3", rtt_ms=42.0, cwnd_segs=30, busy_ms=1100.0,
                        rwnd_limited_ms=400.0, retrans_total=5, bytes_acked=1010),
                  _sock(3, "198.18.0.3", rtt_ms=41.0, busy_ms=0.0)]}, addr, links)
    assert list(links) == [(0, 1)]
    s = links[(0, 1)].summary()
    assert (s["connections"], s["samples"], s["rtt_ms_median"], s["rtt_ms_max"]) == \
        (2, 3, 41.0, 42.0)
    assert (s["retrans_segs"], s["bytes_acked"], s["busy_ms"]) == (3, 1000, 1000.0)
    assert s["held_by"] == "receiver" and s["cwnd_segs_max"] == 30


class FakeRun:
    def __init__(self, outputs, fail_at=None):
        self.outputs, self.calls, self.fail_at = outputs, [], fail_at

    def __call__(self, argv, timeout_s):
        self.calls.append(argv)
        if self.fail_at is not None and len(self.calls) >= self.fail_at:
            raise RuntimeError("ss exited 1: Cannot open netlink socket")
        return self.outputs


def test_the_sampler_runs_ss_in_each_namespace_and_samples_once_more_at_stop():
    run = FakeRun(SS)
    sampler = ts.TcpSampler([0, 1], {"198.18.0.3": 1, "198.18.0.2": 0},
                            lambda r, argv: ["ip", "netns", "exec", f"w{r}", *argv], run,
                            interval_s=0.05)
    sampler.sample_once()
    sampler.stop()                                   # never started: no extra sample
    assert run.calls[0][:4] == ["ip", "netns", "exec", "w0"] and run.calls[1][3] == "w1"
    assert tuple(run.calls[0][4:]) == ts.SS_ARGV
    summary = sampler.summary()
    assert summary["rounds"] == 1 and summary["error"] is None
    # worker 1's namespace printed the same text: sockets whose peer is worker 1 itself are
    # no link of its; an IPv4-mapped peer is the IPv4 address
    assert set(summary["links"]) == {(0, 1)}
    assert summary["links"][(0, 1)]["connections"] == 2


def test_a_failing_ss_stops_the_sampler_and_is_recorded():
    run = FakeRun(SS, fail_at=2)
    sampler = ts.TcpSampler([0], {"198.18.0.3": 1}, lambda r, argv: argv, run, interval_s=0.05)
    sampler.start()
    sampler.stop()
    summary = sampler.summary()
    assert "netlink" in summary["error"] and summary["rounds"] == 1
    assert len(run.calls) == 2                       # not retried


def test_the_interval_is_validated():
    with pytest.raises(ts.TcpSampleError, match=r"interval_s = 0.001 is out of range"):
        ts.TcpSampler([0], {}, lambda r, a: a, FakeRun(""), interval_s=0.001)
