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

Nothing outside this module compares delay-mode names: callers ask a mode what it can do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# This module sits below netem.capabilities (which builds its Decision from a mode), so it
# takes the capabilities as any object with ``has(feature)`` and ``errors``, and raises its own
# error, which the callers turn into their DelayModeError.


class DelayModeError(ValueError):
    """A delay mode is unknown, not possible here, or cannot apply what the plan asks."""

# what a plan can ask of its links beyond the rate (netem.profiles.Link's attributes)
IMPAIRMENTS = ("latency_ms", "jitter_ms", "loss_pct", "reorder_pct", "ge_p_pct")


@dataclass(frozen=True)
class DelayMode:
    """One way of delaying packets: what it applies, what it needs, and how faithful it is."""

    name: str
    faithful_to_tcp: bool
    applies: frozenset[str]          # the IMPAIRMENTS it can put on a link
    needs: tuple[str, ...]           # capabilities.FEATURES it needs on this kernel
    where: str                       # one phrase for the record and the dashboard
    live_latency: bool = True        # whether a link's latency can change during a run
    on_packets: bool = True          # acts on packets (the network), not on messages
    kernel_qdisc: bool = False       # netem qdiscs on the switch ports (netem.commands)
    replaces_bridge: bool = False    # the switch is a userspace process, not the bridge
    at_receiver: bool = False        # the receiving worker holds messages (netem.userspace)

    def refuses(self, attr: str) -> bool:
        return attr not in self.applies

    def missing(self, caps: Any) -> list[str]:
        """The features this mode needs that ``caps`` lacks (all of them when unknown)."""
        if caps is None:
            return list(self.needs)
        return [f for f in self.needs if not caps.has(f)]


_ALL = frozenset(IMPAIRMENTS)
MODES: dict[str, DelayMode] = {m.name: m for m in (
    DelayMode("netem", True, _ALL, ("netem",),
              "the kernel's netem qdisc on the switch port towards each receiver",
              kernel_qdisc=True),
    DelayMode("packet-line", True, _ALL, ("packet",),
              "a userspace packet delay line between the namespaces (raw packet sockets)",
              replaces_bridge=True),
    DelayMode("release-queue", False, frozenset({"latency_ms"}), (),
              "the receiver's release queue: messages are held after TCP delivered them, so "
              "TCP never sees the delay (not faithful to TCP)", on_packets=False,
              at_receiver=True),
    DelayMode("none", True, frozenset(), (), "no delay", live_latency=False, on_packets=False),
)}
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
