"""Communication graphs, Metropolis–Hastings mixing weights, per-round matchings, lambda_2, gamma*.

Every worker builds the same ``Topology`` from the shared config and seed, so each one derives
the same graph (and, for ``matching``, the same matching of round t) with no coordination.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache

import numpy as np

from gasloc_emu import plugins

MAX_RECORDED_EDGES = 4096  # a run record lists a fixed graph's edges up to this many
_MAX_TRIES = 1000
_SEARCH_STEPS_PER_WORKER = 16  # cap of one try of the matching search over a living subset


class TopologyError(ValueError):
    """The graph cannot be built for this number of workers."""


def torus_shape(n: int) -> tuple[int, int]:
    """The most square r x c = n with r, c >= 2."""
    for r in range(int(math.isqrt(n)), 1, -1):
        if n % r == 0:
            return r, n // r
    raise TopologyError(f"a torus needs N = r x c with r, c >= 2; N = {n} does not fit "
                        "(try 4, 6, 8, 9, 12, 16, ...)")


def _edges_ring(n: int) -> set[tuple[int, int]]:
    return {_edge(i, (i + 1) % n) for i in range(n)}


def _edges_torus(n: int) -> set[tuple[int, int]]:
    r, c = torus_shape(n)
    out = set()
    for i in range(n):
        row, col = divmod(i, c)
        out.add(_edge(i, row * c + (col + 1) % c))
        out.add(_edge(i, ((row + 1) % r) * c + col))
    return out


def _edges_exponential(n: int) -> set[tuple[int, int]]:
    """i ~ i + 2^k (mod n) for 2^k < n, made undirected (as in one-peer exponential graphs)."""
    out, k = set(), 1
    while k < n:
        out |= {_edge(i, (i + k) % n) for i in range(n)}
        k *= 2
    return out


def _edges_complete(n: int) -> set[tuple[int, int]]:
    return {(i, j) for i in range(n) for j in range(i + 1, n)}


def _edges_expander(n: int, d: int, seed: int) -> set[tuple[int, int]]:
    """A connected random d-regular graph (a good expander with high probability for d >= 3).

    Stubs are paired one edge at a time, each new edge drawn among the pairs still allowed
    (Steger & Wormald 1999), restarting when stuck; dense graphs are the complement of a
    sparse random regular graph, which is faster and just as random.
    """
    if d >= n or d < 1:
        raise TopologyError(f"expander degree d = {d} must be in [1, N - 1] with N = {n}")
    if (n * d) % 2:
        raise TopologyError(f"expander needs N x d even; N = {n}, d = {d}")
    rng = np.random.default_rng([seed, 0xE4])
    for _ in range(_MAX_TRIES):
        edges = _regular_dense(n, d, rng) if 2 * d > n - 1 else _regular_sparse(n, d, rng)
        if edges is not None and _connected(n, edges):
            return edges
    raise TopologyError(f"no connected simple {d}-regular graph on {n} nodes found")


def _regular_sparse(n: int, d: int, rng: np.random.Generator) -> set[tuple[int, int]] | None:
    """One attempt at pairing stubs into a simple d-regular graph; None when stuck."""
    stubs = [v for v in range(n) for _ in range(d)]
    edges: set[tuple[int, int]] = set()
    while stubs:
        for _ in range(64):  # a few draws find an allowed pair unless the attempt is stuck
            i, j = rng.choice(len(stubs), 2, replace=False)
            e = _edge(stubs[i], stubs[j])
            if e[0] != e[1] and e not in edges:
                break
        else:
            return None
        edges.add(e)
        for k in sorted((i, j), reverse=True):
            stubs.pop(k)
    return edges


def _regular_dense(n: int, d: int, rng: np.random.Generator) -> set[tuple[int, int]] | None:
    sparse = _regular_sparse(n, n - 1 - d, rng) if n - 1 - d > 0 else set()
    return None if sparse is None else _edges_complete(n) - sparse


def _edge(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def _connected(n: int, edges: set[tuple[int, int]]) -> bool:
    adj = _adjacency(n, edges)
    seen, stack = {0}, [0]
    while stack:
        for j in adj[stack.pop()]:
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return len(seen) == n


def _adjacency(n: int, edges: set[tuple[int, int]]) -> list[list[int]]:
    adj: list[set[int]] = [set() for _ in range(n)]
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    return [sorted(s) for s in adj]


def edge_rates(rates) -> dict[tuple[int, int], float]:
    """The rate of each undirected edge (i < j): the slower of its two directed links, since a
    gossip exchange sends both ways and the round waits for both messages."""
    rows = np.asarray(rates).tolist()
    n = len(rows)
    return {(i, j): min(rows[i][j], rows[j][i]) for i in range(n) for j in range(i + 1, n)}


def edge_rate(rates, a: int, b: int) -> float:
    """``edge_rates``' rate of the one edge a, b (without the other N^2 / 2)."""
    return float(min(rates[a, b], rates[b, a]))


