"""The run's network, decided before anything runs: the link plan checked against what this host
can shape, tc or the userspace shaper (on one host or agreed by every node), the pairs that
carry traffic, and the simulator's link model over the same plan.
"""
from __future__ import annotations

from gasloc_emu.config import Config


def multi_host_decision(cfg: Config, link_plan, missing_by_node: dict[int, str] | None = None,
                        plays_links: bool = False):
    """The decision of a multi-node run from what each node lacks for tc ("" = nothing).

    ``auto`` takes tc when every node can, else the userspace shaper (naming the node that
    cannot); ``tc`` with a node that cannot is refused on every node before anything starts.
    ``plays_links``: the scenario changes links during the run, which host tc does not apply
    yet: ``auto`` takes the userspace shaper, ``tc`` is refused, before anything starts.
    """
    from netem.capabilities import CapabilityError, Decision
    if not shaped(cfg):
        why = "shaper = none" if cfg.net.shaper == "none" else "no bandwidth profile"
        return Decision("none", "none", why)
    lacking = {k: why for k, why in (missing_by_node or {}).items() if why}
    if plays_links:
        lacking = {-1: "the scenario changes links during the run (link events, a trace or a "
                       "partition), which host tc does not apply yet"}
    if cfg.net.shaper == "userspace":
        return _userspace(link_plan, "userspace shaper requested")
    if lacking:
        k, why = min(lacking.items())
        where = "across hosts" if k < 0 else f"on node {k}"
        if cfg.net.shaper == "tc":
            raise CapabilityError(f"net.shaper = 'tc' is not possible {where}: {why}; use "
                                  "net.shaper = 'auto' or 'userspace'")
        return _userspace(link_plan, f"auto: tc is not possible {where} ({why})")
    from netem.hosttc import check_host_plan
    check_host_plan(link_plan)
    return Decision("tc", "release-queue", f"{'auto: ' if cfg.net.shaper == 'auto' else ''}"
                    "tc on every host's interfaces (HTB per directed link, matched on "
                    "destination address and port); latency by the receiver's release queue")

def _userspace(link_plan, why: str):
    from netem.capabilities import Decision
    from netem.commands import check_supported
    decision = Decision("userspace", "release-queue",
                        why + ": sender pacing + receiver release queue")
    check_supported(link_plan, decision)  # jitter and loss need netem: refused up front
    return decision

def used_pairs(cfg: Config, topo) -> list[tuple[int, int]]:
    """Directed links training will use: ring successors for DiLoCo, graph edges otherwise."""
    n = cfg.workers
    if topo is None:
        return sorted({(k, (k + 1) % n) for k in range(n) if n > 1})
    edges = topo.possible_edges
    return sorted({(a, b) for a, b in edges} | {(b, a) for a, b in edges})

def shaping_decision(cfg: Config):
    """The shaper decision for a shaped run; raises before anything is created."""
    from netem.capabilities import choose_shaper, probe
    return choose_shaper(cfg.net.shaper, probe(), delay=cfg.net.delay)

def shaped(cfg: Config) -> bool:
    return bool(cfg.net.bw_profile) and cfg.net.shaper != "none"

# the network settings a run without a shaper would record but never apply
UNAPPLIED_WITHOUT_SHAPER = ("bw_profile", "latency_ms", "jitter_ms", "loss_pct", "reorder_pct",
                            "ge_p_pct")

def check_network(cfg: Config):
    """The bandwidth profile's link plan (the run plan builds it here, once), refusing network
    settings that would be recorded but not applied.

    The profile is built (so a broken profile file fails) whether or not a shaper will run;
    a profile, latency, jitter or loss with ``net.shaper = none`` is an error, since the run
    record would state a network the workers never saw.
    """
    from netem.profiles import ProfileError, build_link_plan
    if cfg.net.shaper == "none":
        # checked before the plan, whose own checks (jitter within latency, ...) would
        # otherwise name a smaller fault of settings that cannot apply at all
        given = [f"net.{k} = {getattr(cfg.net, k)!r}" for k in UNAPPLIED_WITHOUT_SHAPER
                 if getattr(cfg.net, k)]
        if given:
            raise ProfileError(f"{', '.join(given)} with net.shaper = 'none' would not be "
                               "applied; drop it, or choose a shaper (auto, tc or userspace)")
    return build_link_plan(cfg.net, cfg.workers, cfg.seed, tcp=cfg.tcp)

def sim_link_model(cfg: Config, link_plan, world=None):
    """The simulator's link model from the bandwidth profile, or None when unshaped.

    Unshaped means what it means for ``run``: no profile, or ``net.shaper = none``; the virtual
    clock then predicts nothing, as the emulator then shapes nothing. A scenario whose link
    events change rates or latencies gets a ``RoundLinkModel`` even without a profile (``run``
    then shapes with the userspace shaper, see ``open_network``). ``world``: the run's, when
    it has one).
    """
    if world is not None and world.changes_links:
        return RoundLinkModel(world.links, link_caps(cfg, link_plan))
    if not shaped(cfg):
        return None
    return link_plan.link_model()

def link_caps(cfg: Config, link_plan):
    """(src, dst) -> (src's uplink cap, dst's downlink cap) in Mbit/s, None for none."""
    if not shaped(cfg):
        return lambda src, dst: (None, None)
    return lambda src, dst: (link_plan.cap(src).up_mbit, link_plan.cap(dst).down_mbit)

class LinkCut(RuntimeError):
    """A message was offered to a link a partition cuts: the algorithms must not send there."""

class RoundLinkModel:
    """The virtual clock's link model when a scenario (or a link trace) changes links: each
    message gets the (rate, latency) in force for the round in its key and the virtual time it
    is sent at (``at_round``; ``world.LinkSchedule.at``), with the profile's caps on top, as
    ``LinkPlan.link_model`` has them (one flow with a cap to itself). An unshaped link takes
    no time; a cut link refuses the message (``LinkCut``)."""

    def __init__(self, schedule, caps):
        self.schedule, self.caps = schedule, caps

    def __call__(self, src: int, dst: int, nbytes: int) -> tuple[float, float]:
        return self.at_round(src, dst, nbytes, 0)

    def at_round(self, src: int, dst: int, nbytes: int, round_idx: int,
                 now_s: float = 0.0) -> tuple[float, float]:
        rate, latency_ms = self.schedule.at(src, dst, round_idx, now_s)
        if rate == 0.0:
            raise LinkCut(f"a message of round {round_idx} from worker {src} to worker {dst}: "
                          "a partition cuts that link in that round")
        rates = [r for r in (rate, *self.caps(src, dst)) if r is not None]
        wire_s = nbytes * 8 / (min(rates) * 1e6) if rates else 0.0
        return wire_s, latency_ms / 1e3
