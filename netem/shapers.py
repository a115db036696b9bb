"""The ways a run's link rates are enforced, as objects behind one interface, and the choice of one.

A shaper puts each directed link's rate on the traffic; the delay, jitter and loss on top of
the rate are a delay mode's (``netem.delay``), and each shaper carries some of those modes.
Each shaper is one class, a subclass of ``Shaper``, in a module of its own, and composes the
mechanisms that do the work:

- ``tc`` (``netem.shaper_tc``): HTB classes in the kernel, on the veth ports of one network
  namespace per worker (one host: ``netem.namespaces``) or on the host's interfaces (several
  hosts: ``netem.hosttc``); the launcher changes classes during a run (``netem.live``).
  Carries every delay mode: netem, the packet line, or the receivers' release queue.
- ``userspace`` (``netem.shaper_userspace``): each worker paces what it sends and releases
  what it receives (``netem.userspace``); no privileges, every worker in the launcher's
  namespace. Only the release queue delays, so the senders' TCP never sees the latency.
- ``none`` (``netem.shaper_none``): nothing is shaped; no rate, no delay.

More register under the entry-point group ``gasloc_emu.shapers`` (or are named by path,
``package.module:Class``): docs/EXTENDING.md has one in a file. ``net.shaper`` asks for one of
them or ``auto`` (tc where every host can, else userspace); ``resolve`` is the one place a
request becomes a shaper. Nothing outside this module compares shaper names: callers call the
shaper's methods.

This module sits below ``netem.capabilities`` and the mechanisms (they ask a decision's shaper
what to do), so the built-ins are registered as ``module:Class`` paths, imported when first
asked for, as a plugin's entry point is.
"""
from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from typing import Any, ClassVar

GROUP = "gasloc_emu.shapers"
# the built-ins, registered as an installed package registers a plugin (``GROUP``)
BUILTIN = {"tc": "netem.shaper_tc:TcShaper",
           "userspace": "netem.shaper_userspace:UserspaceShaper",
           "none": "netem.shaper_none:NoShaper"}
AUTO = "auto"
REQUESTS = (AUTO, *BUILTIN)


class ShaperError(ValueError):
    """A shaper is unknown, or the one asked for is not possible where the run would be."""


class HostPart:
    """What a shaper does on one host of a multi-node run, beyond the workers' own pacing:
    nothing, here. ``start`` builds it, ``close`` removes it (on every exit path: the
    launcher holds it as a context), ``describe`` says what was built for the record."""

    ports_per_sender = False   # each worker binds one port per sender (a link is dst + port)

    def start(self) -> None:
        """Build what this host shapes with (nothing here)."""

    def close(self) -> None:
        """Remove what ``start`` built (nothing here)."""

    def describe(self) -> dict | None:
        return None

    def change_links(self, changes: dict) -> None:
        """A scenario's link changes {(src, dst): (rate_mbit, latency_ms)}: the workers apply
        them (their pacers and release queues)."""


class Shaper(ABC):
    """One way of enforcing link rates: its capabilities, and what the launcher, a node of a
    multi-node run and each worker ask of it.

    Capabilities (class attributes): ``shapes`` (puts rates on links at all), ``delay_modes``
    (the ``netem.delay`` modes it carries, in order of preference: what delay, jitter and loss
    it can apply), ``worker_namespaces`` (on one host each worker gets its own network
    namespace on a bridge, which ``netem.namespaces`` builds and removes), ``where`` and
    ``changes_applied_by`` (one phrase each for the record and the dashboard)."""

    name: ClassVar[str]
    shapes: ClassVar[bool] = True
    delay_modes: ClassVar[tuple[str, ...]]
    worker_namespaces: ClassVar[bool] = False
    where: ClassVar[str]
    changes_applied_by: ClassVar[str]

    def carries(self, delay: str) -> bool:
        return delay in self.delay_modes

    def __repr__(self) -> str:
        return f"<shaper {self.name}>"

    # -- preflight: a decision before anything exists

    @abstractmethod
    def decide(self, caps: Any, delay: str, why: str, auto: bool) -> Any:
        """This shaper's ``netem.capabilities.Decision`` on one host with capabilities
        ``caps``: the delay mode it takes for ``net.delay = delay``, and the reason (``why``:
        how the request came to this shaper; ``auto``: the request was ``auto``). A
        ``CapabilityError`` when the host lacks what it needs or the delay is not one of its."""

    @abstractmethod
    def decide_across_hosts(self, link_plan: Any, why: str, auto: bool) -> Any:
        """The ``Decision`` of a multi-node run that got this shaper (every node can run it),
        its plan checked; a ``CapabilityError`` for what it cannot do across hosts."""

    def check_plan(self, plan: Any, decision: Any) -> None:
        """Refuse, before anything exists, what the plan asks that this shaper cannot do (the
        delay mode's own refusals are ``netem.delay.check_plan``'s); a CapabilityError."""
        return None

    # -- the launcher, on one host

    def before_launch(self, argv: list[str]) -> None:
        """Run before the launcher builds anything (the tc shaper re-executes it in a user
        namespace of its own); nothing by default."""
        return None

    def link_changer(self, session: Any) -> Callable[[dict], None] | None:
        """What applies a scenario's link changes {(src, dst): (rate_mbit, latency_ms)} in
        the launcher, for ``session`` (``netem.namespaces.NetworkSession``); None: the workers
        apply them (their pacers and release queues)."""
        return None

    # -- a node of a multi-node run

    def on_host(self, plan: Any, local: list[int], bases: dict[int, tuple[str, int]],
                mtu: int) -> HostPart:
        """This node's part for its ``local`` workers (``bases``: each rank's address and
        first port): nothing beyond the workers' own pacing by default."""
        return HostPart()

    # -- the workers

    def worker_spec(self, plan: Any, decision: Any) -> dict | None:
        """The JSON-able spec every worker builds its ``netem.userspace.LinkShaper`` from
        (``shaping_from_spec``): pacing and release in the workers, the release queue alone,
        or None when the workers do nothing."""
        return None