def _edges_fastest(n: int, d: int, rates, slack: float = 0.0
                   ) -> set[tuple[int, int]]:
    """The connected graph of degree at most d on the fastest links (``FASTEST_RULE``).

    1. A spanning tree of greatest bottleneck under the degree cap: Kruskal over the links,
       fastest first, keeping a link when it joins two components and both ends have degree
       below d. Without the cap this is a maximum spanning tree, whose slowest edge is the
       largest bottleneck any connected graph on these links can have (the minimax path
       property: Hu 1961, "The maximum capacity route problem"). With d >= 2 it always spans:
       while two components remain, each is a tree with a worker of degree <= 1 < d, and the
       link between two such workers was never refused for its degree.
    2. More edges for mixing, none slower than (1 - slack) x that tree's slowest edge (slack 0:
       the bottleneck stays the tree's), while both ends have degree below d: each time the
       link whose ends are the most hops apart (it shortens the longest detour gossip takes;
       a tree's spectral gap is what its diameter allows), then the fastest, then the pair.
    Ties are broken by the pair (i, j), so every worker derives the same graph.
    """
    if n > 2 and d < 2:
        raise TopologyError(f"topology 'fastest' needs degree d >= 2 to connect N = {n} "
                            f"workers; got d = {d}")
    rate = edge_rates(rates)
    order = sorted(rate, key=lambda e: (-rate[e], e))
    comp, deg = list(range(n)), np.zeros(n, dtype=int)
    hops = np.full((n, n), np.inf)
    np.fill_diagonal(hops, 0.0)

    def root(v: int) -> int:
        while comp[v] != v:
            comp[v] = comp[comp[v]]
            v = comp[v]
        return v

    def add(a: int, b: int) -> None:
        edges.add((a, b))
        deg[a] += 1
        deg[b] += 1
        # shortest hop counts through the new edge, both ways (an O(n^2) update per edge)
        np.minimum(hops, hops[:, [a]] + 1 + hops[[b], :], out=hops)
        np.minimum(hops, hops[:, [b]] + 1 + hops[[a], :], out=hops)

    edges: set[tuple[int, int]] = set()
    for a, b in order:
        if root(a) != root(b) and deg[a] < d and deg[b] < d:
            comp[root(a)] = root(b)
            add(a, b)
    floor = (1.0 - slack) * min(rate[e] for e in edges)
    pairs = np.array([e for e in order if rate[e] >= floor], dtype=int).reshape(-1, 2)
    speed = np.array([rate[(a, b)] for a, b in pairs])
    free = np.array([(a, b) not in edges for a, b in pairs], dtype=bool)
    while True:
        ok = free & (deg[pairs[:, 0]] < d) & (deg[pairs[:, 1]] < d)
        if not ok.any():
            return edges
        cand = np.flatnonzero(ok)
        far = hops[pairs[cand, 0], pairs[cand, 1]]
        best = cand[np.lexsort((pairs[cand, 1], pairs[cand, 0], -speed[cand], -far))[0]]
        free[best] = False
        add(int(pairs[best, 0]), int(pairs[best, 1]))


FASTEST_RULE = ("fastest: a spanning tree of greatest bottleneck under the degree cap d "
                "(Kruskal over the links, fastest first; an edge's rate is the slower of its two "
                "directed links in the run's link plan), then links no slower than (1 - slack) "
                "x the tree's slowest edge while both ends have degree < d, the ends most hops "
                "apart first, then the fastest")


def check_rates(rates, n: int) -> np.ndarray:
    """``rates`` (rows of link rates in Mbit/s, the diagonal ignored) as a read-only n x n
    float64 array (8 bytes a link, checked at once: 4096 workers' 16.7 M links are 134 MB);
    TopologyError naming the first bad entry."""
    if isinstance(rates, np.ndarray):
        matrix = np.array(rates, dtype=np.float64)
    else:
        rows = [[float(v) for v in row] for row in rates]
        if len(rows) != n or any(len(row) != n for row in rows):
            raise TopologyError(f"link rates must be an {n} x {n} matrix (one row per worker); "
                                f"got {len(rows)} rows of lengths {sorted({len(r) for r in rows})}")
        matrix = np.array(rows, dtype=np.float64).reshape(n, n)
    if matrix.shape != (n, n):
        raise TopologyError(f"link rates must be an {n} x {n} matrix (one row per worker); got "
                            f"shape {matrix.shape}")
    bad = ~(np.isfinite(matrix) & (matrix > 0))
    np.fill_diagonal(bad, False)
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        raise TopologyError(f"link rate {i} -> {j} = {float(matrix[i, j])!r} Mbit/s; expected a "
                            "finite rate > 0")
    matrix.setflags(write=False)
    return matrix


