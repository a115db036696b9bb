"""Hunt the tc shortfall: build the 12-link set-up many times and record what could explain it.

    python benchmarks/tc_shortfall.py [--setups 200] [--seconds 3] [--budget-s 3600] [--out F]

The set-up is tests/net/test_shaping.py's: 4 workers, every directed link at 20 Mbit/s except
0<->3 and 1<->2 at 5 Mbit/s, all 12 links probed at once. In about one set-up of four some
runs read every 20 Mbit/s link at 0.88-0.93 of its rate together (docs/NETWORK.md, "Known
problems"). Each set-up here is built fresh, probed, and then described from the kernel's side
before it is torn down: every qdisc and class with its statistics (bytes, packets, drops,
overlimits, requeues, tokens, ctokens, quantum), and each device's GSO/TSO limits and queue
length, in every namespace and on the host; and each sender's kernel account of the window
(``netem.tcpinfo``: the share of it spent sending, idle because its process wrote nothing, or
held back by its receiver's window or its own send buffer). With --burst-ms A,B,... the
set-ups take the HTB bursts in turn (side by side, as the host's steal time comes and goes);
with --ack-frame-b A,B,... they take the link classes' room for the reverse link's ACKs in
turn (``netem.commands.ACK_FRAME_B``; 0: none, the ACKs paid out of the link's rate), crossed
with the bursts.
One JSON line per set-up goes to --out, with the per-link ratios and a ``short`` flag (every
fast link under 0.95); the loop stops after
--setups set-ups, at the first --stop-after shortfalls, or when --budget-s runs out. Run it on
an otherwise idle host: a busy CPU makes its own shortfall.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gasloc_emu.config import NetConfig
from netem import commands
from netem.capabilities import choose_shaper, probe
from netem.hoststat import cpu_shares, cpu_times
from netem.namespaces import NetworkSession, reexec_in_userns
from netem.probe import probe_links
from netem.profiles import build_link_plan

PROFILE = ("[default]\nrate_mbit = 20\n"
           "[[link]]\nsrc = 0\ndst = 3\nrate_mbit = 5\nsymmetric = true\n"
           "[[link]]\nsrc = 1\ndst = 2\nrate_mbit = 5\nsymmetric = true\n")
SHORT = 0.95  # a fast link under this ratio is short


def _json(argv: list[str]):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[:300], "argv": argv[-6:]}
    try:
        return json.loads(out.stdout or "null")
    except json.JSONDecodeError:
        return {"text": out.stdout[:2000]}


def _devices(wrap) -> list[dict]:
    links = _json(wrap(["ip", "-j", "-d", "link", "show"])) or []
    return [{k: d.get(k) for k in ("ifname", "mtu", "qlen", "gso_max_size", "gso_max_segs",
                                   "tso_max_size", "gro_max_size")} for d in links
            if isinstance(d, dict) and d.get("ifname") != "lo"]


def kernel_view(wrap) -> dict:
    """Devices, qdiscs and classes with statistics, as ``wrap`` (a namespace or the host)
    sees them."""
    devs = _devices(wrap)
    return {"devices": devs,
            "qdiscs": _json(wrap(["tc", "-s", "-j", "qdisc", "show"])),
            "classes": {d["ifname"]: _json(wrap(["tc", "-s", "-d", "-j", "class", "show",
                                                 "dev", d["ifname"]]))
                        for d in devs if d.get("ifname")}}


def held_back(senders: dict) -> dict[str, float]:
    """The largest share of the window any sender spent in each state that is not sending:
    idle (its process wrote nothing), limited by its receiver's window or its own buffer."""
    known = [v for v in senders.values() if v]
    return {k: max((v[k] for v in known), default=float("nan"))
            for k in ("idle", "rwnd_limited", "sndbuf_limited")}


