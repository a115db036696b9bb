"""What time dilation's fixed kernel constants cost, by simulate's TCP model (netem.tcpmodel).

    python benchmarks/bench_dilation.py [--ks 1,4,10,100] [--bytes 480000] [--idle-s 1.0]

For each representative link and K, a series of messages on one connection (each offered
``--idle-s`` after the previous one arrived, so the restart after idle counts) is timed on the
emulated clock three ways: as at K = 1; with TCP as the dilated run has it (``seen_at(K)``:
rto_min scaled by the route, every other constant fixed in wall time); and with each fixed
constant alone left fixed (the rest scaled as if the kernel allowed it), to say which one
moves the time; every constant scaled leaves one change, tc's GSO packets sized for the
dilated rate (smaller: ACKs closer together in emulated time), in its own column, and in
every "only" column too. Printed: the first message and the mean of the rest, in ms, and each one's
change against K = 1 in %. Socket-free: it measures the model, not a kernel.
"""
from __future__ import annotations

import argparse

from netem.commands import gso_segments
from netem.tcpmodel import DILATABLE, TcpParams, after_idle_series

LINKS = (("50 Mbit/s 50 ms cubic", "cubic", 50.0, 0.100),
         ("1 Gbit/s 30 ms cubic", "cubic", 1000.0, 0.060),
         ("40 Mbit/s 15 ms cubic", "cubic", 40.0, 0.030),
         ("50 Mbit/s 50 ms bbr", "bbr", 50.0, 0.100))
FIXED = ("hystart_ack_delta_s", "hystart_delay_min_s", "cubic_c", "rto_max_s")


def times_ms(params: TcpParams, rate: float, rtt: float, nbytes: int, idle_s: float,
             messages: int) -> tuple[float, float]:
    out = after_idle_series(params, rate, rtt, nbytes, idle_s, messages)
    rest = [t.total_s for t in out[1:]]
    return out[0].total_s * 1e3, sum(rest) / len(rest) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", default="1,4,10,100")
    ap.add_argument("--bytes", type=int, default=16_000_000)
    ap.add_argument("--idle-s", type=float, default=1.0)
    ap.add_argument("--messages", type=int, default=6)
    a = ap.parse_args()
    ks = [float(k) for k in a.ks.split(",")]
    print(f"messages of {a.bytes} B, {a.idle_s:g} s idle between them (emulated), "
          f"{a.messages} per connection; first / mean of the rest in ms (change vs K = 1)")
    head = f"{'link':24s} {'K':>5s} {'as run at K':>22s} {'only GSO at rate/K':>22s}" + "".join(
        f" {'only ' + n.replace('_s', '').replace('hystart_', 'hs_'):>22s}" for n in FIXED)
    print(head)
    for name, cc, rate, rtt in LINKS:
        ref = times_ms(TcpParams(congestion_control=cc, burst_segments=gso_segments(rate, 1500)),
                       rate, rtt, a.bytes, a.idle_s, a.messages)
        for k in ks:
            # tc sizes the GSO packets for the dilated rate, as the run's model does
            base = TcpParams(congestion_control=cc, burst_segments=gso_segments(rate / k, 1500))
            cells = [base.seen_at(k)]   # as the dilated run: rto_min scaled, the rest fixed
            # every constant scaled: what is left is tc's GSO packets sized for rate / K
            cells.append(base.seen_at(k, frozenset(DILATABLE)))
            for n in FIXED:             # only n fixed: every other constant scaled
                cells.append(base.seen_at(k, frozenset(set(DILATABLE) - {n})))
            row = f"{name:24s} {k:5g}"
            for p in cells:
                first, rest = times_ms(p, rate, rtt, a.bytes, a.idle_s, a.messages)
                row += f" {first:7.1f}/{rest:6.1f} ({(rest / ref[1] - 1) * 100:+5.1f}%)"
            print(row)


if __name__ == "__main__":
    main()
