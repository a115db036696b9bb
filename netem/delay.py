"""The ways a link's delay, jitter and loss reach the packets, as objects, and the choice of one.

Bandwidth is the tc shaper's (or the userspace shaper's) job; what a wide-area link adds on top
of the rate is done by one of these modes, chosen once at preflight (``choose``) and recorded:

- ``netem``: the kernel's netem qdisc on the switch port towards the receiver. Faithful to
  TCP; delay, jitter, random and bursty loss, reordering.
- ``packet-line``: ``netem.packetline``, a userspace delay line that replaces the bridge in
  the switch namespace (raw packet sockets), for kernels without netem and inside a user
  namespace. Faithful to TCP; the same impairments.
- ``release-queue``: the receiving worker holds each message until arrival + latency
  (``netem.userspace``). Not faithful to TCP: its kernel never sees the delay. Latency only.
- ``none``: nothing beyond the rate.

"Faithful to TCP" means the sender's kernel sees the round-trip time, so slow start, the
restart after idle, the window a bandwidth-delay product needs and retransmissions behave as
over a real wide-area link. Under ``release-queue`` they behave as on the fast, unshaped path,
and a message after idle under cubic can take 1.5-8 times less than it would (docs/NETWORK.md).

Each mode is one class here, a subclass of ``DelayMode``: its capabilities, and its part of
setting a tc network up and changing it (``port_commands``, ``replaces_bridge``,
``worker_spec``, ``change_link``). Nothing outside this module compares delay-mode names or
asks which mode it has: callers ask a mode what it can do and let it do its part.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

# This module sits below netem.capabilities (which builds its Decision from a mode), so it
# takes the capabilities as any object with ``has(feature)`` and ``errors``, and raises its own
# error, which the callers turn into their DelayModeError.


class DelayModeError(ValueError):
    """A delay mode is unknown, not possible here, or cannot apply what the plan asks."""

# what a plan can ask of its links beyond the rate (netem.profiles.Link's attributes)
IMPAIRMENTS = ("latency_ms", "jitter_ms", "loss_pct", "reorder_pct", "ge_p_pct")


class DelayMode:
    """One way of delaying packets: what it can do (capabilities, class attributes), and its
    part of setting a tc network up and changing it during a run (methods; the defaults do
    nothing, which is what a mode that does not act there does).

    Capabilities: ``faithful_to_tcp`` (the senders' kernels see the delay), ``applies`` (the
    IMPAIRMENTS it can put on a link), ``needs`` (capabilities.FEATURES it needs on this
    kernel), ``where`` (one phrase for the record and the dashboard), ``live_latency`` (a
    link's latency can change during a run), ``on_packets`` (it acts on packets, the network,
    not on messages), ``across_hosts`` (it can delay the links of a multi-node run).

    Each mode is one class in a module of its own (``BUILTIN``), which imports the mechanism
    it drives (``netem.commands``, ``netem.userspace``): those sit above this module."""

    name: ClassVar[str]
    faithful_to_tcp: ClassVar[bool] = True
    applies: ClassVar[frozenset[str]] = frozenset(IMPAIRMENTS)
    needs: ClassVar[tuple[str, ...]] = ()
    where: ClassVar[str]
    live_latency: ClassVar[bool] = True
    on_packets: ClassVar[bool] = True
    across_hosts: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<delay mode {self.name}>"

    def refuses(self, attr: str) -> bool:
        return attr not in self.applies

    def missing(self, caps: Any) -> list[str]:
        """The features this mode needs that ``caps`` lacks (all of them when unknown)."""
        if caps is None:
            return list(self.needs)
        return [f for f in self.needs if not caps.has(f)]

    # -- setting a namespace network up

    def port_commands(self, plan: Any, topo: Any, rank: int, per_sender: bool) -> list:
        """Set-up commands on the switch port towards worker ``rank`` (after its rate
        classes); ``per_sender``: one qdisc per sender even where all look alike, so that a
        run can change one sender's latency later (``netem.commands.delay_layout``)."""
        return []

    def replaces_bridge(self, plan: Any, delayed_later: bool) -> bool:
        """Whether the switch is this mode's userspace process instead of the kernel bridge;
        ``delayed_later``: a scenario will give some link a latency."""
        return False

    def worker_spec(self, plan: Any) -> dict | None:
        """The spec of what each worker holds for this mode under a shaper that puts the
        rates in the kernel (``netem.userspace.build_spec``), or None: the workers hold
        nothing."""
        return None

    # -- changing a running namespace network

    def change_link(self, session: Any, live: Any, src: int, dst: int, rate_mbit: float,
                    latency_ms: float | None) -> list:
        """The commands that give src -> dst this rate and, where not None, this latency, on
        ``session``'s network (``netem.namespaces.NetworkSession``) through ``live``
        (``netem.live.LiveLinks``, which holds the rates in force). By default the rate with
        tc; the latency is held where the mode holds it (here: nowhere to change)."""
        return live.change(src, dst, rate_mbit=rate_mbit)

    def port_delay_change(self, live: Any, src: int, dst: int) -> Any:
        """The command that restates src -> dst's delay on the switch port as ``live`` holds
        the link now (its latency and rate), or None: this mode puts no delay there."""
        return None

    def latency_refusal(self, live: Any, src: int, dst: int) -> str | None:
        """Why the latency of src -> dst cannot be changed in ``live``'s qdiscs (the end of a
        sentence that starts with the link and its new latency), or None when it can."""
        return (f"needs the netem qdisc, which delay mode {self.name!r} does not put on the "
                "switch ports")