def random_matching(edges: set[tuple[int, int]], n: int, rng: np.random.Generator,
                    complete: bool, living: frozenset[int] | None = None,
                    cut: frozenset[tuple[int, int]] = frozenset()) -> set[tuple[int, int]]:
    """A random perfect matching using only ``edges``; uniform when the base graph is complete.

    On other base graphs: a randomised backtracking search that always matches the free worker
    with the fewest free neighbours first, trying those neighbours in random order.

    ``living`` (default: all n workers) restricts the matching to those workers, so that a run
    whose workers leave keeps pairing the ones still there. The draws are the same as without it
    when every worker lives; otherwise a worker may stay unmatched: one of an odd number on a
    complete base, as few as the search finds on other bases (a subgraph of the base graph may
    have no perfect matching).

    ``cut`` (sorted pairs, a partition's) are edges the matching may not use; the draws are
    those above when nothing is cut, otherwise the search of a non-complete base over the
    remaining edges.
    """
    if cut:
        alive = frozenset(range(n)) if living is None else living
        adj = [(frozenset(a) & alive) - {j for j in a if _edge(i, j) in cut}
               for i, a in enumerate(_adjacency(n, edges))]
        return _near_perfect_matching(alive, adj, rng)
    if living is None or len(living) == n:
        return _perfect_matching(edges, n, rng, complete)
    order = sorted(living)
    if complete:
        perm = rng.permutation(len(order))
        return {_edge(order[perm[k]], order[perm[k + 1]]) for k in range(0, len(order) - 1, 2)}
    adj = [frozenset(a) & living for a in _adjacency(n, edges)]
    return _near_perfect_matching(frozenset(order), adj, rng)


def _perfect_matching(edges: set[tuple[int, int]], n: int, rng: np.random.Generator,
                      complete: bool) -> set[tuple[int, int]]:
    """Every worker matched; the draws of the original matching, kept bit for bit."""
    if complete:
        perm = rng.permutation(n)
        return {_edge(int(perm[k]), int(perm[k + 1])) for k in range(0, n, 2)}
    adj = [frozenset(a) for a in _adjacency(n, edges)]
    out = _match(frozenset(range(n)), adj, rng)
    if out is None:
        raise TopologyError("the base graph has no perfect matching")
    return out


def _near_perfect_matching(free: frozenset, adj: list[frozenset], rng: np.random.Generator
                           ) -> set[tuple[int, int]]:
    """A matching of ``free`` leaving few workers unmatched, found in bounded time.

    It first allows the unmatched workers the components force (one per odd component), then two
    more per try. Each try stops after a fixed number of search steps, so a subgraph without a
    matching of that size (a bipartite graph that lost two workers of one side) cannot make the
    search exponential; the count of steps, not a clock, bounds it, so every worker agrees.
    """
    for slack in range(_odd_components(free, adj), len(free) + 1, 2):
        out = _match(free, adj, rng, slack, [_SEARCH_STEPS_PER_WORKER * len(free)])
        if out is not None:
            return out
    raise AssertionError("unreachable: with slack = len(free) every search succeeds")


def _odd_components(free: frozenset, adj: list[frozenset]) -> int:
    """How many connected components of odd size ``free`` has: each leaves a worker unmatched."""
    seen: set[int] = set()
    odd = 0
    for start in sorted(free):
        if start in seen:
            continue
        size, stack = 0, [start]
        seen.add(start)
        while stack:
            size += 1
            for j in adj[stack.pop()] & free:
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        odd += size % 2
    return odd


def _match(free: frozenset, adj: list[frozenset], rng: np.random.Generator, slack: int = 0,
           steps: list[int] | None = None):
    """A matching of ``free`` leaving at most ``slack`` workers unmatched, or None.

    ``steps`` (a one-item list, shared by the recursion) caps the search; None: no cap. With
    slack 0 and no cap this is the perfect-matching search, draw for draw.
    """
    if not free:
        return set()
    if steps is not None:
        steps[0] -= 1
        if steps[0] < 0:
            return None
    v = min(free, key=lambda u: (len(adj[u] & free), u))
    options = sorted(adj[v] & free)
    for k in rng.permutation(len(options)):
        rest = _match(free - {v, options[k]}, adj, rng, slack, steps)
        if rest is not None:
            return rest | {_edge(v, options[k])}
    if slack > 0:  # leave v unmatched, only once matching it has failed
        return _match(free - {v}, adj, rng, slack - 1, steps)
    return None


class Family:
    """One way of choosing a gossip graph's edges, registered under its ``topology.name``.

    The built-in families are below (``BUILTIN``); a user's is a subclass registered under the
    entry-point group ``gasloc_emu.topologies`` or named ``package.module:Class``
    (docs/EXTENDING.md, "A topology"). A family is stateless: the ``Topology`` it is handed
    carries N, the degree, the seed, the base graph and the link rates. Mixing weights,
    lambda_2 and the living view over a scenario's workers come from the edges, the same for
    every family."""

    name: str = ""
    time_varying: bool = False  # a new set of edges each round (``draw``)
    needs_rates: bool = False   # chooses edges by the link plan's rates (``Topology.rates``)
    even_workers: bool = False  # needs an even N (perfect matchings)

    @property
    def fixed(self) -> bool:
        """The same edges every round, from N, degree and seed alone: a base for matchings."""
        return not (self.time_varying or self.needs_rates)

    def edges(self, topo: Topology) -> set[tuple[int, int]]:
        """The graph's edges (i < j); for a time-varying family every edge a round may use."""
        raise NotImplementedError

    def rule(self, topo: Topology) -> str:
        """How the peers are chosen, in words (for the run record)."""
        return f"{self.name}: fixed by worker index"

    def draw(self, topo: Topology, rng: np.random.Generator, living: frozenset[int] | None,
             cut: frozenset[tuple[int, int]]) -> set[tuple[int, int]]:
        """A time-varying family's edges of one round among ``living`` (None: everyone) without
        the ``cut`` edges, drawn from ``rng`` (seeded by the run's seed and the round)."""
        raise NotImplementedError(f"topology {self.name!r} is not time-varying")

    def exact_mixing(self, topo: Topology) -> np.ndarray | None:
        """E[W_t] in closed form where the family knows it; None: averaged over rounds."""
        return None


