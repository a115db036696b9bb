"""Where the launcher meets the network: which address each worker binds, how it is started,
and what goes into the run record about links. The shaping itself lives in the netem package.
"""
from __future__ import annotations

from contextlib import contextmanager

from .config import Config


class LoopbackNetwork:
    """Unshaped: every worker binds an ephemeral port on 127.0.0.1 and starts as it is."""

    shaper = "none"

    def __init__(self, cfg: Config, reason: str = "no bandwidth profile"):
        self.cfg, self.reason = cfg, reason

    def bind_address(self, rank: int) -> str:
        return "tcp://127.0.0.1:0"  # the worker reports the port it got

    def wrap(self, rank: int, argv: list[str]) -> list[str]:
        return argv

    def shaping_spec(self) -> dict | None:
        return None

    def configured_mbit(self, src: int, dst: int) -> float | None:
        return None

    def dry_run_text(self) -> str:
        return f"# shaper: none ({self.reason}); nothing to create"

    def describe_summary(self) -> dict:
        return {"shaper": "none", "shaper_reason": self.reason,
                "bw_profile": self.cfg.net.bw_profile}

    def links_record(self, link_bytes: list[dict]) -> dict:
        return {"shaper": "none", "links": link_bytes}


class ShapedNetwork:
    """A run over the netem package's network: tc in namespaces, or the userspace shaper."""

    def __init__(self, cfg: Config, session):
        self.cfg, self.session = cfg, session
        self.shaper = session.decision.shaper
        self.probe_rows: list[dict] = []

    def bind_address(self, rank: int) -> str:
        return self.session.bind_address(rank)

    def wrap(self, rank: int, argv: list[str]) -> list[str]:
        return self.session.wrap(rank, argv)

    def shaping_spec(self) -> dict | None:
        return self.session.shaping_spec()

    def configured_mbit(self, src: int, dst: int) -> float | None:
        return self.session.plan.effective_rate_mbit(src, dst)

    def dry_run_text(self) -> str:
        return self.session.dry_run_text()

    def probe(self, pairs: list[tuple[int, int]]) -> list[dict]:
        """Measure the links training will use; rows of configured vs measured."""
        from netem.probe import probe_links
        self.probe_rows = probe_links(self.session, pairs)
        return self.probe_rows

    def describe_summary(self) -> dict:
        d = self.session.decision
        return {"shaper": d.shaper, "shaper_reason": d.reason, "delay": d.delay,
                "netns_mode": self.session.mode, "bw_profile": self.cfg.net.bw_profile,
                "profile": self.session.plan.profile}

    def links_record(self, link_bytes: list[dict]) -> dict:
        """Configured vs measured per directed link, with the bytes training moved on it."""
        plan, sent = self.session.plan, {(r["src"], r["dst"]): r["bytes"] for r in link_bytes}
        probed = {(r["src"], r["dst"]): r for r in self.probe_rows}
        rows = []
        for (src, dst), link in sorted(plan.links.items()):
            if (src, dst) not in sent and (src, dst) not in probed:
                continue
            row = {"src": src, "dst": dst, "configured_mbit": plan.effective_rate_mbit(src, dst),
                   "configured_latency_ms": link.latency_ms, "bytes": sent.get((src, dst), 0)}
            rows.append(row | {k: v for k, v in probed.get((src, dst), {}).items() if k not in row})
        return {"shaper": self.shaper, "network": self.session.describe(include_commands=False),
                "links": rows}


def used_pairs(cfg: Config, topo) -> list[tuple[int, int]]:
    """Directed links training will use: ring successors for DiLoCo, graph edges otherwise."""
    n = cfg.workers
    if topo is None:
        return sorted({(k, (k + 1) % n) for k in range(n) if n > 1})
    edges = topo.possible_edges
    return sorted({(a, b) for a, b in edges} | {(b, a) for a, b in edges})


def shaping_decision(cfg: Config):
    """(link plan, shaper decision) for a shaped run; raises before anything is created."""
    from netem.capabilities import choose_shaper, probe
    from netem.profiles import build_link_plan
    plan = build_link_plan(cfg.net, cfg.workers, cfg.seed)
    return plan, choose_shaper(cfg.net.shaper, probe())


def shaped(cfg: Config) -> bool:
    return bool(cfg.net.bw_profile) and cfg.net.shaper != "none"


def check_network(cfg: Config) -> None:
    """Refuse network settings that would be recorded but not applied.

    The profile is built (so a broken profile file fails) whether or not a shaper will run;
    a profile, latency, jitter or loss with ``net.shaper = none`` is an error, since the run
    record would state a network the workers never saw.
    """
    from netem.profiles import ProfileError, build_link_plan  # netem's own checks, no machinery
    build_link_plan(cfg.net, cfg.workers, cfg.seed)
    if cfg.net.shaper != "none":
        return
    given = [f"net.{k} = {getattr(cfg.net, k)!r}" for k in ("bw_profile", "latency_ms",
                                                              "jitter_ms", "loss_pct")
             if getattr(cfg.net, k)]
    if given:
        raise ProfileError(f"{', '.join(given)} with net.shaper = 'none' would not be applied; "
                           "drop it, or choose a shaper (auto, tc or userspace)")


def sim_link_model(cfg: Config):
    """The simulator's link model from the bandwidth profile, or None when unshaped.

    Unshaped means what it means for ``run``: no profile, or ``net.shaper = none``; the virtual
    clock then predicts nothing, as the emulator then shapes nothing.
    """
    if not shaped(cfg):
        return None
    from netem.profiles import build_link_plan  # netem loads only for shaped runs
    return build_link_plan(cfg.net, cfg.workers, cfg.seed).link_model()


def enter_userns_if_needed(cfg: Config, argv: list[str], dry_run: bool) -> None:
    """Re-exec the launcher in its own user + network + mount namespace when tc will shape.

    Everything the run builds then lives in that namespace and vanishes with the launcher, even
    on kill -9. Where user namespaces do not work, root builds run-prefixed names instead
    (``gasloc-emu netem clean`` removes leftovers); otherwise the userspace shaper is used.
    """
    if dry_run or not shaped(cfg):
        return
    _, decision = shaping_decision(cfg)
    if decision.shaper == "tc":
        from netem.namespaces import reexec_in_userns
        reexec_in_userns(argv)  # returns only when already inside, or when userns is unavailable


@contextmanager
def open_network(cfg: Config, dry_run: bool = False):
    """The network of a run, undone on exit."""
    if not shaped(cfg):
        reason = "shaper = none" if cfg.net.shaper == "none" else "no bandwidth profile"
        yield LoopbackNetwork(cfg, reason)
        return
    from netem.namespaces import NetworkSession
    plan, decision = shaping_decision(cfg)
    with NetworkSession(plan, decision, dry_run=dry_run) as session:
        yield ShapedNetwork(cfg, session)
