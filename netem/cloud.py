"""The ``cloud`` bandwidth profile: workers placed in cloud regions, links as measured between
them (``netem/data/cloud_regions.json``, derived by ``netem.cloudtable`` from public Skyplane
and intercloud measurements; the file names sources, commits, licences and units).

- ``net.placement``: one region per worker, ``aws:us-east-1,gcp:asia-east1,...``, a region
  with a count (``aws:us-east-1*3`` or ``aws:us-east-1×3``), or a preset (``PRESETS``).
- ``net.cloud_rate``: ``capacity`` (64 TCP streams: what the path carries) or
  ``single-stream`` (what one TCP connection between small VMs got over it).
- Latency is RTT / 2 each way; rate and RTT are the measured a -> b values, so a link and its
  reverse differ where the data do.
- Two workers in one region: the table's same-region row of that region if it has one, else
  its ``same_region_fill`` (median over every same-region row); a single stream there takes
  the capacity value (the intercloud set has no same-region rows). The note says which.
- A pair the data lack: an error naming it and the nearest measured pairs, unless
  ``net.cloud_missing`` opts into ``reverse`` (the b -> a measurement) or ``nearest`` (the
  measured pair whose far end is the fewest ms of RTT away); every fill is in the note.
"""
from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass
from pathlib import Path

DATA_PATH = Path(__file__).resolve().parent / "data" / "cloud_regions.json"
FORMAT = "gasloc-emu cloud regions"
VERSIONS = (1,)
RATES = ("capacity", "single-stream")
MISSING = ("error", "reverse", "nearest")
COUNT_SIGNS = ("×", "*")
# presets whose every directed pair has capacity, single-stream goodput and an RTT
PRESETS: dict[str, tuple[str, ...]] = {
    "aws8": ("aws:us-west-2", "aws:ca-central-1", "aws:sa-east-1", "aws:eu-west-1",
             "aws:eu-central-1", "aws:eu-north-1", "aws:ap-south-1", "aws:ap-southeast-1"),
    "two-cloud": ("aws:ca-central-1", "aws:sa-east-1", "aws:eu-central-1", "aws:ap-northeast-1",
                  "gcp:northamerica-northeast1", "gcp:europe-north1", "gcp:asia-northeast3",
                  "gcp:australia-southeast1"),
}
_RATE_COLUMN = {"capacity": "capacity_mbit", "single-stream": "single_stream_mbit"}
_RATE_WORDS = {"capacity": "capacity (Skyplane iperf3, 64 TCP streams, median)",
               "single-stream": "single-stream goodput (intercloud, one TCP stream between "
                                "small VMs, median)"}


class CloudError(ValueError):
    """A placement names an unknown region or preset, or a pair the data do not have."""


@dataclass(frozen=True)
class Measured:
    """One directed region pair as the table has it; None where a set has no row."""

    capacity_mbit: float | None
    capacity_rows: int
    single_stream_mbit: float | None
    single_stream_rows: int
    rtt_ms: float | None
    rtt_rows: int
    rtt_source: str | None

    def rate(self, kind: str) -> float | None:
        return getattr(self, _RATE_COLUMN[kind])


@dataclass(frozen=True)
class CloudTable:
    """The shipped table: regions, directed pairs, the same-region fill, and provenance."""

    version: int
    derived: str
    regions: tuple[str, ...]
    pairs: dict[tuple[str, str], Measured]
    same_region_fill: Measured
    sources: tuple[dict, ...]

    @classmethod
    def from_json(cls, text: str, where: str = "cloud table") -> CloudTable:
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("version") not in VERSIONS:
            raise CloudError(f"{where}: format {data.get('format')!r} version "
                             f"{data.get('version')!r} is not readable; expected {FORMAT!r} "
                             f"version {', '.join(map(str, VERSIONS))}")
        columns = data["columns"]
        if columns[:2] != ["src", "dst"] or set(columns[2:]) != set(Measured.__dataclass_fields__):
            raise CloudError(f"{where}: unexpected columns {columns}")
        regions = tuple(data["regions"])
        pairs = {}
        for row in data["pairs"]:
            values = dict(zip(columns, row, strict=True))
            key = (regions[values.pop("src")], regions[values.pop("dst")])
            pairs[key] = Measured(**values)
        fill = data["same_region_fill"]
        same = Measured(fill["capacity_mbit"], fill["capacity_rows"], None, 0, fill["rtt_ms"],
                        fill["rtt_rows"], "skyplane")
        return cls(data["version"], data["derived"], regions, pairs, same,
                   tuple(data["sources"]))

    def rtt_between(self, a: str, b: str) -> float | None:
        """The RTT of a <-> b in either direction's row (0 for one region)."""
        if a == b:
            return 0.0
        for key in ((a, b), (b, a)):
            m = self.pairs.get(key)
            if m is not None and m.rtt_ms is not None:
                return m.rtt_ms
        return None

    def same_region(self, region: str) -> tuple[Measured, str]:
        """The measurement used between two workers of ``region`` and the rule, in words."""
        own = self.pairs.get((region, region))
        if own is not None and own.capacity_mbit is not None and own.rtt_ms is not None:
            return own, f"{region}'s same-region row"
        fill = self.same_region_fill
        return fill, (f"no same-region row for {region}: fill = median of the "
                      f"{fill.capacity_rows} same-region capacity rows, lower median of the "
                      f"{fill.rtt_rows} same-region RTT rows")