class _Fixed(Family):
    """A graph fixed by worker index (ring, torus, exponential, complete)."""

    def __init__(self, name: str, build: Callable[[int], set[tuple[int, int]]]):
        self.name, self._build = name, build

    def edges(self, topo: Topology) -> set[tuple[int, int]]:
        return self._build(topo.n)


class Expander(Family):
    name = "expander"

    def edges(self, topo: Topology) -> set[tuple[int, int]]:
        return _edges_expander(topo.n, topo.degree, topo.seed)

    def rule(self, topo: Topology) -> str:
        return f"expander: a random connected {topo.degree}-regular graph from seed {topo.seed}"


class Matchings(Family):
    """``count`` random perfect matchings of the base graph per round (``matching``: one,
    ``matching2``: two), drawn from (seed, round) so every worker draws the same."""

    time_varying = True
    even_workers = True

    def __init__(self, name: str, count: int):
        self.name, self.count = name, count

    def edges(self, topo: Topology) -> set[tuple[int, int]]:
        base = family(topo.base)
        if not base.fixed:
            raise TopologyError(f"topology.base = {topo.base!r} is not a fixed graph; expected "
                                f"one of {', '.join(FIXED)}")
        return base.edges(topo)

    def rule(self, topo: Topology) -> str:
        return (f"{self.name}: random perfect matchings of the {topo.base} graph, drawn each "
                f"round from (seed {topo.seed}, round)")

    def draw(self, topo: Topology, rng: np.random.Generator, living: frozenset[int] | None,
             cut: frozenset[tuple[int, int]]) -> set[tuple[int, int]]:
        complete = topo.base == "complete"
        out: set[tuple[int, int]] = set()
        for _ in range(self.count):
            out |= random_matching(topo.possible_edges, topo.n, rng, complete, living, cut)
        return out

    def exact_mixing(self, topo: Topology) -> np.ndarray | None:
        if self.count != 1 or topo.base != "complete":
            return None
        # a uniform perfect matching pairs i with j with probability 1/(n-1)
        off = topo.alpha / 2 / (topo.n - 1)
        return np.full((topo.n, topo.n), off) + np.eye(topo.n) * (1 - topo.alpha / 2 - off)


class Fastest(Family):
    """Degree <= d on the fastest links of the run's link plan (``FASTEST_RULE``)."""

    name = "fastest"
    needs_rates = True

    def edges(self, topo: Topology) -> set[tuple[int, int]]:
        return _edges_fastest(topo.n, topo.degree, topo.rates, topo.slack)

    def rule(self, topo: Topology) -> str:
        return FASTEST_RULE.replace(" d ", f" d = {topo.degree} ", 1).replace(
            "(1 - slack)", f"(1 - slack = {topo.slack:g})", 1)


BUILTIN: dict[str, Family] = {f.name: f for f in (
    _Fixed("ring", _edges_ring), _Fixed("torus", _edges_torus),
    _Fixed("exponential", _edges_exponential), Expander(), _Fixed("complete", _edges_complete),
    Matchings("matching", 1), Matchings("matching2", 2), Fastest())}
NAMES = tuple(BUILTIN)  # the built-in topology.name values (config.TOPOLOGIES lists the same)
FIXED = tuple(n for n, f in BUILTIN.items() if f.fixed)
RANDOM = tuple(n for n, f in BUILTIN.items() if f.time_varying)
MEASURED = tuple(n for n, f in BUILTIN.items() if f.needs_rates)
GROUP = "gasloc_emu.topologies"


@cache
def family(name: str) -> Family:
    """The family ``topology.name = name`` means: a built-in, a name registered under
    ``gasloc_emu.topologies``, or ``package.module:Class`` (a Family subclass)."""
    if name in BUILTIN:
        return BUILTIN[name]
    if not plugins.is_path(name) and name not in plugins.registered(GROUP):
        known = ", ".join([*NAMES, *sorted(plugins.registered(GROUP))])
        raise TopologyError(f"unknown topology {name!r}; expected one of {known}, or "
                            "package.module:Class")
    try:
        cls = plugins.load(name, GROUP, "topology.name")
    except plugins.PluginError as exc:
        raise TopologyError(str(exc)) from None
    if not (isinstance(cls, type) and issubclass(cls, Family)):
        raise TopologyError(f"topology.name = {name!r} is {cls!r}, not a subclass of "
                            "gasloc_emu.topology.Family")
    return cls()