# ---------------------------------------------------------------- the registry

@functools.cache
def registered() -> dict[str, metadata.EntryPoint]:
    """The short names installed packages register under ``GROUP`` (the first one wins)."""
    out: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=GROUP):
        out.setdefault(ep.name, ep)
    return out


def known() -> list[str]:
    """Every name ``net.shaper`` takes besides a path: ``auto``, the built-ins, the plugins."""
    return [*REQUESTS, *sorted(n for n in registered() if n not in BUILTIN)]


def _path_of(name: str) -> str:
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" in name:
        return name
    ep = registered().get(name)
    if ep is None:
        raise ShaperError(f"net.shaper = {name!r} is unknown; expected one of "
                          f"{', '.join(known()[1:])}, or package.module:Class")
    return ep.value


_LOADED: dict[str, Shaper] = {}   # by the name asked for, and by the shaper's own name


def shaper(name: str) -> Shaper:
    """The shaper called ``name`` (a built-in, a registered plugin, or ``package.module:Class``)
    as an object, one per process; a ShaperError naming the known ones otherwise. A shaper
    loaded by path is found by its own name afterwards (a ``Decision`` records that)."""
    got = _LOADED.get(name)
    if got is not None:
        return got
    path = _path_of(name)
    module_name, _, attr = path.partition(":")
    try:
        cls: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            cls = getattr(cls, part)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the plugin's
        raise ShaperError(f"net.shaper = {name!r} ({path}) did not load: "
                          f"{type(exc).__name__}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Shaper)):
        raise ShaperError(f"net.shaper = {name!r} is {cls!r}, not a subclass of "
                          "netem.shapers.Shaper")
    if name not in BUILTIN and cls.name in BUILTIN:
        raise ShaperError(f"net.shaper = {name!r} calls itself {cls.name!r}, a built-in's name")
    kind = _LOADED[name] = cls()
    _LOADED.setdefault(kind.name, kind)
    return kind


class _Shapers(Mapping):
    """The built-in shapers by name, loaded when first asked for."""

    def __getitem__(self, name: str) -> Shaper:
        if name not in BUILTIN:
            raise KeyError(name)
        return shaper(name)

    def __iter__(self) -> Iterator[str]:
        return iter(BUILTIN)

    def __len__(self) -> int:
        return len(BUILTIN)


SHAPERS: Mapping[str, Shaper] = _Shapers()


def check_request(requested: str) -> None:
    """A ShaperError unless ``net.shaper = requested`` names something: ``auto``, a built-in,
    or a plugin (a registered name or a path), which is loaded and checked here, so that one
    that cannot be is refused with the config, before anything starts."""
    if requested == AUTO or requested in BUILTIN:
        return
    if ":" in requested or requested in registered():
        shaper(requested)
        return
    raise ShaperError(f"net.shaper = {requested!r} is not allowed; expected one of "
                      f"{', '.join(known())}, or package.module:Class")


def asked(requested: str) -> Shaper | None:
    """The shaper a request names outright; None for ``auto`` (the host decides)."""
    check_request(requested)
    return None if requested == AUTO else shaper(requested)


def turned_off(requested: str) -> bool:
    """Whether the request switches shaping off: nothing the network settings say is applied."""
    kind = asked(requested)
    return kind is not None and not kind.shapes


def may_take(requested: str, kind: Shaper) -> bool:
    """Whether ``requested`` can end with the shaper ``kind`` (``auto``: any that shapes)."""
    got = asked(requested)
    return got is kind if got is not None else kind.shapes


def may_take_tc(requested: str) -> bool:
    """Whether ``requested`` can end with tc, so that every host must say what it lacks for
    tc before the run's shaper is decided (``resolve``'s ``tc_missing``)."""
    return may_take(requested, SHAPERS["tc"])


def unshaped() -> Shaper:
    """The shaper of a run that shapes nothing (no bandwidth profile, or shaping off)."""
    return SHAPERS["none"]


def for_link_events() -> Shaper:
    """The shaper of a run without a bandwidth profile whose scenario changes links: the
    workers pace and release from the first change on (no privileges, nothing to build)."""
    return SHAPERS["userspace"]


def resolve(requested: str, tc_missing: str, where: str = "here") -> tuple[Shaper, str]:
    """The shaper a request gets where tc lacks ``tc_missing`` ("" when tc can run), and why.

    ``auto`` takes tc when it can, else the userspace shaper, saying why; ``tc`` where it
    cannot is refused, naming what is missing ``where`` (``here``, ``on node 2``, ...); any
    other shaper named outright is taken as asked (its ``decide`` refuses what it lacks)."""
    kind = asked(requested)
    tc, userspace = SHAPERS["tc"], SHAPERS["userspace"]
    if kind is not None and kind is not tc:
        return kind, (f"shaping off (net.shaper = {requested})" if not kind.shapes
                      else f"{kind.name} shaper requested")
    if tc_missing:
        if kind is tc:
            raise ShaperError(f"net.shaper = 'tc' is not possible {where}: {tc_missing}; "
                              "use net.shaper = 'auto' or 'userspace'")
        return userspace, f"auto: tc is not possible {where} ({tc_missing})"
    return tc, "tc requested and available" if kind is tc else "auto: tc is possible"
