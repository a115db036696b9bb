"""TCP over the emulated WAN: the delay acts before TCP, so a message after idle pays what the
kernel's rules make it pay. 2 workers exchange 0.48 MB after 2 s of nominal compute, over
50 Mbit/s and 50 ms one way:

- under cubic with the restart after idle (the Linux default), each exchange takes the slow-start
  estimate: the window restarts at 10 segments (tcp_cwnd_restart) and doubles per round trip;
- under bbr, which does not restart, about bytes * 8 / rate + latency.

Measured by the workers' own clocks (metrics rows' ``recv_links``) and by the senders' kernels
(``ss`` during training: the smoothed RTT), not by the delay line's arithmetic.
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

RATE_MBIT, ONE_WAY_S = 50.0, 0.050
RTT_S = 2 * ONE_WAY_S
MSS_BYTES, WIRE_BYTES = 1448, 1500       # payload and wire bytes of a full segment (MTU 1500)
INIT_CWND = 10                           # RFC 6928; the restart floor of tcp_cwnd_restart


def slow_start_estimate_s(nbytes: int) -> float:
    """k round trips of slow start from the initial window (10, 20, 40, ... segments), the
    last round's segments serialised at the rate, then the one-way latency. Earlier rounds'
    serialisation hides under their round trip here (160 segments are 38 ms < 100 ms)."""
    segs = math.ceil(nbytes / MSS_BYTES)
    rounds = math.ceil(math.log2(segs / INIT_CWND + 1))
    last_round = segs - INIT_CWND * (2 ** (rounds - 1) - 1)
    return (rounds - 1) * RTT_S + last_round * WIRE_BYTES * 8 / (RATE_MBIT * 1e6) + ONE_WAY_S


def _run(tmp_path: Path, cc: str) -> tuple[list[float], int, dict, dict]:
    out = tmp_path / cc
    res = subprocess.run(
        [sys.executable, "-m", "gasloc_emu", "run", "-n", "2", "--model", "tiny", "-R", "4",
         "-H", "20", "--step-time-s", "0.1", "--topology", "ring", "--bw-profile", "uniform",
         "--rate-mbit", str(RATE_MBIT), "--latency-ms", str(ONE_WAY_S * 1e3),
         "--delay", "packet-line", "--tcp-cc", cc, "--no-probe", "--no-dashboard",
         "--set", "data.max_corpus_mb=0.5", "--set", "data.eval_batches=1",
         "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    times, nbytes = [], 0
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for link in (row.get("recv_links") or {}).values():
            if row["round"] >= 1:             # round 0 also opens the connections
                times.append(link["transfer_s"])
                nbytes = link["bytes"]
    summary = json.loads((out / "summary.json").read_text())
    links = json.loads((out / "links.json").read_text())
    return times, nbytes, summary, links


@pytest.fixture(scope="module")
def runs(tc_caps, tmp_path_factory):
    if not tc_caps.has("packet"):
        pytest.skip("raw packet sockets are missing: no packet line, so TCP cannot see a delay")
    tmp = tmp_path_factory.mktemp("wan")
    # the two runs side by side (each in its own namespaces, mostly asleep in nominal steps)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = {cc: pool.submit(_run, tmp, cc) for cc in ("cubic", "bbr")}
        return {cc: job.result() for cc, job in done.items()}


def test_a_cubic_message_after_idle_takes_the_slow_start_estimate(runs):
    times, nbytes, summary, _ = runs["cubic"]
    assert summary["delay"] == "packet-line" and summary["delay_faithful_to_tcp"]
    assert summary["tcp"]["every_link"]["congestion_control"] == "cubic"
    estimate = slow_start_estimate_s(nbytes)
    assert len(times) == 6 and estimate > 4 * (nbytes * 8 / (RATE_MBIT * 1e6) + ONE_WAY_S)
    off = [t for t in times if abs(t / estimate - 1) > 0.15]
    assert not off, f"estimate {estimate:.3f} s; measured {sorted(times)}"


def test_bbr_does_not_restart_after_idle(runs):
    cubic, _, _, _ = runs["cubic"]
    times, nbytes, _, _ = runs["bbr"]
    naive = nbytes * 8 / (RATE_MBIT * 1e6) + ONE_WAY_S
    assert statistics.median(times) <= 1.25 * naive, (naive, sorted(times))
    assert statistics.median(times) < 0.5 * statistics.median(cubic)


def test_the_senders_kernels_saw_the_round_trip(runs):
    _, _, _, links = runs["cubic"]
    assert links["tcp_sampling"]["error"] is None and links["tcp_sampling"]["rounds"] >= 3
    for row in links["links"]:
        tcp = row["tcp_training"]
        assert abs(tcp["rtt_ms_median"] - RTT_S * 1e3) <= 3.0, tcp
        assert tcp["retrans_segs"] == 0 and tcp["held_by"] == "path", tcp
        # the window grew past the restart floor within an exchange. What it reads while idle
        # says nothing: the kernel applies the restart lazily, on the next send after an RTO of
        # idle (tcp_cwnd_restart from tcp_event_data_sent, net/ipv4/tcp_output.c); the restart
        # itself is shown by the exchange times above.
        assert tcp["cwnd_segs_max"] > 2 * INIT_CWND, tcp