@dataclass(frozen=True)
class Topology:
    """A (possibly time-varying) graph with Metropolis–Hastings weights, W_t = I - alpha L_t.

    ``rates``: the run's directed link rates in Mbit/s (``rates[i][j]``: i -> j, the link
    plan's), None when unshaped; the families that need rates choose their edges by them, every
    graph reports its bottleneck with them (``bottleneck_mbit``)."""

    name: str
    n: int
    degree: int = 4
    seed: int = 0
    base: str = "complete"
    alpha: float = 1.0
    # compared and hashed by their digest (below): the memoised rounds hash the topology on
    # every call, and n x n rates of a large run would cost more than the rounds themselves
    rates: np.ndarray | None = field(default=None, repr=False, compare=False)
    slack: float = 0.0   # fastest: how much slower than its tree's bottleneck a link may be
    rates_digest: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        fam = self.family  # an unknown name fails here
        if not 0.0 <= self.slack < 1.0:
            raise TopologyError(f"rate slack = {self.slack!r} must be in [0, 1)")
        if self.rates is not None:
            rows = check_rates(self.rates, self.n)
            object.__setattr__(self, "rates", rows)
            object.__setattr__(self, "rates_digest", hashlib.blake2b(
                rows.tobytes(), digest_size=16).hexdigest())
        elif fam.needs_rates:
            raise TopologyError(f"topology {self.name!r} chooses peers by the links' measured "
                                "rates: it needs a shaped bandwidth profile (net.bw_profile, "
                                "e.g. cloud with net.placement)")
        if self.n < 2:
            raise TopologyError(f"topology {self.name!r} needs at least 2 workers; "
                                f"got N = {self.n}")
        if fam.even_workers and self.n % 2:
            raise TopologyError(f"a perfect matching needs an even number of workers; N = {self.n}")
        _ = self.possible_edges  # build now so that bad requests fail at construction

    @property
    def family(self) -> Family:
        """The way this graph's edges are chosen (``family(name)``)."""
        return family(self.name)

    @cached_property
    def possible_edges(self) -> set[tuple[int, int]]:
        """The graph's edges; for random matchings, every edge of the base graph a round may use."""
        return self.family.edges(self)

    @property
    def rule(self) -> str:
        """How the peers were chosen, in words (for the run record)."""
        return self.family.rule(self)

    def bottleneck_mbit(self) -> float | None:
        """The slowest edge rate a round of this graph uses (the slowest edge of the base
        graph for random matchings, any of which a round may draw); None without rates."""
        if self.rates is None:
            return None
        return min(edge_rate(self.rates, a, b) for a, b in self.possible_edges)

    def peers_record(self) -> dict:
        """The chosen peers for the run record: the rule, and for a fixed graph of at most
        ``MAX_RECORDED_EDGES`` edges each edge with its rate (Mbit/s, the slower direction;
        null when unshaped); ``edge_count`` in any case."""
        listed = not self.time_varying and len(self.possible_edges) <= MAX_RECORDED_EDGES
        return {"rule": self.rule, "bottleneck_mbit": self.bottleneck_mbit(),
                "edge_count": len(self.possible_edges),
                "edges": [[a, b, None if self.rates is None else edge_rate(self.rates, a, b)]
                          for a, b in sorted(self.possible_edges)]
                if listed else None}

    @cached_property   # asked by every worker every round (``neighbors``): found once
    def time_varying(self) -> bool:
        return self.family.time_varying

    def edges(self, t: int) -> set[tuple[int, int]]:
        """Edges used in round t (the same for every t on a fixed graph)."""
        if not self.time_varying:
            return self.possible_edges
        return _round_edges(self, t)

    def _draw_edges(self, t: int, living: frozenset[int] | None = None,
                    cut: frozenset[tuple[int, int]] = frozenset()) -> set[tuple[int, int]]:
        """Round t's matching (two for matching2) among ``living`` (default: everyone),
        without the ``cut`` edges."""
        rng = np.random.default_rng([self.seed, t, 0x3A7C])
        return self.family.draw(self, rng, living, cut)

    def neighbors(self, t: int) -> list[list[int]]:
        """Sorted neighbours of every worker in round t (a fixed graph's, built once: every
        worker asks each round; read-only)."""
        if not self.time_varying:
            return self._fixed_neighbors
        return _adjacency(self.n, self.edges(t))

    @cached_property
    def _fixed_neighbors(self) -> list[list[int]]:
        return _adjacency(self.n, self.possible_edges)

    def peers(self, rank: int, t: int) -> list[int]:
        """Sorted neighbours of ``rank`` in round t."""
        return self.neighbors(t)[rank]

    def row(self, rank: int, t: int, adj: list[list[int]] | None = None
            ) -> tuple[float, dict[int, float]]:
        """(W[i,i], {j: W[i,j]}) for worker ``rank`` in round t.

        W_ij = alpha * lambda_ij with lambda_ij = 1 / (1 + max(d_i, d_j)) (Metropolis–Hastings),
        W_ii = 1 - sum_j W_ij, so W is symmetric and doubly stochastic by construction.
        """
        return _mh_row(adj if adj is not None else self.neighbors(t), rank, self.alpha)

    def mixing_matrix(self, t: int = 0) -> np.ndarray:
        return _mixing_matrix(self, t)

    def expected_mixing(self, samples: int = 256) -> np.ndarray:
        """E[W_t]: W itself for a fixed graph, an average over rounds for random matchings."""
        if not self.time_varying:
            return self.mixing_matrix(0)
        exact = self.family.exact_mixing(self)
        if exact is not None:
            return exact
        return sum(self.mixing_matrix(t) for t in range(samples)) / samples

    @cached_property
    def spectrum(self) -> np.ndarray:
        """The eigenvalues of (expected) W, ascending; computed once (a dense eigensolve, some
        seconds at N = 4096), read-only."""
        mus = np.linalg.eigvalsh(self.expected_mixing())
        mus.flags.writeable = False
        return mus

    @cached_property
    def lambda2(self) -> float:
        """Second-largest eigenvalue modulus of (expected) W."""
        if self.n > DENSE_SPECTRUM_MAX:
            low, second = self._extremes
            return float(max(abs(low), abs(second)))
        eig = np.sort(np.abs(self.spectrum))[::-1]
        return float(eig[1]) if len(eig) > 1 else 0.0

    @cached_property
    def _extremes(self) -> tuple[float, float]:
        """(the smallest eigenvalue of (expected) W, the largest but the one of the all-ones
        vector), by Lanczos (``lanczos_extremes``): what ``lambda2`` and ``momentum_growth``
        need of the spectrum past ``DENSE_SPECTRUM_MAX`` workers, where a dense eigensolve
        would cost more than the run (O(N^3): some 15-30 s at N = 4096 on 2 cores)."""
        w = self.expected_mixing()
        ends = lanczos_extremes(sparse_matvec(w), self.n, seed=self.seed)
        if ends is None:
            mus = self.spectrum
            ends = (float(mus[0]), float(mus[-2]))
        return ends

    @property
    def spectral_gap(self) -> float:
        return 1.0 - self.lambda2

    @property
    def gamma_star(self) -> float:
        return critical_momentum(self.lambda2)

    def momentum_growth(self, gamma: float) -> float:
        """Largest growth factor per round of pure gossip with momentum gamma (below 1: stable).

        Each eigenvalue mu of W evolves as x' = mu ((1 + gamma) x - gamma x_prev); with a negative
        mu (bipartite-like graphs, sparse Metropolis weights) a large gamma makes a root of
        r^2 - mu (1 + gamma) r + mu gamma leave the unit circle and the workers diverge.
        """
        # past DENSE_SPECTRUM_MAX the two ends of the spectrum but 1: a root's modulus grows
        # with mu on [0, 1) (|r| = sqrt(mu gamma) while complex, the larger real root after)
        # and with |mu| for mu < 0 (real roots, the larger (|mu| (1 + gamma) + sqrt(disc)) / 2)
        mus = self._extremes if self.n > DENSE_SPECTRUM_MAX else self.spectrum[:-1]
        roots = [np.roots([1.0, -mu * (1 + gamma), mu * gamma]) for mu in mus]
        return float(max(np.abs(r).max() for r in roots)) if roots else 0.0


    def min_eigenvalue(self, rounds: int = 64) -> float:
        """The smallest eigenvalue of W_t over the graph's rounds (the first ``rounds`` draws
        of a time-varying one): below 0, a round's mixing flips a disagreement's sign, which
        overlapped GASLoC cannot afford (docs/ALGORITHM.md, "Overlapped GASLoC")."""
        draws = range(rounds) if self.time_varying else range(1)
        return float(min(np.linalg.eigvalsh(self.mixing_matrix(t))[0] for t in draws))

    def lazy_alpha(self) -> float:
        """The largest alpha with W = I - alpha L positive semi-definite in every round:
        1 / lambda_max(L), from this graph's own alpha and smallest eigenvalue."""
        return min(1.0, self.alpha / (1.0 - self.min_eigenvalue())) if self.alpha else 1.0


