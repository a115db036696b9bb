"""The ways a run's link rates are enforced, as objects, and the choice of one.

A shaper puts each directed link's rate on the traffic; the delay, jitter and loss on top of
the rate are a delay mode's (``netem.delay``), and each shaper carries some of those modes:

- ``tc``: HTB classes in the kernel, on the veth ports of one network namespace per worker
  (one host: ``netem.namespaces``) or on the host's interfaces (several hosts:
  ``netem.hosttc``); the launcher changes classes during a run (``netem.live``). Carries every
  delay mode: netem, the packet line, or the receivers' release queue.
- ``userspace``: each worker paces what it sends and releases what it receives
  (``netem.userspace``); no privileges, every worker in the launcher's namespace. Only the
  release queue delays, so the senders' TCP never sees the latency.
- ``none``: nothing is shaped; no rate, no delay.

``net.shaper`` asks for one of these or ``auto`` (tc where every host can, else userspace);
``resolve`` is the one place a request becomes a shaper. Nothing outside this module compares
shaper names: callers ask a shaper what it does.
"""
from __future__ import annotations

from dataclasses import dataclass

REQUESTS = ("auto", "tc", "userspace", "none")


class ShaperError(ValueError):
    """A shaper is unknown, or the one asked for is not possible where the run would be."""


@dataclass(frozen=True)
class Shaper:
    """One way of enforcing link rates: what it does, where, and which delay modes it carries."""

    name: str
    shapes: bool                  # puts rates on links at all
    delay_modes: tuple[str, ...]  # the netem.delay modes it can carry, in order of preference
    where: str                    # one phrase for the record and the dashboard
    changes_applied_by: str       # who applies a scenario's link changes (events.jsonl)
    kernel_classes: bool = False  # tc classes: needs CAP_NET_ADMIN (or a user namespace), htb, u32
    paces_in_workers: bool = False  # each worker paces its sends (netem.userspace.LinkShaper)

    @property
    def namespaces(self) -> bool:
        """On one host, every worker gets its own network namespace on a bridge (the veth
        ports are where the classes go); otherwise all workers share the launcher's."""
        return self.kernel_classes

    @property
    def launcher_changes_links(self) -> bool:
        """A scenario's link changes are applied by the launcher (tc classes, in place), not by
        the workers (their pacers and release queues)."""
        return self.kernel_classes

    @property
    def ports_per_sender(self) -> bool:
        """Across hosts each worker binds one port per sender, so that a class matched on the
        destination address and port is one directed link (``netem.hosttc``)."""
        return self.kernel_classes

    def carries(self, delay: str) -> bool:
        return delay in self.delay_modes


SHAPERS: dict[str, Shaper] = {s.name: s for s in (
    Shaper("tc", True, ("netem", "packet-line", "release-queue"),
           "HTB classes per directed link in the kernel",
           "tc: the launcher, when the first worker reports the round before",
           kernel_classes=True),
    Shaper("userspace", True, ("release-queue",),
           "sender pacing + receiver release queue",
           "userspace: each worker at its round start", paces_in_workers=True),
    Shaper("none", False, ("none",), "nothing shaped",
           "none: a partition's cuts are the algorithms' absent edges"),
)}


def shaper(name: str) -> Shaper:
    """The shaper called ``name``; a ShaperError naming the known ones otherwise."""
    try:
        return SHAPERS[name]
    except KeyError:
        raise ShaperError(f"shaper {name!r} is unknown; expected one of "
                          f"{', '.join(SHAPERS)}") from None


def check_request(requested: str) -> None:
    if requested not in REQUESTS:
        raise ShaperError(f"net.shaper = {requested!r} is not allowed; expected one of "
                          f"{', '.join(REQUESTS)}")


def asked(requested: str) -> Shaper | None:
    """The shaper a request names outright; None for ``auto`` (the host decides)."""
    check_request(requested)
    return None if requested == "auto" else SHAPERS[requested]


def turned_off(requested: str) -> bool:
    """Whether the request switches shaping off: nothing the network settings say is applied."""
    kind = asked(requested)
    return kind is not None and not kind.shapes


def may_take(requested: str, kind: Shaper) -> bool:
    """Whether ``requested`` can end with the shaper ``kind`` (``auto``: any that shapes)."""
    got = asked(requested)
    return got is kind if got is not None else kind.shapes


def resolve(requested: str, tc_missing: str, where: str = "here") -> tuple[Shaper, str]:
    """The shaper a request gets where tc lacks ``tc_missing`` ("" when tc can run), and why.

    ``auto`` takes tc when it can, else the userspace shaper, saying why; ``tc`` where it
    cannot is refused, naming what is missing ``where`` (``here``, ``on node 2``, ...)."""
    kind = asked(requested)
    tc, userspace = SHAPERS["tc"], SHAPERS["userspace"]
    if kind is not None and not kind.kernel_classes:
        return kind, ("shaping off (net.shaper = none)" if not kind.shapes
                      else f"{kind.name} shaper requested")
    if tc_missing:
        if kind is tc:
            raise ShaperError(f"net.shaper = 'tc' is not possible {where}: {tc_missing}; "
                              "use net.shaper = 'auto' or 'userspace'")
        return userspace, f"auto: tc is not possible {where} ({tc_missing})"
    return tc, "tc requested and available" if kind is tc else "auto: tc is possible"