@functools.lru_cache(maxsize=4)
def load_table(path: Path = DATA_PATH) -> CloudTable:
    if not path.is_file():
        raise CloudError(f"cloud table {str(path)!r} does not exist (netem/data ships it; "
                         "rebuild with `python -m netem.cloudtable`)")
    return CloudTable.from_json(path.read_text(), where=str(path))


# ---------------------------------------------------------------- placement

def _unknown_region(name: str, table: CloudTable) -> CloudError:
    close = difflib.get_close_matches(name, table.regions, n=3, cutoff=0.6)
    hint = f"; nearest names: {', '.join(close)}" if close else ""
    clouds = sorted({r.split(":")[0] for r in table.regions})
    return CloudError(f"net.placement: region {name!r} is not in the cloud table{hint} "
                      f"(allowed: {len(table.regions)} regions cloud:region of "
                      f"{', '.join(clouds)}, e.g. {table.regions[0]}; or a preset: "
                      f"{', '.join(PRESETS)})")


def _item(item: str, table: CloudTable) -> list[str]:
    region, count = item, 1
    for sign in COUNT_SIGNS:
        if sign in item:
            region, _, text = item.partition(sign)
            region = region.strip()
            try:
                count = int(text.strip())
            except ValueError:
                count = 0
            if count < 1:
                raise CloudError(f"net.placement: {item!r} has count {text.strip()!r}; "
                                 f"expected a whole number >= 1 after {sign!r}")
            break
    if region not in table.regions:
        raise _unknown_region(region, table)
    return [region] * count


def parse_placement(text: str, table: CloudTable | None = None) -> tuple[str, ...]:
    """One region per worker, from a preset name or ``region[*count],...``."""
    table = table or load_table()
    text = text.strip()
    if text in PRESETS:
        return PRESETS[text]
    if not text:
        raise CloudError("net.placement is empty; expected regions like "
                         f"aws:us-east-1,gcp:asia-east1 or a preset: {', '.join(PRESETS)}")
    items = [part.strip() for part in text.split(",")]
    if "" in items:
        raise CloudError(f"net.placement = {text!r} has an empty entry; expected regions "
                         "separated by single commas")
    return tuple(r for item in items for r in _item(item, table))


# ---------------------------------------------------------------- links

@dataclass(frozen=True)
class CloudLink:
    """What one directed worker link gets: rate, RTT, and where they came from."""

    rate_mbit: float
    rtt_ms: float
    how: str        # "" when measured for this pair; else the rule, for the note


def _candidates(table: CloudTable, a: str, b: str, kind: str) -> list[tuple[float, str, str]]:
    """Measured pairs near a -> b: (RTT from the replaced end, src, dst), nearest first."""
    out = []
    for r in table.regions:
        for src, dst, moved in ((a, r, b), (r, b, a)):
            if src == dst or r == moved:
                continue
            m = table.pairs.get((src, dst))
            d = table.rtt_between(moved, r)
            if m is not None and m.rate(kind) is not None and m.rtt_ms is not None and \
                    d is not None:
                out.append((d, src, dst))
    return sorted(set(out))


def pair_link(table: CloudTable, a: str, b: str, kind: str, missing: str) -> CloudLink:
    """The link a -> b between two different regions under ``missing``'s rule."""
    m = table.pairs.get((a, b))
    rate = m.rate(kind) if m else None
    rtt = m.rtt_ms if m else None
    if rate is not None and rtt is not None:
        how = "" if m.rtt_source == "skyplane" else f"RTT from {m.rtt_source}"
        return CloudLink(rate, rtt, how)
    lacking = " and ".join(w for w, v in ((f"{kind} rate", rate), ("RTT", rtt)) if v is None)
    if missing == "reverse":
        back = table.pairs.get((b, a))
        rate2 = rate if rate is not None else (back.rate(kind) if back else None)
        rtt2 = rtt if rtt is not None else (back.rtt_ms if back else None)
        if rate2 is not None and rtt2 is not None:
            return CloudLink(rate2, rtt2, f"{lacking} of {b} -> {a} (reverse)")
    near = _candidates(table, a, b, kind)
    if missing == "nearest" and near:
        d, src, dst = near[0]
        n = table.pairs[(src, dst)]
        return CloudLink(rate if rate is not None else n.rate(kind),
                         rtt if rtt is not None else n.rtt_ms,
                         f"{lacking} of {src} -> {dst} (nearest measured, {d:g} ms RTT away)")
    hint = "; ".join(f"{s} -> {t} ({d:g} ms RTT from {b if s == a else a})"
                     for d, s, t in near[:3]) or "none"
    raise CloudError(f"no {lacking} measured for {a} -> {b}; nearest measured pairs: {hint}; "
                     "place the workers there, or set net.cloud_missing = 'reverse' or "
                     "'nearest' to fill it (recorded in the link plan's note)")