@lru_cache(maxsize=64)
def _round_edges(topo: Topology, t: int) -> set[tuple[int, int]]:
    """Round t's edges, memoised: every worker asks for them once per row it computes."""
    return topo._draw_edges(t)


def _mh_row(adj, rank: int, alpha: float) -> tuple[float, dict[int, float]]:
    """Row ``rank`` of W = I - alpha L with Metropolis–Hastings weights over adjacency ``adj``."""
    d_i = len(adj[rank])
    off = {j: alpha / (1.0 + max(d_i, len(adj[j]))) for j in adj[rank]}
    return 1.0 - sum(off.values()), off


def mh_table(n: int, edges: Iterable[tuple[int, int]], alpha: float
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W = I - alpha L with the Metropolis–Hastings weights of ``_mh_row``, for all n workers at
    once, as a padded neighbour table: (self weight (n,), peers (n, K) in increasing rank,
    weights (n, K)), K the largest degree; a row with fewer peers is padded with its own index
    and weight 0. Vectorised (no Python loop over workers), for thousands of workers per round
    (the consensus surrogate); equal to ``row`` to rounding (a test holds them equal)."""
    pairs = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)
    src = np.concatenate([pairs[:, 0], pairs[:, 1]])
    dst = np.concatenate([pairs[:, 1], pairs[:, 0]])
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    deg = np.bincount(src, minlength=n)
    k = int(deg.max(initial=0))
    col = np.arange(len(src)) - (np.cumsum(deg) - deg)[src]
    peers = np.tile(np.arange(n, dtype=np.int64)[:, None], (1, k))
    weights = np.zeros((n, k))
    peers[src, col] = dst
    weights[src, col] = alpha / (1.0 + np.maximum(deg[src], deg[dst]))
    return 1.0 - weights.sum(1), peers, weights


# up to this many workers the spectrum is one dense eigensolve (every eigenvalue, as before);
# past it its two ends come from Lanczos on the sparse W
DENSE_SPECTRUM_MAX = 1024
LANCZOS_STEPS = 400    # then a dense eigensolve: W's ends are not apart enough for Lanczos
LANCZOS_TOL = 1e-12    # on the residual bound of each end's Ritz value


def sparse_matvec(w: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """x -> w @ x over w's nonzero entries only (a gossip W has N (degree + 1) of them)."""
    rows, cols = np.nonzero(w)
    vals = w[rows, cols]
    n = w.shape[0]
    return lambda x: np.bincount(rows, weights=vals * x[cols], minlength=n)


def lanczos_extremes(matvec: Callable[[np.ndarray], np.ndarray], n: int,
                     steps: int = LANCZOS_STEPS, seed: int = 0) -> tuple[float, float] | None:
    """(smallest, largest) eigenvalue of a symmetric doubly stochastic W on the complement of
    the all-ones vector (its eigenvalue 1 left out, as ``spectrum[:-1]`` leaves it), by Lanczos
    with full reorthogonalisation (Golub & Van Loan, "Matrix Computations", 4th ed., sec. 10.1
    and 10.3.1): the Ritz values of T_k lie inside the spectrum and the extreme ones converge
    first; each is taken once its residual bound |beta_k s_k| (sec. 10.1.4) is below
    ``LANCZOS_TOL``. None when ``steps`` steps do not get both there (a ring's ends are
    O(1 / N^2) apart: the caller solves densely)."""
    rng = np.random.default_rng([seed, n, 0x1A2C])
    q = rng.standard_normal(n)
    q -= q.mean()
    q /= np.linalg.norm(q)
    k_max = min(steps, n - 1)
    basis = np.empty((k_max, n))
    alphas: list[float] = []
    betas: list[float] = []
    for k in range(k_max):
        basis[k] = q
        v = matvec(q)
        alphas.append(float(q @ v))
        for _ in range(2):   # twice is enough (Parlett)
            v -= basis[:k + 1].T @ (basis[:k + 1] @ v)
            v -= v.mean()
        beta = float(np.linalg.norm(v))
        done = beta < 1e-12 or k == n - 2    # an invariant subspace: T's values are exact
        if done or (k + 1) % 25 == 0 or k == k_max - 1:
            ritz, vecs = np.linalg.eigh(np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1))
            if done or beta * max(abs(vecs[-1, 0]), abs(vecs[-1, -1])) < LANCZOS_TOL:
                return float(ritz[0]), float(ritz[-1])
        betas.append(beta)
        q = v / beta
    return None