class NoDelay(DelayMode):
    """Nothing beyond the rate."""

    name = "none"
    applies = frozenset()
    where = "no delay"
    live_latency = False
    on_packets = False


# the built-ins, by ``module:Class`` path: the modes that drive a mechanism import it, and the
# mechanisms sit above this module (they ask a decision's mode what to do)
BUILTIN = {"netem": "netem.delay_netem:NetemDelay",
           "packet-line": "netem.delay_packetline:PacketLineDelay",
           "release-queue": "netem.delay_release:ReleaseQueueDelay",
           "none": "netem.delay:NoDelay"}


@functools.cache
def _load(name: str) -> DelayMode:
    module_name, _, attr = BUILTIN[name].partition(":")
    made = getattr(importlib.import_module(module_name), attr)()
    if not isinstance(made, DelayMode) or made.name != name:
        raise DelayModeError(f"{BUILTIN[name]} is not the DelayMode {name!r}")
    return made


class _Modes(Mapping):
    """The delay modes by name, loaded when first asked for."""

    def __getitem__(self, name: str) -> DelayMode:
        if name not in BUILTIN:
            raise KeyError(name)
        return _load(name)

    def __iter__(self) -> Iterator[str]:
        return iter(BUILTIN)

    def __len__(self) -> int:
        return len(BUILTIN)


MODES: Mapping[str, DelayMode] = _Modes()
REQUESTS = ("auto", "netem", "packet-line", "release-queue")


def mode(name: str) -> DelayMode:
    """The mode called ``name``; a DelayModeError naming the known ones otherwise."""
    try:
        return MODES[name]
    except KeyError:
        raise DelayModeError(f"delay mode {name!r} is unknown; expected one of "
                              f"{', '.join(MODES)}") from None


def _why_missing(m: DelayMode, caps: Any) -> str:
    lacking = m.missing(caps)
    if caps is None:
        return f"{m.name} needs {', '.join(lacking)}, and this host was not probed"
    return "; ".join(f"{m.name} needs {f}: {caps.errors.get(f, 'not available')}"
                     for f in lacking)


def choose(requested: str, caps: Any) -> tuple[DelayMode, str]:
    """The delay mode of a namespace (tc) run and why: ``auto`` takes netem where the kernel
    has it, else the packet line, else (said so) the release queue."""
    if requested not in REQUESTS:
        raise DelayModeError(f"net.delay = {requested!r} is not allowed; expected one of "
                              f"{', '.join(REQUESTS)}")
    if requested != "auto":
        m = MODES[requested]
        if m.missing(caps):
            raise DelayModeError(f"net.delay = {requested!r} is not possible here: "
                                  f"{_why_missing(m, caps)}; use net.delay = 'auto'")
        return m, f"net.delay = {requested!r} requested"
    for name in ("netem", "packet-line"):
        m = MODES[name]
        if not m.missing(caps):
            return m, f"auto: delay by {m.where}"
    why = "; ".join(_why_missing(MODES[n], caps) for n in ("netem", "packet-line"))
    return MODES["release-queue"], (f"auto: {why}; delay by {MODES['release-queue'].where}")


def check_plan(plan, m: DelayMode, shaper: str) -> None:
    """Refuse, before anything exists, an impairment the chosen mode cannot apply (``shaper``:
    the run's, by name, for the message; a shaper that shapes nothing is not asked)."""
    if not plan.shaped:
        return
    for attr in IMPAIRMENTS:
        value = plan.max_of(attr)
        if value and m.refuses(attr):
            raise DelayModeError(
                f"net.{attr} = {value:g} needs a delay mode that acts on packets (netem or "
                f"packet-line), and this run has shaper {shaper!r} with delay {m.name!r}; set "
                f"net.{attr} = 0, or use net.shaper = 'tc' with net.delay = 'auto'")
