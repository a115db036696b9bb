"""Every directed link of 8 workers at once, on the skewed profile (50 Mbit/s, 6 links at
5 Mbit/s): each flow within 5 % of its rate under tc over the kernel's bridge
(benchmarks/bench_shaping.py's all-to-all row, in CI). With the packet delay line in the path
the same row does not hold yet: the line forwards about 17,000 frames a second on these 2 cores,
and 56 flows at 50 Mbit/s send small GSO frames (docs/NETWORK.md, "The packet delay line").

Measured by the probe's receivers (bytes read over their own clocks) and cross-checked by the
senders' kernels (TCP_INFO's acknowledged bytes, ``netem.tcpinfo``), not by the shaper's
arithmetic.

On a busy machine 16 probe threads share the 2 cores with other jobs, and a flow can fall short
of its rate through a process, not the shaper: its sender had nothing queued (TCP_INFO idle) or
its receiver did not read (window-limited). The senders' kernels time both, so a flow's lower
bound is 0.95 of the share of the window it was held back by neither (1 on an idle machine,
where the bound is 0.95 as before). A receiver that waited for a core before the window opened
reads its backlog inside it: its upper bound is 1.05 plus that wait (``preempted_ms``) over the
window.
"""
from __future__ import annotations

WORKERS = 8
SKEWED = {"bw_profile": "skewed", "rate_mbit": 50.0, "slow_rate_mbit": 5.0}


SECONDS = 3.0


def _free(row: dict) -> float:
    """The share of the window the flow was held back by no process: its sender had data
    queued and its receiver's window was open (TCP_INFO's chrono states, ``netem.tcpinfo``)."""
    sender = row["sender"]
    return max(0.0, 1.0 - sender["idle"] - sender["rwnd_limited"])


def _off(rows: list[dict], key, slack: float) -> list[str]:
    return [f"{r['src']}->{r['dst']}: {key(r):.3f} of {r['configured_mbit']} Mbit/s "
            f"(held back by no process {_free(r):.3f})"
            for r in rows if not 0.95 * _free(r) <= key(r) <= 1.05 + slack]


def _acked(row: dict) -> float:
    return row["sender"]["acked_mbit"] / row["configured_mbit"]


def test_skewed_all_to_all_every_flow_within_5pct(tc_caps, scenario, preempted_ms):
    res = scenario.run({"action": "probe", "workers": WORKERS, "net": SKEWED, "seconds": SECONDS,
                        "parallel": True, "pings": 3}, timeout_s=120.0)
    rows = res["rows"]
    assert len(rows) == WORKERS * (WORKERS - 1)
    assert sorted({r["configured_mbit"] for r in rows}) == [5.0, 50.0]
    # rates only: the kernel's bridge carries them whatever the delay mode (no packet line)
    assert res["packet_line"] is None
    steal = max(r["host_steal"] or 0.0 for r in rows)
    off = _off(rows, lambda r: r["ratio"], preempted_ms / 1e3 / SECONDS)
    assert not off, f"receivers (host steal {steal:.1%}):\n" + "\n".join(off)
    # the senders' kernels count acknowledged bytes whatever a receiver process does
    assert not _off(rows, _acked, 0.0), "senders' kernels:\n" + "\n".join(_off(rows, _acked, 0.0))
