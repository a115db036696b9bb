"""Bandwidth profiles -> a link plan: rate, latency, jitter and loss of every directed link.

A ``LinkPlan`` is the single description of the emulated network. The tc commands, the userspace
shaper and the in-process simulator's virtual clock are all derived from it, so the three agree.

Named profiles (``net.bw_profile``), N workers, seeded by the run's seed:

- ``uniform``       every link at ``net.rate_mbit``.
- ``skewed``        slow *links* among fast ones: ceil(10 %) of the N(N-1)/2 worker pairs, drawn
                    with the seed, run at ``net.slow_rate_mbit`` in both directions (8 workers:
                    3 of 28 pairs, a row of docs/ALGORITHM.md's max-plus table; 2 or 3 workers:
                    one pair).
- ``skewed-worker`` one slow *worker*: every link to and from one seeded worker runs at
                    ``net.slow_rate_mbit``; a slow worker sets everyone's pace when every round
                    waits for every partner, which ``skewed`` alone would never show.
- ``two-cluster``   workers [0, ceil(N/2)) and [ceil(N/2), N) are two clusters: fast inside,
                    ``net.slow_rate_mbit`` between.
- ``lognormal``     each worker draws a rate from a seeded lognormal whose median is
                    ``net.rate_mbit`` (sigma 0.5: the 10-90 % range is 0.53x to 1.9x); a link
                    runs at the slower of its two endpoints.
- ``cloud``         workers placed in cloud regions (``net.placement``), every directed link at
                    the measured rate (``net.cloud_rate``: capacity or single-stream) and half
                    the measured RTT, from ``netem/data/cloud_regions.json`` (``netem.cloud``);
                    ``net.rate_mbit`` is not used, ``net.latency_ms`` adds to the RTT / 2.
- a ``.toml`` or ``.json`` file::

      [default]                 # optional; missing keys fall back to net.*
      rate_mbit = 50
      latency_ms = 0
      [[link]]                  # optional overrides of single directed links
      src = 0
      dst = 3
      rate_mbit = 5
      latency_ms = 10           # optional; also jitter_ms, loss_pct
      symmetric = true          # optional: the same values for dst -> src
      [[worker]]                # optional per-worker caps (a slow worker, a shared uplink)
      id = 2
      up_mbit = 20
      down_mbit = 20

A file with ``[[site]]`` tables is a *site* profile, as ``gasloc-emu netem measure`` writes it
(JSON): per directed pair of hosts a ``[[site_link]]`` with ``rate_mbit``, ``latency_ms`` and
``loss_pct``; ``placement`` (``cycle``, ``blocks`` or a list) puts each worker on a site, and
``[same_site]`` is the explicit rule for two workers on one site (see "site profiles" below and
docs/NETWORK.md).

An empty ``bw_profile`` means "no shaping": ``build_link_plan`` returns a plan with
``shaped = False`` and no links (its link model is instantaneous); asking for latency, jitter or
loss without a profile is an error, because there would be no links to put them on.

Every link gets ``net.latency_ms``, ``net.jitter_ms`` and ``net.loss_pct`` unless a file says
otherwise. Everything is validated here, before any namespace or qdisc exists.
"""
from __future__ import annotations

import json
import math
import operator
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from netem import cloud
from netem import measureplan as measured
from netem.impair import JITTER_DISTS  # netem's names, kept once, by the code that draws them
from netem.tcpsettings import TcpSettings, TcpSettingsError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

# the named profiles that give each worker pair one rate, both directions, from net.* and the seed
PAIR_PROFILES = ("uniform", "skewed", "skewed-worker", "two-cluster", "lognormal")
NAMED = (*PAIR_PROFILES, "cloud")
SKEWED_FRACTION = 0.10      # share of worker pairs that are slow in ``skewed``
NOTE_PAIRS = 64             # ``skewed``'s note names this many slow pairs, then counts the rest
LOGNORMAL_SIGMA = 0.5       # spread of per-worker rates in ``lognormal``
RATE_RANGE_MBIT = (0.001, 100_000.0)   # the same bounds as net.rate_mbit
LATENCY_RANGE_MS = (0.0, 10_000.0)
LOSS_RANGE_PCT = (0.0, 100.0)        # loss_pct < 100: a link that drops everything is a cut
QUEUE_RANGE_PKTS = (1, 1_000_000)
DEFAULT_QUEUE_PKTS = 1000            # the HTB leaves' pfifo limit (netem/commands.py)

LinkModel = Callable[[int, int, int], "tuple[float, float]"]


class ProfileError(ValueError):
    """A bandwidth profile is unknown, malformed, or names a value out of range."""


# ---------------------------------------------------------------- value checks