def _mixing_matrix(graph, t: int) -> np.ndarray:
    """The dense W of round t, built row by row from ``graph.row`` (one shared adjacency)."""
    w = np.zeros((graph.n, graph.n))
    adj = graph.neighbors(t)
    for i in range(graph.n):
        w[i, i], off = graph.row(i, t, adj)
        for j, v in off.items():
            w[i, j] = v
    return w


class LivingGraph:
    """A ``Topology`` seen over the workers alive in each round: what gossip mixes over when
    workers leave and join.

    ``alive(t)`` gives the living workers of round t (the scenario timeline, which every worker
    knows, so they all derive the same graph with no coordination). Fixed graphs keep the edges
    with both ends alive; random matchings are drawn among the living only, with the seed of the
    full graph, so that with everyone alive peers and weights are bit for bit the full graph's.
    Metropolis–Hastings weights use the surviving degrees, so W stays symmetric and doubly
    stochastic; a worker with no living neighbour (or a dead one) has the row (1.0, {}) and no
    peers: it keeps training alone. The spectral quantities (``lambda2``, ``gamma_star``) are
    those of the full graph: the momentum is chosen once, for the configured graph.

    ``cut(t)`` (optional) gives the edges a partition cuts in round t, as pairs in either
    order: they are absent edges, like a dead worker's (weights over the remaining degrees,
    matchings drawn without them); with nothing cut the graph is bit for bit the one without.
    """

    def __init__(self, full: Topology, alive: Callable[[int], Iterable[int]],
                 cut: Callable[[int], Iterable[tuple[int, int]]] | None = None):
        if not isinstance(full, Topology):
            raise TypeError(f"full must be a Topology, got {type(full).__name__}")
        if not callable(alive):
            raise TypeError(f"alive must be a function round -> living workers, got {alive!r}")
        if cut is not None and not callable(cut):
            raise TypeError(f"cut must be a function round -> cut edges, got {cut!r}")
        self.full, self._alive, self._cut = full, alive, cut

    def __repr__(self) -> str:
        return f"LivingGraph({self.full!r})"

    # -- the full graph's identity and spectrum
    @property
    def n(self) -> int:
        return self.full.n

    @property
    def name(self) -> str:
        return self.full.name

    @property
    def alpha(self) -> float:
        return self.full.alpha

    @property
    def time_varying(self) -> bool:
        return self.full.time_varying

    @property
    def possible_edges(self) -> set[tuple[int, int]]:
        return self.full.possible_edges

    @property
    def lambda2(self) -> float:
        return self.full.lambda2

    @property
    def spectral_gap(self) -> float:
        return self.full.spectral_gap

    @property
    def gamma_star(self) -> float:
        return self.full.gamma_star

    def momentum_growth(self, gamma: float) -> float:
        return self.full.momentum_growth(gamma)

    def expected_mixing(self, samples: int = 256) -> np.ndarray:
        return self.full.expected_mixing(samples)

    # -- round t over the living
    def living(self, t: int) -> frozenset[int]:
        """The workers alive in round t, as ``alive(t)`` gives them."""
        return frozenset(self._alive(t))

    def cut(self, t: int) -> frozenset[tuple[int, int]]:
        """The edges cut in round t, as sorted pairs."""
        if self._cut is None:
            return frozenset()
        return frozenset(_edge(*_check_pair(e, self.n, t)) for e in self._cut(t))

    def _round(self, t: int):
        return _living_round(self.full, t, self.living(t), self.cut(t))

    def edges(self, t: int) -> set[tuple[int, int]]:
        """Edges used in round t, both ends alive and not cut (a fresh set: callers may modify
        it)."""
        return set(self._round(t)[0])

    def neighbors(self, t: int) -> list[list[int]]:
        return [list(a) for a in self._round(t)[1]]

    def peers(self, rank: int, t: int) -> list[int]:
        """Sorted living neighbours of ``rank`` in round t; [] for a dead or isolated worker."""
        _check_worker(rank, self.n)
        return list(self._round(t)[1][rank])

    def row(self, rank: int, t: int, adj: list[list[int]] | None = None
            ) -> tuple[float, dict[int, float]]:
        """(W[i,i], {j: W[i,j]}) of worker ``rank`` in round t, with the surviving degrees."""
        _check_worker(rank, self.n)
        if adj is None:
            adj = self._round(t)[1]
        return _mh_row(adj, rank, self.alpha)

    def mixing_matrix(self, t: int = 0) -> np.ndarray:
        """W of round t over all n workers; a dead worker's row and column are those of I."""
        return _mixing_matrix(self, t)