def one_setup(net: NetConfig, seconds: float) -> dict:
    plan = build_link_plan(net, 4, seed=0)
    with NetworkSession(plan, choose_shaper("tc", probe())) as session:
        before = cpu_times()
        rows = probe_links(session, seconds_per_link=seconds, parallel=True, pings=3)
        cpu = cpu_shares(before, cpu_times())
        views = {str(r): kernel_view(lambda argv, r=r: session.wrap(r, argv)) for r in range(4)}
        views["host"] = kernel_view(lambda argv: argv)
    fast = [r["ratio"] for r in rows if r["configured_mbit"] == 20.0]
    ratios = [r["ratio"] for r in rows]
    return {"ratios": {f"{r['src']}->{r['dst']}": r["ratio"] for r in rows},
            "senders": {f"{r['src']}->{r['dst']}": r.get("sender") for r in rows},
            "short": bool(fast) and max(fast) < SHORT, "min_fast": min(fast, default=None),
            "max_fast": max(fast, default=None), "min_all": min(ratios), "max_all": max(ratios),
            "within_5pct": all(0.95 <= x <= 1.05 for x in ratios), "cpu": cpu,
            "kernel": views}


def summary_line(rec: dict) -> str:
    cpu, held = rec["cpu"], held_back(rec["senders"])
    return (f"set-up {rec['setup']} (burst {rec['burst_ms']:g} ms, ACK room "
            f"{rec['ack_frame_b']} B): fast links "
            f"{rec['min_fast']:.3f}-{rec['max_fast']:.3f}, all {rec['min_all']:.3f}-"
            f"{rec['max_all']:.3f}; senders idle up to {held['idle']:.3f}, receiver-limited up "
            f"to {held['rwnd_limited']:.3f}, buffer-limited up to {held['sndbuf_limited']:.3f}; "
            f"cpu idle {cpu['idle']:.2f} softirq {cpu['softirq']:.2f} steal {cpu['steal']:.2f} "
            f"other user+sys {cpu['user'] + cpu['nice'] + cpu['system']:.2f}"
            f"{'  SHORT' if rec['short'] else ''}{'' if rec['within_5pct'] else '  OUTSIDE 5%'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--budget-s", type=float, default=3600.0)
    parser.add_argument("--stop-after", type=int, default=3, help="shortfalls to collect")
    parser.add_argument("--out", default="tc-shortfall.jsonl")
    parser.add_argument("--burst-ms", default=None,
                        help="HTB bursts to take in turn, in ms of each class's rate "
                             "(default: the product's netem.commands.BURST_S)")
    parser.add_argument("--ack-frame-b", default=None,
                        help="ACK bytes per frame of reverse data that link classes leave room "
                             "for, to take in turn (default: the product's "
                             "netem.commands.ACK_FRAME_B; 0: no room)")
    args = parser.parse_args()
    bursts_s = ([float(x) / 1e3 for x in args.burst_ms.split(",")] if args.burst_ms
                else [commands.BURST_S])
    acks_b = ([int(x) for x in args.ack_frame_b.split(",")] if args.ack_frame_b
              else [commands.ACK_FRAME_B])
    variants = [(b, a) for b in bursts_s for a in acks_b]
    # tc needs namespaces of our own, as the launcher's: re-run inside a user namespace
    if not reexec_in_userns(sys.argv[1:], entry=[sys.executable, os.path.abspath(__file__)]):
        print("user namespaces do not work here: no tc set-up to build", file=sys.stderr)
        return 2
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(PROFILE)
    net = NetConfig(bw_profile=f.name, shaper="tc")
    t0, shortfalls = time.monotonic(), 0
    run = {v: 0 for v in variants}      # per variant: set-ups in a row, every link within 5 %
    longest = dict(run)
    with open(args.out, "w") as out:
        for n in range(args.setups):
            if time.monotonic() - t0 > args.budget_s or shortfalls >= args.stop_after:
                break
            v = variants[n % len(variants)]
            commands.BURST_S, commands.ACK_FRAME_B = v   # the commands read them per call
            rec = one_setup(net, args.seconds) | {"setup": n, "t_s": time.monotonic() - t0,
                                                  "burst_ms": v[0] * 1e3, "ack_frame_b": v[1]}
            shortfalls += rec["short"]
            out.write(json.dumps(rec) + "\n")
            out.flush()
            run[v] = run[v] + 1 if rec["within_5pct"] else 0
            longest[v] = max(longest[v], run[v])
            print(summary_line(rec), flush=True)
    runs = ", ".join(f"burst {b * 1e3:g} ms, ACK room {a} B: {k}"
                     for (b, a), k in longest.items())
    print(f"{shortfalls} shortfall(s) in {n + 1} set-ups; longest run of consecutive set-ups "
          f"with every link within 5 % (by variant) {runs}; details in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
