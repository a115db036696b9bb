"""Measured links between cloud regions -> ``netem/data/cloud_regions.json``, the table the
``cloud`` bandwidth profile reads (``netem.cloud``).

Three public measurement sets (kept in ``../shared/data/wan`` beside the repository; their
README names sources, commits and licences, repeated in ``SOURCES``):

- ``skyplane-throughput.csv``: iperf3 goodput with 64 TCP connections between large VMs, the
  path's *capacity*, bits/s (the received side is taken: what arrived);
- ``skyplane-latency.csv``: ping RTT, ms;
- ``intercloud-throughput.csv``: *one* TCP stream between small AWS/GCP VMs, bytes/s, with
  the connection's average RTT, ms.

Per directed region pair the table holds ``capacity_mbit`` (median of the Skyplane rows),
``single_stream_mbit`` (median of the intercloud rows), ``rtt_ms`` and how many rows each came
from; pairs only pinged, never timed, are left out. The RTT is the *lower median* of the
Skyplane ping rows (a measured value; with two rows the lower): delay only grows by
disturbance, and repeated pings of one pair differ up to 90x (gcp:asia-northeast1 to itself:
1.1 and 106 ms). Where Skyplane never pinged a -> b, the RTT is, in this order, Skyplane's b ->
a (a round trip is the same path), intercloud's a -> b, intercloud's b -> a; ``rtt_source``
says which. GCP names drop Skyplane's zone (``-a``, ``-b``; one zone per region in these data)
so that both sets name a region alike; ``gcp_zones`` keeps what was measured.

Same CSVs and same ``--derived`` date give a byte-identical file (sorted, fixed rounding).

    python -m netem.cloudtable [--wan DIR] [--out FILE] [--derived YYYY-MM-DD]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

FORMAT = "gasloc-emu cloud regions"
VERSION = 1
REPO = Path(__file__).resolve().parents[1]
DEFAULT_WAN = REPO.parent / "shared" / "data" / "wan"      # ../shared/data/wan of the repo
DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "cloud_regions.json"

THROUGHPUT, LATENCY, INTERCLOUD = ("skyplane-throughput.csv", "skyplane-latency.csv",
                                   "intercloud-throughput.csv")
SOURCES = (
    {"file": THROUGHPUT, "column": "throughput_received_bps", "units": "bits/s",
     "what": "iperf3 goodput, 64 parallel TCP connections, 5 s, large VMs: the path's capacity",
     "repository": "skyplane-project/skyplane", "path": "skyplane/data/throughput.csv",
     "commit": "3efc9769", "licence": "Apache-2.0"},
    {"file": LATENCY, "column": "avg_rtt_ms", "units": "ms (round trip)",
     "what": "ping RTT between regions",
     "repository": "skyplane-project/skyplane", "path": "profiles/latency.csv",
     "commit": "945dca27", "licence": "Apache-2.0"},
    {"file": INTERCLOUD, "column": "bitrate_Bps, avgrtt", "units": "bytes/s; ms (round trip)",
     "what": "one TCP stream between small VMs (t3.nano / e2-small), February 2022",
     "repository": "doitintl/intercloud-throughput", "path": "results_202202/results.csv",
     "commit": "4046e3d6", "licence": "Apache-2.0"},
)
RTT_SOURCES = ("skyplane", "skyplane-reverse", "intercloud", "intercloud-reverse")
COLUMNS = ("src", "dst", "capacity_mbit", "capacity_rows", "single_stream_mbit",
           "single_stream_rows", "rtt_ms", "rtt_rows", "rtt_source")
RULES = {
    "capacity_mbit": "median of skyplane throughput_received_bps over a pair's rows, / 1e6, "
                     "rounded to 1 Mbit/s",
    "single_stream_mbit": "median of intercloud bitrate_Bps * 8 over a pair's rows, / 1e6, "
                          "rounded to 0.1 Mbit/s",
    "rtt_ms": "lower median of skyplane avg_rtt_ms over a pair's rows (delay only grows by "
              "disturbance); missing: skyplane b->a, then intercloud avgrtt a->b, then b->a "
              "(rtt_source); rounded to 0.01 ms",
    "regions": "cloud:region; gcp zones (skyplane) name their region (gcp_zones)",
    "same_region_fill": "for a same-region pair without a row of its own: the median capacity "
                        "and lower-median RTT over every same-region row",
}


class TableError(ValueError):
    """A measurement file is missing or not in the expected shape."""


@dataclass(frozen=True)
class _Rows:
    capacity: dict[tuple[str, str], list[float]]       # Mbit/s
    rtt: dict[tuple[str, str], list[float]]            # ms
    single: dict[tuple[str, str], list[float]]         # Mbit/s
    single_rtt: dict[tuple[str, str], list[float]]     # ms
    zones: dict[str, str]


def _zone_free(name: str, zones: dict[str, str]) -> str:
    cloud, _, region = name.partition(":")
    if not region:
        raise TableError(f"region {name!r} is not cloud:region")
    if cloud == "gcp":
        m = re.fullmatch(r"(.+-\w+\d)-([a-z])", region)
        if m:
            key = f"gcp:{m.group(1)}"
            if zones.setdefault(key, region) != region:
                raise TableError(f"{key} is measured in two zones, {zones[key]} and {region}")
            return key
    return f"{cloud}:{region}"


def _read(path: Path, needed: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise TableError(f"measurement file {str(path)!r} does not exist")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in needed if rows and c not in rows[0]]
    if not rows or missing:
        raise TableError(f"{path.name}: expected columns {', '.join(needed)}; "
                         f"missing {', '.join(missing) or 'all rows'}")
    return rows


def _rows(wan: Path) -> _Rows:
    zones: dict[str, str] = {}
    capacity: dict = {}
    rtt: dict = {}
    single: dict = {}
    single_rtt: dict = {}
    for r in _read(wan / THROUGHPUT, ("src_region", "dst_region", "throughput_received_bps")):
        key = (_zone_free(r["src_region"], zones), _zone_free(r["dst_region"], zones))
        capacity.setdefault(key, []).append(float(r["throughput_received_bps"]) / 1e6)
    for r in _read(wan / LATENCY, ("src_region", "dst_region", "avg_rtt_ms")):
        key = (_zone_free(r["src_region"], zones), _zone_free(r["dst_region"], zones))
        rtt.setdefault(key, []).append(float(r["avg_rtt_ms"]))
    cols = ("from_cloud", "from_region", "to_cloud", "to_region", "bitrate_Bps", "avgrtt")
    for r in _read(wan / INTERCLOUD, cols):
        key = (f"{r['from_cloud'].lower()}:{r['from_region']}",
               f"{r['to_cloud'].lower()}:{r['to_region']}")
        single.setdefault(key, []).append(float(r["bitrate_Bps"]) * 8 / 1e6)
        single_rtt.setdefault(key, []).append(float(r["avgrtt"]))
    return _Rows(capacity, rtt, single, single_rtt, zones)


def _pair_rtt(rows: _Rows, a: str, b: str) -> tuple[float | None, int, str | None]:
    for values, key, source in ((rows.rtt, (a, b), "skyplane"),
                                (rows.rtt, (b, a), "skyplane-reverse"),
                                (rows.single_rtt, (a, b), "intercloud"),
                                (rows.single_rtt, (b, a), "intercloud-reverse")):
        if key in values:
            return round(statistics.median_low(values[key]), 2), len(values[key]), source
    return None, 0, None


def _median(values: list[float] | None, digits: int) -> float | None:
    if not values:
        return None
    m = round(statistics.median(values), digits)
    return int(m) if digits == 0 else m


def build_table(wan: Path, derived: str) -> dict:
    """The table as a JSON-able dict (``render`` writes it)."""
    datetime.date.fromisoformat(derived)       # a date, or ValueError naming it
    rows = _rows(wan)
    keys = set(rows.capacity) | set(rows.single)     # a pair without a rate is no link
    regions = sorted({r for key in keys for r in key})
    index = {r: i for i, r in enumerate(regions)}
    pairs = []
    for a, b in sorted(keys):
        rtt, rtt_rows, source = _pair_rtt(rows, a, b)
        cap, single = rows.capacity.get((a, b)), rows.single.get((a, b))
        pairs.append([index[a], index[b], _median(cap, 0), len(cap or ()), _median(single, 1),
                      len(single or ()), rtt, rtt_rows, source])
    same_cap = [v for (a, b), vs in sorted(rows.capacity.items()) if a == b for v in vs]
    same_rtt = [v for (a, b), vs in sorted(rows.rtt.items()) if a == b for v in vs]
    fill = {"capacity_mbit": _median(same_cap, 0), "capacity_rows": len(same_cap),
            "rtt_ms": round(statistics.median_low(same_rtt), 2) if same_rtt else None,
            "rtt_rows": len(same_rtt)}
    sources = [dict(s, rows=_count_rows(wan / s["file"]), sha256=_sha256(wan / s["file"]))
               for s in SOURCES]
    return {"format": FORMAT, "version": VERSION, "derived": derived, "sources": sources,
            "rules": RULES, "gcp_zones": dict(sorted(rows.zones.items())),
            "same_region_fill": fill, "regions": regions, "columns": list(COLUMNS),
            "pairs": pairs}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _count_rows(path: Path) -> int:
    with path.open(newline="") as f:
        return sum(1 for _ in csv.DictReader(f))


def render(table: dict) -> str:
    """The file's text: the header as indented JSON, one pair per line (small diffs)."""
    head = {k: v for k, v in table.items() if k != "pairs"}
    text = json.dumps(head, indent=1, sort_keys=False, ensure_ascii=True)
    lines = ",\n".join("  " + json.dumps(p, separators=(",", ":")) for p in table["pairs"])
    return text[:-2] + ',\n "pairs": [\n' + lines + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m netem.cloudtable", description=__doc__
                                 .split("\n\n")[0])
    ap.add_argument("--wan", type=Path, default=DEFAULT_WAN,
                    help=f"folder of the three CSVs (default {DEFAULT_WAN})")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    ap.add_argument("--derived", default=datetime.date.today().isoformat(),
                    help="date of derivation written into the file (default today)")
    args = ap.parse_args(argv)
    try:
        text = render(build_table(args.wan, args.derived))
    except (TableError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    table = json.loads(text)
    print(f"{args.out}: {len(table['regions'])} regions, {len(table['pairs'])} directed pairs, "
          f"{len(text)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