def _check_range(what: str, value: Any, lo: float, hi: float, *, open_lo: bool = False) -> float:
    """``value`` as a float inside [lo, hi] (or (lo, hi]), else a ProfileError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{what} = {value!r} is not a number")
    v = float(value)
    below = v <= lo if open_lo else v < lo
    if not math.isfinite(v) or below or v > hi:
        bracket = "(" if open_lo else "["
        raise ProfileError(f"{what} = {value!r} is out of range; expected a value in "
                           f"{bracket}{lo:g}, {hi:g}]")
    return v


def _check_loss(what: str, value: Any) -> float:
    """A loss share in [0, 100): a link that loses every packet is a cut, not a loss."""
    v = _check_range(what, value, *LOSS_RANGE_PCT)
    if v >= LOSS_RANGE_PCT[1]:
        raise ProfileError(f"{what} = {value!r} is out of range; expected a value in "
                           f"[0, {LOSS_RANGE_PCT[1]:g}) (100 % loss is a cut: use a partition)")
    return v


def _check_rate(what: str, value: Any) -> float:
    return _check_range(what, value, 0.0, RATE_RANGE_MBIT[1], open_lo=True)


def _check_worker(what: str, value: Any, workers: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{what} = {value!r} is not a worker id (an integer)")
    if not 0 <= value < workers:
        raise ProfileError(f"{what} = {value} is out of range; "
                           f"this run has workers 0..{workers - 1}")
    return value


# ---------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Link:
    """One directed link src -> dst. ``rate_mbit`` is goodput: what an application moves per
    second. The rest impairs its packets, before TCP sees them (netem or the packet line):

    - ``latency_ms`` one-way delay; ``jitter_ms`` its spread, drawn from ``jitter_dist``;
      packets keep their order unless ``reorder_pct`` > 0, so jitter larger than the delay is
      refused without it (netem would reorder; a FIFO line would just clip the draws);
    - ``loss_pct`` independent random loss; ``ge_p_pct`` / ``ge_r_pct`` a Gilbert-Elliott
      channel of bursty loss (good -> bad and bad -> good per packet, ``ge_bad_loss_pct`` lost
      in the bad state; netem's ``loss gemodel p r 1-h``);
    - ``queue_pkts`` the bottleneck queue (the sender's shaping leaf, tail drop);
    - ``tcp`` the sender's TCP on this link (``netem.tcpsettings``).
    """

    src: int
    dst: int
    rate_mbit: float
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    jitter_dist: str = "normal"
    reorder_pct: float = 0.0
    ge_p_pct: float = 0.0
    ge_r_pct: float = 0.0
    ge_bad_loss_pct: float = 100.0
    queue_pkts: int = DEFAULT_QUEUE_PKTS
    tcp: TcpSettings = TcpSettings()

    def __post_init__(self) -> None:
        name = f"link {self.src}->{self.dst}"
        if self.src == self.dst:
            raise ProfileError(f"{name}: src and dst are the same worker")
        _check_rate(f"{name} rate_mbit", self.rate_mbit)
        _check_range(f"{name} latency_ms", self.latency_ms, *LATENCY_RANGE_MS)
        _check_range(f"{name} jitter_ms", self.jitter_ms, *LATENCY_RANGE_MS)
        _check_loss(f"{name} loss_pct", self.loss_pct)
        self._check_impairments(name)

    def _check_impairments(self, name: str) -> None:
        if self.jitter_dist not in JITTER_DISTS:
            raise ProfileError(f"{name} jitter_dist = {self.jitter_dist!r} is not allowed; "
                               f"expected one of {', '.join(JITTER_DISTS)}")
        _check_range(f"{name} reorder_pct", self.reorder_pct, 0.0, 100.0)
        if self.jitter_ms > self.latency_ms and not self.reorder_pct:
            raise ProfileError(
                f"{name} jitter_ms = {self.jitter_ms:g} is out of range; expected a value in "
                f"[0, {self.latency_ms:g}] (the link's latency_ms) while packets keep their "
                "order: set reorder_pct > 0 to allow reordering, or a latency at least the "
                "jitter")
        _check_loss(f"{name} ge_p_pct", self.ge_p_pct)
        _check_range(f"{name} ge_r_pct", self.ge_r_pct, 0.0, 100.0)
        _check_range(f"{name} ge_bad_loss_pct", self.ge_bad_loss_pct, 0.0, 100.0)
        if self.ge_p_pct and not self.ge_r_pct:
            raise ProfileError(f"{name} ge_r_pct = 0 is out of range with ge_p_pct = "
                               f"{self.ge_p_pct:g}; expected a value in (0, 100] (a bad state "
                               "that is never left is a cut link)")
        q = self.queue_pkts
        if isinstance(q, bool) or not isinstance(q, int) or \
                not QUEUE_RANGE_PKTS[0] <= q <= QUEUE_RANGE_PKTS[1]:
            raise ProfileError(f"{name} queue_pkts = {q!r} is out of range; expected an "
                               f"integer in [{QUEUE_RANGE_PKTS[0]}, {QUEUE_RANGE_PKTS[1]}]")

    @property
    def impaired(self) -> bool:
        """Whether anything beyond the rate acts on this link's packets."""
        return bool(self.latency_ms or self.jitter_ms or self.loss_pct or self.reorder_pct
                    or self.ge_p_pct)

    @property
    def lossy(self) -> bool:
        return bool(self.loss_pct or self.ge_p_pct)

    def mean_loss_pct(self) -> float:
        """The long-run share of packets lost: random loss and the Gilbert-Elliott channel's
        stationary loss, p / (p + r) of packets in the bad state times its loss (RFC 6534 sec.
        on the simple Gilbert model; independent of each other)."""
        ge = 0.0
        if self.ge_p_pct:
            p, r = self.ge_p_pct / 100, self.ge_r_pct / 100
            ge = p / (p + r) * self.ge_bad_loss_pct / 100
        random_loss = self.loss_pct / 100
        return 100 * (1 - (1 - random_loss) * (1 - ge))


@dataclass(frozen=True)
class WorkerCaps:
    """Per-worker limits shared by all of its links: a slow uplink or downlink. None = no cap."""

    up_mbit: float | None = None
    down_mbit: float | None = None

    def __post_init__(self) -> None:
        for name in ("up_mbit", "down_mbit"):
            value = getattr(self, name)
            if value is not None:
                _check_rate(name, value)


NO_CAPS = WorkerCaps()   # a worker without caps (frozen: one value for all of them)


def pairs_at(workers: int, index) -> list[tuple[int, int]]:
    """The pairs (i, j), i < j, at ``index`` (an int array) of the list of all pairs of
    ``workers`` workers in lexicographic order, without the list: row i starts at
    i (2n - i - 1) / 2, so i is the floor of the smaller root of i^2 - (2n - 1) i + 2k
    (corrected where the float root is one off)."""
    import numpy as np
    k = np.asarray(index, dtype=np.int64)
    m = 2 * workers - 1
    i = np.floor((m - np.sqrt(float(m) * m - 8.0 * k)) / 2).astype(np.int64)
    i = np.clip(i, 0, max(workers - 2, 0))

    def start(r):
        return r * (2 * workers - r - 1) // 2
    i -= (start(i) > k)
    i += (start(i + 1) <= k) & (i < workers - 2)
    j = i + 1 + k - start(i)
    return list(zip(i.tolist(), j.tolist(), strict=True))


class BlockLinks(Mapping):
    """Every directed link of a profile whose links follow a rule, each built when first asked
    for: worker i is in group ``group[i]``, link i -> j has the values of its groups' block
    (``block[(group[i], group[j])]``: the ``Link`` fields but src and dst) unless
    ``exceptions`` names the pair (an index into ``kinds``, the values of the pairs a profile
    singles out, such as ``skewed``'s slow pairs). Each link is the ``Link`` a dict of all
    N(N-1) would hold, value for value, but what is held is O(N + blocks + exceptions): the
    links of 4096 workers are 16.7 M, those a run uses a few per worker.

    Questions about every link are answered from the rule: ``representatives`` (one pair per
    kind of link and its reverse), ``slowest_rate_mbit`` (of one sender) and ``rate_matrix``."""

    def __init__(self, workers: int, group, block: dict, kinds=(), exceptions=None):
        self.workers = workers
        self.group = tuple(group)
        self.block = dict(block)
        self.kinds = tuple(kinds)
        self.exceptions = dict(exceptions or {})
        if len(self.group) != workers:
            raise ProfileError(f"a block rule gives {len(self.group)} groups for {workers} "
                               "workers; expected one per worker")
        sizes: dict[int, int] = {}
        for g in self.group:
            sizes[g] = sizes.get(g, 0) + 1
        self._sizes = sizes
        # the groups' blocks that hold a link (a group of one has none to itself)
        lacking = sorted({(a, b) for a in sizes for b in sizes if a != b or sizes[a] > 1}
                         - set(self.block))
        if lacking:
            raise ProfileError(f"a block rule has no values for groups {lacking[0]}")
        self._cache: dict[tuple[int, int], Link] = {}
        self._slowest: list[float] | None = None
        self._arrays = None
        self._representatives: tuple[tuple[int, int], ...] | None = None

    def fields(self, src: int, dst: int) -> dict:
        """The ``Link`` fields of src -> dst but src and dst."""
        kind = self.exceptions.get((src, dst))
        if kind is not None:
            return self.kinds[kind]
        return self.block[(self.group[src], self.group[dst])]

    def __contains__(self, key) -> bool:
        return self._pair(key) is not None

    def _pair(self, key) -> tuple[int, int] | None:
        """``key`` as a pair of distinct workers (any integers, as a dict's keys would match
        them), or None."""
        try:
            src, dst = (operator.index(x) for x in key)
        except (TypeError, ValueError):
            return None
        ok = src != dst and 0 <= src < self.workers and 0 <= dst < self.workers
        return (src, dst) if ok else None

    def __getitem__(self, key) -> Link:
        link = self._cache.get(key)
        if link is None:
            pair = self._pair(key)
            if pair is None:
                raise KeyError(key)
            link = self._cache[key] = Link(pair[0], pair[1], **self.fields(*pair))
        return link

    def __iter__(self):
        n = self.workers
        return ((i, j) for i in range(n) for j in range(n) if i != j)

    def __len__(self) -> int:
        return self.workers * (self.workers - 1)

    def __eq__(self, other) -> bool:
        if isinstance(other, BlockLinks) and (self.workers, self.group, self.block, self.kinds,
                                              self.exceptions) == \
                (other.workers, other.group, other.block, other.kinds, other.exceptions):
            return True
        return Mapping.__eq__(self, other)

    __hash__ = None

    def __getstate__(self) -> dict:
        # a plan's copy (handed to a worker) rebuilds what it asks for
        return self.__dict__ | {"_cache": {}, "_slowest": None, "_representatives": None,
                                "_arrays": None}

    def representatives(self) -> list[tuple[int, int]]:
        """Directed pairs such that every link and its reverse have the values of one of them
        and its reverse: each exception and its reverse, and per block a pair that neither
        way is an exception (none where every pair of the block is one, either way)."""
        if self._representatives is None:
            self._representatives = self._find_representatives()
        return list(self._representatives)

    def _find_representatives(self) -> tuple[tuple[int, int], ...]:
        exc, group = self.exceptions, self.group
        seen, out = set(), []

        def add(src: int, dst: int) -> None:
            key = (exc.get((src, dst), -1), exc.get((dst, src), -1), group[src], group[dst])
            if key not in seen:
                seen.add(key)
                out.append((src, dst))
        for src, dst in self._first_of_each_kind():   # one exception per kind, both ways
            add(src, dst)
            add(dst, src)
        members: dict[int, list[int]] = {}
        for w, g in enumerate(self.group):
            members.setdefault(g, []).append(w)
        for ga, gb in sorted(self.block):
            found = next(((a, b) for a in members.get(ga, ()) for b in members.get(gb, ())
                          if a != b and (a, b) not in self.exceptions
                          and (b, a) not in self.exceptions), None)
            if found is not None:
                add(*found)
        return tuple(out)

    def _first_of_each_kind(self) -> list[tuple[int, int]]:
        """The first exception (in ``exceptions``' order) of each (its kind, its reverse's
        kind or -1, its groups), in that order: what walking the exceptions and keeping each
        key's first pair gives, with arrays (1.7 M exceptions at 4096 workers)."""
        import numpy as np
        if not self.exceptions:
            return []
        n = self.workers
        srcs, dsts, kinds = self._exception_arrays()
        codes, reverse_codes = srcs * n + dsts, dsts * n + srcs
        order = np.argsort(codes, kind="stable")
        at = order[np.minimum(np.searchsorted(codes[order], reverse_codes), len(codes) - 1)]
        back = np.where(codes[at] == reverse_codes, kinds[at], -1)   # the reverse's kind
        labels, g = np.unique(np.array(self.group, dtype=np.int64), return_inverse=True)
        groups = len(labels)
        key = ((kinds * (len(self.kinds) + 1) + back + 1) * groups + g[srcs]) * groups + g[dsts]
        _, first = np.unique(key, return_index=True)
        first.sort()    # first met first, as a dict keeps them
        return list(zip(srcs[first].tolist(), dsts[first].tolist(), strict=True))

    def slowest_rate_mbit(self, src: int) -> float:
        """The slowest rate_mbit of src's links: its exceptions' and each block it has a link
        in that is not all exceptions (found for every sender at once, when first asked)."""
        if self._slowest is None:
            self._slowest = self._slowest_of_all()
        return self._slowest[src]

    def _exception_arrays(self):
        """(src, dst, kind) of every exception as int arrays (made once)."""
        if self._arrays is None:
            self._arrays = self._make_exception_arrays()
        return self._arrays

    def _make_exception_arrays(self):
        import numpy as np
        count = len(self.exceptions)
        pairs = np.fromiter((x for key in self.exceptions for x in key), dtype=np.intp,
                            count=2 * count).reshape(count, 2)
        kinds = np.fromiter(self.exceptions.values(), dtype=np.intp, count=count)
        return pairs[:, 0], pairs[:, 1], kinds

    def _slowest_of_all(self) -> list[float]:
        import numpy as np
        n = self.workers
        groups = sorted(self._sizes)
        gindex = {g: k for k, g in enumerate(groups)}
        g = np.array([gindex[x] for x in self.group], dtype=np.intp)
        sizes = np.array([self._sizes[x] for x in groups], dtype=np.int64)
        # links from each worker into each group: the group's size, less itself
        links_into = np.broadcast_to(sizes, (n, len(groups))).copy()
        links_into[np.arange(n), g] -= 1
        slowest = np.full(n, np.inf)
        if self.exceptions:
            srcs, dsts, kinds = self._exception_arrays()
            kind_rates = np.array([float(k["rate_mbit"]) for k in self.kinds])
            np.minimum.at(slowest, srcs, kind_rates[kinds])
            np.subtract.at(links_into, (srcs, g[dsts]), 1)
        block = np.array([[float(self.block[(a, b)]["rate_mbit"]) if (a, b) in self.block
                           else np.inf for b in groups] for a in groups])
        from_block = np.where(links_into > 0, block[g], np.inf).min(axis=1)
        return np.minimum(slowest, from_block).tolist()

    def rate_matrix(self):
        """rates[i, j]: rate_mbit of i -> j as a float64 array, 0 on the diagonal."""
        import numpy as np
        groups = sorted(set(self.group))
        index = {g: k for k, g in enumerate(groups)}
        table = np.array([[float(self.block[(a, b)]["rate_mbit"]) if (a, b) in self.block
                           else 0.0 for b in groups] for a in groups], dtype=np.float64)
        g = np.array([index[x] for x in self.group], dtype=np.intp)
        out = table[g[:, None], g[None, :]]
        if self.exceptions:
            srcs, dsts, kinds = self._exception_arrays()
            kind_rates = np.array([float(k["rate_mbit"]) for k in self.kinds])
            out[srcs, dsts] = kind_rates[kinds]
        np.fill_diagonal(out, 0.0)
        return out


class PlainLinkModel:
    """bytes / rate + latency per directed link (``LinkPlan.link_model``); unshaped, every
    message is free. Each link's (rate in bit/s, latency in s) is taken from the plan when
    first timed and kept: a run times a few links per worker, not all N(N-1). A value, not a
    closure, so a run plan holding it pickles."""

    def __init__(self, plan: LinkPlan):
        self.plan = plan
        self._paths: dict[tuple[int, int], tuple[float, float]] = {}

    def path(self, src: int, dst: int) -> tuple[float, float]:
        """(rate in bit/s, one-way latency in s) of src -> dst."""
        key = (src, dst)
        path = self._paths.get(key)
        if path is None:
            path = self._paths[key] = (self.plan.effective_rate_mbit(src, dst) * 1e6,
                                       self.plan.links[key].latency_ms / 1e3)
        return path

    def __call__(self, src: int, dst: int, nbytes: int) -> tuple[float, float]:
        if not self.plan.shaped:
            return 0.0, 0.0
        rate_bps, latency_s = self.path(src, dst)
        return nbytes * 8 / rate_bps, latency_s

    def __getstate__(self) -> dict:
        return {"plan": self.plan, "_paths": {}}


@dataclass(frozen=True)
class LinkPlan:
    """Every directed link of a run (all N(N-1) when shaped) and the per-worker caps."""

    workers: int
    links: dict[tuple[int, int], Link]
    caps: dict[int, WorkerCaps]
    profile: str
    shaped: bool = True
    note: str = ""          # what the profile chose, e.g. which pairs are slow
    mtu: int = 1500         # of the emulated links (net.mtu)

    def __post_init__(self) -> None:
        if self.shaped and isinstance(self.links, BlockLinks):
            if self.links.workers != self.workers or self.caps:
                raise ProfileError(f"profile {self.profile!r}: a rule's links are for "
                                   f"{self.links.workers} workers, the plan's {self.workers}; "
                                   "caps are given per link (a dict of links)")
        elif self.shaped:
            missing = [(i, j) for i in range(self.workers) for j in range(self.workers)
                       if i != j and (i, j) not in self.links]
            if missing:
                raise ProfileError(f"profile {self.profile!r} leaves links without a rate: "
                                   f"{missing[:4]}")

    def cap(self, rank: int) -> WorkerCaps:
        return self.caps.get(rank, NO_CAPS)

    def effective_rate_mbit(self, src: int, dst: int) -> float:
        """The most one flow src -> dst can get: min(link, src's uplink cap, dst's downlink cap)."""
        rates = [self.links[(src, dst)].rate_mbit, self.cap(src).up_mbit, self.cap(dst).down_mbit]
        return min(r for r in rates if r is not None)

    def link_classes(self) -> list[tuple[int, int]]:
        """Directed pairs such that every link and its reverse have the values of one of them
        and its reverse (all of them for a dict of links; ``BlockLinks.representatives``):
        enough to answer a question about every link, such as the largest latency."""
        rule = getattr(self.links, "representatives", None)
        return rule() if rule is not None else list(self.links)

    def slowest_rate_mbit(self, src: int) -> float:
        """The slowest ``effective_rate_mbit`` of src's links."""
        if isinstance(self.links, BlockLinks):   # no caps (checked at construction)
            return self.links.slowest_rate_mbit(src)
        return min(self.effective_rate_mbit(src, j) for j in range(self.workers) if j != src)

    def rate_matrix(self):
        """rates[i, j]: ``effective_rate_mbit(i, j)`` as an N x N float64 array, 0 on the
        diagonal (the matrix the graph that picks the fastest links chooses from)."""
        if isinstance(self.links, BlockLinks):
            return self.links.rate_matrix()
        import numpy as np
        n = self.workers
        return np.array([[0.0 if i == j else float(self.effective_rate_mbit(i, j))
                          for j in range(n)] for i in range(n)], dtype=np.float64)

    def has_caps(self, kind: str) -> bool:
        """Whether any worker has an ``up`` or ``down`` cap."""
        return any(getattr(c, f"{kind}_mbit") is not None for c in self.caps.values())

    @property
    def impaired(self) -> bool:
        """Whether any link has more than a rate (delay, jitter, loss, reordering)."""
        return any(self.links[key].impaired for key in self.link_classes())

    def max_of(self, attr: str) -> float:
        """The largest latency_ms / jitter_ms / loss_pct over all links (0 when unshaped)."""
        return max((getattr(self.links[key], attr) for key in self.link_classes()),
                   default=0.0)

    def link_model(self) -> LinkModel:
        """(src, dst, nbytes) -> (wire seconds, latency seconds) for the simulator's virtual clock.

        The wire time uses ``effective_rate_mbit``: a cap is treated as if this flow had it to
        itself. That is exact for one flow at a time per worker and optimistic when a worker
        sends to (or receives from) several peers at once through a shared cap. Jitter and loss
        are not modelled (their means would only add noise to a prediction).
        """
        return PlainLinkModel(self)

    def table(self, pairs=None) -> list[dict]:
        """One row per directed link (of ``pairs`` only, when given), in (src, dst) order, for
        display and the run record."""
        keys = sorted(self.links) if pairs is None else sorted(set(pairs))
        return [{"src": s, "dst": d, "rate_mbit": link.rate_mbit,
                 "effective_mbit": self.effective_rate_mbit(s, d), "latency_ms": link.latency_ms,
                 "jitter_ms": link.jitter_ms, "loss_pct": link.loss_pct,
                 **_extra_columns(link)}
                for (s, d), link in ((key, self.links[key]) for key in keys)]

    def describe(self, pairs=None) -> dict:
        """A JSON-able summary: profile, links (those of ``pairs`` only, when given; ``count``
        is all of them), caps."""
        caps = {str(k): {"up_mbit": c.up_mbit, "down_mbit": c.down_mbit}
                for k, c in sorted(self.caps.items())}
        return {"profile": self.profile, "workers": self.workers, "shaped": self.shaped,
                "note": self.note, "mtu": self.mtu, "links": self.table(pairs),
                "count": len(self.links), "caps": caps}


def _extra_columns(link: Link) -> dict:
    """A link's impairments and TCP beyond rate, latency, jitter and loss, where they are not
    the defaults (so the rows of a plain profile stay as they were)."""
    out = {}
    defaults = Link(0, 1, 1.0)
    for name in ("jitter_dist", "reorder_pct", "ge_p_pct", "ge_r_pct", "ge_bad_loss_pct",
                 "queue_pkts"):
        if getattr(link, name) != getattr(defaults, name):
            out[name] = getattr(link, name)
    if not link.tcp.is_default:
        out["tcp"] = {k: v for k, v in link.tcp.as_dict().items()
                      if v != getattr(defaults.tcp, k)}
    return out


# ---------------------------------------------------------------- named profiles

def _pairs(workers: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(workers) for j in range(i + 1, workers)]


@dataclass(frozen=True)
class PairRule:
    """A pair profile's rates as a rule rather than one per pair: worker i is in group
    ``group[i]``; the pair i, j runs at ``block[(g_i, g_j)]`` (given for g_i <= g_j) unless it
    is in ``singled`` ({(i, j), i < j: rate}); the same rate both ways."""

    group: tuple[int, ...]
    block: dict
    singled: dict
    note: str

    def rate(self, i: int, j: int) -> float:
        """The rate of the pair i, j (i != j), either way round."""
        a, b = min(i, j), max(i, j)
        if (a, b) in self.singled:
            return self.singled[(a, b)]
        ga, gb = sorted((self.group[a], self.group[b]))
        return self.block[(ga, gb)]


def _uniform_rates(net, workers: int, seed: int) -> PairRule:
    return PairRule((0,) * workers, {(0, 0): net.rate_mbit}, {}, "")


def _skewed_rates(net, workers: int, seed: int) -> PairRule:
    # drawn as indices into the list of pairs (i < j, lexicographic), not from the list:
    # ``random.sample`` draws its indices from len(population) and k alone, so these are the
    # indices of the pairs sampling the list would give, and in the same order (held: N^2 / 2
    # pairs, 8.4 M at 4096 workers, is most of a plan's memory)
    pairs = workers * (workers - 1) // 2
    n_slow = math.ceil(SKEWED_FRACTION * pairs)
    slow = pairs_at(workers, sorted(random.Random(seed).sample(range(pairs), n_slow)))
    listed = ", ".join(f"{i}-{j}" for i, j in slow[:NOTE_PAIRS]) or "none"
    more = f" and {len(slow) - NOTE_PAIRS} more" if len(slow) > NOTE_PAIRS else ""
    return PairRule((0,) * workers, {(0, 0): net.rate_mbit},
                    dict.fromkeys(slow, net.slow_rate_mbit), f"slow pairs: {listed}{more}")


def _skewed_worker_rates(net, workers: int, seed: int) -> PairRule:
    slow = random.Random(seed).randrange(workers)
    group = tuple(int(w == slow) for w in range(workers))
    return PairRule(group, {(0, 0): net.rate_mbit, (0, 1): net.slow_rate_mbit,
                            (1, 1): net.slow_rate_mbit}, {}, f"slow worker: {slow}")


def _two_cluster_rates(net, workers: int, seed: int) -> PairRule:
    half = (workers + 1) // 2
    group = tuple(int(w >= half) for w in range(workers))
    return PairRule(group, {(0, 0): net.rate_mbit, (0, 1): net.slow_rate_mbit,
                            (1, 1): net.rate_mbit}, {},
                    f"clusters: 0-{half - 1} and {half}-{workers - 1}")


def lognormal_worker_rates(rate_mbit: float, workers: int, seed: int) -> list[float]:
    """Per-worker rates with median ``rate_mbit``, rounded to 1 kbit/s and kept in the valid
    range."""
    rng = random.Random(seed)
    lo, hi = RATE_RANGE_MBIT
    draws = (rate_mbit * math.exp(rng.gauss(0.0, LOGNORMAL_SIGMA)) for _ in range(workers))
    return [min(hi, max(lo, round(r, 3))) for r in draws]


def _lognormal_rates(net, workers: int, seed: int) -> tuple[dict, str]:
    per_worker = lognormal_worker_rates(net.rate_mbit, workers, seed)
    rates = {(i, j): min(per_worker[i], per_worker[j]) for i, j in _pairs(workers)}
    return rates, "worker rates (Mbit/s): " + ", ".join(f"{r:g}" for r in per_worker)


_NAMED_BUILDERS = {"uniform": _uniform_rates, "skewed": _skewed_rates,
                   "skewed-worker": _skewed_worker_rates, "two-cluster": _two_cluster_rates,
                   "lognormal": _lognormal_rates}
assert tuple(_NAMED_BUILDERS) == PAIR_PROFILES, "every pair profile has one builder, in order"


_IMPAIRMENTS = ("latency_ms", "jitter_ms", "loss_pct", "jitter_dist", "reorder_pct",
                "ge_p_pct", "ge_r_pct", "ge_bad_loss_pct", "queue_pkts")


def _net_impairments(net) -> dict:
    """The run's impairment settings (net.*) every link gets unless a profile file says
    otherwise; settings a caller's ``net`` lacks keep the Link's defaults."""
    return {k: getattr(net, k) for k in _IMPAIRMENTS if hasattr(net, k)}


def run_tcp(tcp) -> TcpSettings:
    """The run's ``tcp.*`` section (a config.TcpConfig or None) as link settings."""
    if tcp is None:
        return TcpSettings()
    try:
        # a field the config has no setting for (rto_min_ms: set per link, or by time
        # dilation) keeps its default
        return TcpSettings(**{k: getattr(tcp, k, v) for k, v in TcpSettings().as_dict().items()})
    except TcpSettingsError as exc:
        raise ProfileError(str(exc)) from None


def _links_from_rule(net, rule: PairRule, tcp: TcpSettings, workers: int) -> BlockLinks:
    """``_links_from_pairs``'s links, link for link, as a rule (``BlockLinks``): each group's
    block and each singled-out pair in both directions, with the run's impairments and TCP."""
    values = _net_impairments(net)
    groups = sorted(set(rule.group))
    block = {(a, b): {"rate_mbit": rule.block[(min(a, b), max(a, b))], **values, "tcp": tcp}
             for a in groups for b in groups}
    # one kind per rate, in the order first met; each pair both ways, (i, j) then (j, i), in
    # the rule's order: what assigning them pair by pair gives, made at C speed (0.8 M pairs
    # at 4096 workers under ``skewed``)
    kind_of = {rate: k for k, rate in enumerate(dict.fromkeys(rule.singled.values()))}
    kinds = [{"rate_mbit": rate, **values, "tcp": tcp} for rate in kind_of]
    pairs = list(rule.singled)
    of_pair = list(map(kind_of.__getitem__, rule.singled.values()))
    both_ways = chain.from_iterable(zip(pairs, [(j, i) for i, j in pairs], strict=True))
    exceptions = dict(zip(both_ways, chain.from_iterable(zip(of_pair, of_pair, strict=True)),
                          strict=True))
    links = BlockLinks(workers, rule.group, block, kinds, exceptions)
    for key in links.representatives():
        links[key]   # every value in use checked once (``Link``), named by a link that has it
    return links


def _links_from_pairs(net, rates: dict[tuple[int, int], float],
                      tcp: TcpSettings) -> dict[tuple[int, int], Link]:
    """Both directions of every undirected pair, with the run's impairments and TCP."""
    links = {}
    values = _net_impairments(net)
    for (i, j), rate in rates.items():
        for s, d in ((i, j), (j, i)):
            links[(s, d)] = Link(s, d, rate, **values, tcp=tcp)
    return links


# ---------------------------------------------------------------- file profiles

_DEFAULT_KEYS = {"rate_mbit", *_IMPAIRMENTS}
_LINK_KEYS = {"src", "dst", "symmetric", "tcp", *_DEFAULT_KEYS}
_WORKER_KEYS = {"id", "up_mbit", "down_mbit"}
_TOP_KEYS = {"default", "link", "worker", "tcp"}


def _read_profile_file(path: Path) -> dict:
    if not path.is_file():
        raise ProfileError(f"profile file {str(path)!r} does not exist")
    try:
        text = path.read_text()
        return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile file {str(path)!r} cannot be parsed: {exc}") from None


def check_keys(where: str, table: Any, allowed: set[str],
               error: type[ValueError] = ProfileError) -> dict:
    """``table`` itself, when it is a table whose keys are all ``allowed``; else ``error``
    naming ``where`` (profile files of links and of compute speeds share this format)."""
    if not isinstance(table, dict):
        raise error(f"{where} must be a table of settings, got {table!r}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise error(f"{where}: unknown key {unknown[0]!r}; "
                    f"allowed: {', '.join(sorted(allowed))}")
    return table


def _check_list(where: str, value: Any) -> list:
    if not isinstance(value, list):
        raise ProfileError(f"{where} must be a list of tables ([[{where}]] in TOML)")
    return value


def _file_defaults(net, data: dict, where: str) -> dict:
    """The [default] table merged over the run's net.* values (each checked by ``Link``)."""
    table = check_keys(f"{where} [default]", data.get("default", {}), _DEFAULT_KEYS)
    base = {"rate_mbit": net.rate_mbit, **_net_impairments(net)}
    merged = base | dict(table)
    try:
        Link(0, 1, **merged)
    except ProfileError as exc:
        raise ProfileError(f"{where} [default] {str(exc).removeprefix('link 0->1 ')}") from None
    return merged


def _file_tcp(data: dict, where: str, run: TcpSettings) -> TcpSettings:
    """The file's [tcp] table, with the run's tcp.* settings over it where they are set."""
    try:
        table = TcpSettings.from_table(f"{where} [tcp]", data.get("tcp", {}))
    except TcpSettingsError as exc:
        raise ProfileError(str(exc)) from None
    return table.merged(run)


def _file_links(net, data: dict, workers: int, where: str,
                tcp: TcpSettings) -> dict[tuple[int, int], Link]:
    default = _file_defaults(net, data, where) | {"tcp": tcp}
    values = {(i, j): dict(default) for i in range(workers) for j in range(workers) if i != j}
    seen: set[tuple[int, int]] = set()
    for k, entry in enumerate(_check_list("link", data.get("link", []))):
        _apply_link_entry(f"{where} [[link]] #{k + 1}", entry, values, seen, workers)
    return {key: Link(key[0], key[1], **v) for key, v in values.items()}


def _apply_link_entry(where: str, entry: Any, values: dict, seen: set, workers: int) -> None:
    entry = check_keys(where, entry, _LINK_KEYS)
    for key in ("src", "dst"):
        if key not in entry:
            raise ProfileError(f"{where}: missing {key!r}")
    src = _check_worker(f"{where} src", entry["src"], workers)
    dst = _check_worker(f"{where} dst", entry["dst"], workers)
    if src == dst:
        raise ProfileError(f"{where}: src and dst are both worker {src}")
    symmetric = entry.get("symmetric", False)
    if not isinstance(symmetric, bool):
        raise ProfileError(f"{where}: symmetric = {symmetric!r} is not true or false")
    update = {k: v for k, v in entry.items() if k in _DEFAULT_KEYS}
    for key in ([(src, dst), (dst, src)] if symmetric else [(src, dst)]):
        if key in seen:
            raise ProfileError(f"{where}: link {key[0]}->{key[1]} is set twice")
        seen.add(key)
        link_update = dict(update)
        if "tcp" in entry:
            link_update["tcp"] = _link_tcp(where, entry["tcp"], values[key]["tcp"])
        Link(key[0], key[1], **(values[key] | link_update))   # validate with its name in view
        values[key].update(link_update)


def _link_tcp(where: str, table: Any, base: TcpSettings) -> TcpSettings:
    """A link's ``tcp = {...}`` over the file's and run's TCP."""
    if not isinstance(table, dict):
        raise ProfileError(f"{where} tcp must be a table, got {table!r}")
    try:
        return base.merged(TcpSettings.from_table(f"{where} tcp", table))
    except TcpSettingsError as exc:
        raise ProfileError(str(exc)) from None


def _file_caps(data: dict, workers: int, where: str) -> dict[int, WorkerCaps]:
    caps: dict[int, WorkerCaps] = {}
    for k, entry in enumerate(_check_list("worker", data.get("worker", []))):
        here = f"{where} [[worker]] #{k + 1}"
        entry = check_keys(here, entry, _WORKER_KEYS)
        if "id" not in entry:
            raise ProfileError(f"{here}: missing 'id'")
        rank = _check_worker(f"{here} id", entry["id"], workers)
        if rank in caps:
            raise ProfileError(f"{here}: worker {rank} is listed twice")
        up, down = entry.get("up_mbit"), entry.get("down_mbit")
        caps[rank] = WorkerCaps(None if up is None else _check_rate(f"{here} up_mbit", up),
                                None if down is None else _check_rate(f"{here} down_mbit", down))
    return caps


def _plan_from_file(net, workers: int, path: Path, tcp: TcpSettings) -> LinkPlan:
    where = f"profile {path.name}"
    raw = _read_profile_file(path)
    if isinstance(raw, dict) and "site" in raw:
        return _plan_from_sites(net, workers, path, raw, tcp)
    data = check_keys(where, raw, _TOP_KEYS)
    links = _file_links(net, data, workers, where, _file_tcp(data, where, tcp))
    caps = _file_caps(data, workers, where)
    return LinkPlan(workers, links, caps, profile=str(path), note=f"file {path}", mtu=net.mtu)


# ---------------------------------------------------------------- site profiles (measured)
# A file of *sites* (hosts) instead of workers, as ``netem measure`` writes it
# (``netem.measureplan.profile_document``): one ``[[site_link]]`` per directed pair of sites, a
# ``placement`` that puts each worker on a site, and a ``[same_site]`` rule for two workers on
# one site. The rest (``provenance``, each site's ``host``, ``addr``, ``tool_version`` and
# ``tcp``, each link's ``measured``) is where the numbers came from: kept in the file, checked
# for shape, not used.

_SITE_TOP_KEYS = {"format", "version", "provenance", "placement", "same_site", "site",
                  "site_link", "tcp"}
_SITE_KEYS = {"id", "host", "addr", "tool_version", "tcp"}
_SITE_LINK_KEYS = {"src", "dst", "rate_mbit", "latency_ms", "loss_pct", "measured"}
_SAME_SITE_KEYS = {"rule", "rate_mbit", "latency_ms", "loss_pct", "why"}


def site_of_workers(placement: Any, workers: int, sites: int, where: str = "placement") -> list:
    """Each worker's site: ``cycle`` (worker i on site i mod N), ``blocks`` (contiguous, the
    first ``workers % N`` sites one more), or an explicit list of one site per worker."""
    if isinstance(placement, list):
        if len(placement) != workers:
            raise ProfileError(f"{where} lists {len(placement)} sites; this run has {workers} "
                               "workers: give one site per worker, or 'cycle' or 'blocks'")
        return [_check_site(f"{where}[{k}]", s, sites) for k, s in enumerate(placement)]
    if placement == "cycle":
        return [w % sites for w in range(workers)]
    if placement == "blocks":
        out = []
        for k in range(sites):
            out += [k] * (workers // sites + (k < workers % sites))
        return out
    raise ProfileError(f"{where} = {placement!r} is not allowed; expected one of "
                       f"{', '.join(measured.PLACEMENTS)} or a list of one site per worker")


def _check_site(what: str, value: Any, sites: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < sites:
        raise ProfileError(f"{what} = {value!r} is out of range; expected a site in "
                           f"[0, {sites - 1}]")
    return value


def _sites(data: dict, where: str) -> list[dict]:
    sites = _check_list("site", data.get("site"))
    for k, entry in enumerate(sites):
        entry = check_keys(f"{where} [[site]] #{k + 1}", entry, _SITE_KEYS)
        if entry.get("id") != k:
            raise ProfileError(f"{where} [[site]] #{k + 1}: id = {entry.get('id')!r}; sites are "
                               f"numbered 0, 1, ... in order (expected {k})")
    if len(sites) < 2:
        raise ProfileError(f"{where} has {len(sites)} site; a site profile needs at least 2")
    return sites


def _site_links(data: dict, n: int, where: str) -> dict[tuple[int, int], dict]:
    out: dict[tuple[int, int], dict] = {}
    for k, entry in enumerate(_check_list("site_link", data.get("site_link"))):
        here = f"{where} [[site_link]] #{k + 1}"
        entry = check_keys(here, entry, _SITE_LINK_KEYS)
        if "measured" in entry and not isinstance(entry["measured"], dict):
            raise ProfileError(f"{here}: measured must be a table")
        for key in ("src", "dst", "rate_mbit"):
            if key not in entry:
                raise ProfileError(f"{here}: missing {key!r}")
        src, dst = (_check_site(f"{here} {key}", entry[key], n) for key in ("src", "dst"))
        if src == dst or (src, dst) in out:
            raise ProfileError(f"{here}: site link {src}->{dst} is "
                               + ("a site to itself" if src == dst else "given twice"))
        out[(src, dst)] = {k: entry[k] for k in ("rate_mbit", "latency_ms", "loss_pct")
                           if k in entry}
        Link(src, dst, **out[(src, dst)])   # checked here, with its name in view
    missing = [f"{i}->{j}" for i in range(n) for j in range(n) if i != j and (i, j) not in out]
    if missing:
        raise ProfileError(f"{where} has no [[site_link]] for {', '.join(missing[:4])}; every "
                           "directed pair of sites needs one")
    return out


def _same_site(data: dict, where: str) -> dict | None:
    if "same_site" not in data:
        return None
    table = check_keys(f"{where} [same_site]", data["same_site"], _SAME_SITE_KEYS)
    if table.get("rule") not in measured.SAME_SITE_RULES:
        raise ProfileError(f"{where} [same_site] rule = {table.get('rule')!r} is not allowed; "
                           f"expected one of {', '.join(measured.SAME_SITE_RULES)}")
    if "rate_mbit" not in table:
        raise ProfileError(f"{where} [same_site]: missing 'rate_mbit'")
    return {k: table[k] for k in ("rate_mbit", "latency_ms", "loss_pct") if k in table} | \
        {"rule": table["rule"]}


def _plan_from_sites(net, workers: int, path: Path, data: dict, tcp: TcpSettings) -> LinkPlan:
    where = f"profile {path.name}"
    check_keys(where, data, _SITE_TOP_KEYS)
    if data.get("format") != measured.FORMAT or data.get("version") != measured.FORMAT_VERSION:
        raise ProfileError(f"{where}: format {data.get('format')!r} version "
                           f"{data.get('version')!r}; this gasloc-emu reads "
                           f"{measured.FORMAT!r} version {measured.FORMAT_VERSION}")
    if not isinstance(data.get("provenance", {}), dict):
        raise ProfileError(f"{where}: provenance must be a table")
    sites = _sites(data, where)
    n = len(sites)
    links = _site_links(data, n, where)
    site_of = site_of_workers(data.get("placement"), workers, n, f"{where} placement")
    same = _same_site(data, where)
    first_on: dict[int, int] = {}
    shared = []   # the first two workers, in worker order, on one site
    for w, site in enumerate(site_of):
        if site in first_on and (not shared or first_on[site] < shared[0][0]):
            shared = [(first_on[site], w)]
        first_on.setdefault(site, w)
    if shared and same is None:
        raise ProfileError(f"{where}: workers {shared[0][0]} and {shared[0][1]} are both on "
                           f"site {site_of[shared[0][0]]} and the file has no [same_site] rule "
                           "for them; add one, or run at most one worker per site")
    base = _net_impairments(net)
    run_tcp_ = _file_tcp(data, where, tcp)
    # one group per site: every link between two sites is their measured link
    used = sorted(set(site_of))
    block = {(sa, sb): base | (dict(links[(sa, sb)]) if sa != sb else
                               {k: v for k, v in same.items() if k != "rule"}) | {"tcp": run_tcp_}
             for sa in used for sb in used if sa != sb or same is not None}
    plan_links = BlockLinks(workers, site_of, block)
    for key in plan_links.representatives():
        plan_links[key]   # every value in use checked once (``Link``)
    hosts = ", ".join(str(s.get("host", s["id"])) for s in sites)
    same_note = (f"same-site links: {same['rule']} ({same['rate_mbit']:g} Mbit/s, "
                 f"{same.get('latency_ms', 0):g} ms)" if shared else "no two workers share a site")
    note = (f"sites from {path}: {n} ({hosts}); worker -> site {site_of} "
            f"({data.get('placement') if isinstance(data.get('placement'), str) else 'listed'}); "
            f"{same_note}")
    return LinkPlan(workers, plan_links, {}, profile=str(path), note=note, mtu=net.mtu)


# ---------------------------------------------------------------- entry point

def is_file_profile(name: str) -> bool:
    return name.endswith((".toml", ".json"))


# the cloud profile's own settings and their defaults: given to another profile they would be
# recorded and never applied, so they are refused
_CLOUD_SETTINGS = {"placement": "", "cloud_rate": "capacity", "cloud_missing": "error"}


def _refuse_cloud_settings_elsewhere(net, name: str) -> None:
    if name == "cloud":
        return
    given = [f"net.{k} = {getattr(net, k)!r}" for k, default in _CLOUD_SETTINGS.items()
             if getattr(net, k, default) != default]
    if given:
        raise ProfileError(f"{', '.join(given)} applies to net.bw_profile = 'cloud' only, and "
                           f"this run has net.bw_profile = {name!r}; drop it, or use "
                           "--bw-profile cloud")


PairBuilder = Callable[[Any, int, int], tuple[dict, str]]


def build_link_plan(net, workers: int, seed: int, tcp=None,
                    builder: PairBuilder | None = None) -> LinkPlan:
    """The link plan of ``net.bw_profile`` for ``workers`` workers (see the module docstring);
    ``tcp``: the run's ``tcp.*`` section (None: the hosts' TCP); ``builder``: the pair rates
    of a profile that is none of ours (a user's, found by its name in the caller's plugin
    registry), called as the built-ins are: ``builder(net, workers, seed) -> (rates, note)``."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ProfileError(f"workers = {workers!r} is out of range; expected an integer >= 1")
    name = net.bw_profile
    _refuse_cloud_settings_elsewhere(net, name)
    if not name:
        return _unshaped_plan(net, workers)
    run = run_tcp(tcp)
    if is_file_profile(name):
        return _plan_from_file(net, workers, Path(name), run)
    if name == "cloud":
        return _cloud_plan(net, workers, run)
    if name in _NAMED_BUILDERS:
        built = _NAMED_BUILDERS[name](net, workers, seed)
        if isinstance(built, PairRule):
            return LinkPlan(workers, _links_from_rule(net, built, run, workers), {},
                            profile=name, note=built.note, mtu=net.mtu)
        rates, note = built
    elif builder is not None:
        rates, note = _checked_pairs(name, builder(net, workers, seed), workers)
    else:
        raise ProfileError(f"net.bw_profile = {name!r} is not a profile; expected one of "
                           f"{', '.join(NAMED)}, or a path to a .toml or .json file")
    return LinkPlan(workers, _links_from_pairs(net, rates, run), {}, profile=name, note=note,
                    mtu=net.mtu)


def _checked_pairs(name: str, result: Any, workers: int) -> tuple[dict, str]:
    """A user's builder's (rates, note), refused with one line naming the first fault: every
    unordered pair (i, j), i < j, once, with a rate in range (the ``Link`` checks it)."""
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str)
            and isinstance(result[0], dict)):
        raise ProfileError(f"net.bw_profile = {name!r} returned {type(result).__name__}; "
                           "expected (rates: {(i, j): Mbit/s}, note: str)")
    rates, note = result
    want = set(_pairs(workers))
    missing, extra = sorted(want - set(rates)), sorted(set(rates) - want, key=repr)
    if missing or extra:
        raise ProfileError(f"net.bw_profile = {name!r} gave no rate for pair {missing[0]}"
                           if missing else f"net.bw_profile = {name!r} gave a rate for "
                           f"{extra[0]!r}, not a pair (i, j) with 0 <= i < j < {workers}")
    return {pair: _check_rate(f"net.bw_profile = {name!r} pair {pair}", rates[pair])
            for pair in sorted(want)}, note


def _cloud_plan(net, workers: int, tcp: TcpSettings) -> LinkPlan:
    """Workers in regions (``net.placement``), links as measured between them (netem.cloud)."""
    text = getattr(net, "placement", "")
    try:
        placement = cloud.parse_placement(text)
        if len(placement) != workers:
            raise cloud.CloudError(
                f"net.placement = {text!r} places {len(placement)} workers; this run has "
                f"{workers}: give one region per worker (region*count repeats one)")
        between, note = cloud.region_links(placement, getattr(net, "cloud_rate", "capacity"),
                                           getattr(net, "cloud_missing", "error"))
    except cloud.CloudError as exc:
        raise ProfileError(f"profile 'cloud': {exc}") from None
    values = _net_impairments(net)
    extra_ms = values.pop("latency_ms", 0.0)
    # one group per region: every link between two regions is their measured link
    index = {region: k for k, region in enumerate(dict.fromkeys(placement))}
    block = {(index[a], index[b]): {"rate_mbit": c.rate_mbit,
                                    "latency_ms": round(c.rtt_ms / 2 + extra_ms, 3),
                                    **values, "tcp": tcp}
             for (a, b), c in between.items()}
    links = BlockLinks(workers, [index[r] for r in placement], block)
    for key in links.representatives():
        links[key]   # every value in use checked once (``Link``), named by a link that has it
    return LinkPlan(workers, links, {}, profile="cloud", note=note, mtu=net.mtu)


def _unshaped_plan(net, workers: int) -> LinkPlan:
    for attr in ("latency_ms", "jitter_ms", "loss_pct", "reorder_pct", "ge_p_pct"):
        if getattr(net, attr, 0):
            raise ProfileError(f"net.{attr} = {getattr(net, attr)!r} needs a bandwidth profile "
                               "(net.bw_profile is empty, so there are no links to put it on); "
                               "set net.bw_profile = 'uniform' with a large net.rate_mbit")
    return LinkPlan(workers, {}, {}, profile="", shaped=False, note="unshaped", mtu=net.mtu)