@lru_cache(maxsize=64)
def _living_round(topo: Topology, t: int, alive: frozenset[int],
                  cut: frozenset[tuple[int, int]] = frozenset()
                  ) -> tuple[frozenset[tuple[int, int]], tuple[tuple[int, ...], ...]]:
    """(edges, adjacency) of round t among ``alive`` without the ``cut`` edges, memoised:
    every worker asks for its row every round, and a matching over a subset costs a search."""
    _check_alive(alive, topo.n, t)
    if topo.time_varying:
        edges = topo._draw_edges(t, alive, cut)
    else:
        edges = {e for e in topo.possible_edges
                 if e[0] in alive and e[1] in alive and e not in cut}
    return frozenset(edges), tuple(tuple(a) for a in _adjacency(topo.n, edges))


def _check_alive(alive: frozenset, n: int, t: int) -> None:
    """ValueError unless the living workers of round t are ints in [0, n)."""
    bad = sorted((w for w in alive if type(w) is not int or not 0 <= w < n), key=repr)
    if bad:
        raise ValueError(f"alive({t}) gave workers {bad} outside [0, {n}) (ints only); the "
                         "graph must be built over every worker id the run ever has")


def _check_pair(pair, n: int, t: int) -> tuple[int, int]:
    """A cut edge as two distinct worker ids in [0, n); ValueError naming it otherwise."""
    ok = isinstance(pair, tuple) and len(pair) == 2 and all(
        type(w) is int and 0 <= w < n for w in pair) and pair[0] != pair[1]
    if not ok:
        raise ValueError(f"cut({t}) gave edge {pair!r}; expected a pair of two different "
                         f"workers in [0, {n})")
    return pair


def _check_worker(rank: int, n: int) -> None:
    if type(rank) is not int or not 0 <= rank < n:
        raise ValueError(f"rank {rank!r} outside [0, {n})")


def critical_momentum(lambda2: float) -> float:
    """gamma* = (1 - sqrt(1 - lambda2))^2 / lambda2, the critically damped heavy-ball value."""
    if lambda2 <= 0.0:
        return 0.0
    lam = min(lambda2, 1.0)
    return (1.0 - math.sqrt(1.0 - lam)) ** 2 / lam


def from_config(cfg, rates=None) -> Topology:
    """The gossip graph of a resolved ``Config``; the run plan builds it once, for the
    algorithms that need one (``OuterAlgorithm.needs_graph``), and hands it down. ``rates``:
    the link plan's directed rates (``netplan.link_rates``), None when unshaped."""
    t = cfg.topology
    return Topology(t.name, cfg.workers, t.degree, cfg.seed, t.base, cfg.algo.alpha, rates,
                    t.rate_slack)