def cloud_links(placement: tuple[str, ...], kind: str, missing: str,
                table: CloudTable | None = None) -> tuple[dict[tuple[int, int], CloudLink], str]:
    """Every directed link of workers placed in ``placement``, and the note that says where
    each number came from."""
    between, note = region_links(placement, kind, missing, table)
    n = len(placement)
    return {(i, j): between[(placement[i], placement[j])]
            for i in range(n) for j in range(n) if i != j}, note


# a rule's links named one by one in the note up to this many; beyond, by their regions
NOTE_LINKS = 64


def region_links(placement: tuple[str, ...], kind: str, missing: str,
                 table: CloudTable | None = None) -> tuple[dict[tuple[str, str], CloudLink], str]:
    """The link between each ordered pair of the placement's regions that two different
    workers are in (a region to itself where it holds two), and the note that says where each
    number came from: what every link of the workers placed in ``placement`` is, held once per
    pair of regions, not once per pair of workers."""
    if kind not in RATES:
        raise CloudError(f"net.cloud_rate = {kind!r} is not allowed; expected one of "
                         f"{', '.join(RATES)}")
    if missing not in MISSING:
        raise CloudError(f"net.cloud_missing = {missing!r} is not allowed; expected one of "
                         f"{', '.join(MISSING)}")
    table = table or load_table()
    members: dict[str, list[int]] = {}
    for w, region in enumerate(placement):
        members.setdefault(region, []).append(w)
    between: dict[tuple[str, str], CloudLink] = {}
    failed: dict[tuple[str, str], CloudError] = {}
    for a in members:
        for b in members:
            if a == b and len(members[a]) < 2:
                continue
            try:
                between[(a, b)] = _region_link(table, a, b, kind, missing)
            except CloudError as exc:
                failed[(a, b)] = exc
    if failed:   # named by the first pair of workers, in worker order, that lacks a link
        i, j = next((i, j) for i in range(len(placement)) for j in range(len(placement))
                    if (placement[i], placement[j]) in failed and i != j)
        raise CloudError(f"workers {i} -> {j}: {failed[(placement[i], placement[j])]}")
    where = ", ".join(f"{i} {r}" for i, r in enumerate(placement))
    parts = [f"regions: {where}", f"rate: {_RATE_WORDS[kind]}",
             "latency: RTT / 2 (Skyplane ping, lower median) + net.latency_ms"]
    parts += _rule_notes(placement, members, between)
    parts.append(f"table: cloud_regions.json v{table.version}, derived {table.derived}")
    return between, "; ".join(parts)


def _region_link(table: CloudTable, a: str, b: str, kind: str, missing: str) -> CloudLink:
    """The link between a worker in region a and one in b (a region to itself: the
    same-region rule)."""
    if a == b:
        m, rule = table.same_region(a)
        return CloudLink(m.capacity_mbit, m.rtt_ms, f"same region: {rule}"
                         + ("; capacity, as the intercloud set has no same-region rows"
                            if kind == "single-stream" else ""))
    return pair_link(table, a, b, kind, missing)


def _rule_notes(placement: tuple[str, ...], members: dict[str, list[int]],
                between: dict[tuple[str, str], CloudLink]) -> list[str]:
    """Each rule that filled a link, with its links (``i->j``, in worker order) or, past
    ``NOTE_LINKS`` of them, the region pairs and the count."""
    counts: dict[str, int] = {}
    pairs_of: dict[str, list[tuple[str, str]]] = {}
    for (a, b), link in between.items():
        if link.how:
            counts[link.how] = counts.get(link.how, 0) + len(members[a]) * len(members[b]) \
                - (len(members[a]) if a == b else 0)
            pairs_of.setdefault(link.how, []).append((a, b))
    listed = {how for how, count in counts.items() if count <= NOTE_LINKS}
    keys = {how: [f"{i}->{j}" for i, j in sorted(
        (i, j) for a, b in pairs_of[how] for i in members[a] for j in members[b] if i != j)]
        for how in listed}
    order = sorted(counts, key=lambda how: min(
        (members[a][0], members[b][0] if a != b else members[b][1]) for a, b in pairs_of[how]))
    return [f"{how} (links {' '.join(keys[how])})" if how in listed else
            f"{how} ({counts[how]} links, between "
            f"{', '.join(f'{a} -> {b}' for a, b in pairs_of[how])})" for how in order]
