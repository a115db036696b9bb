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

    def dry_run_text(self) -> str:
        return f"# shaper: none ({self.reason}); nothing to create"

    def describe_summary(self) -> dict:
        return {"shaper": "none", "shaper_reason": self.reason, "bw_profile": self.cfg.net.bw_profile}

    def links_record(self, link_bytes: list[dict]) -> dict:
        return {"shaper": "none", "links": link_bytes}


@contextmanager
def open_network(cfg: Config, dry_run: bool = False):
    """The network of a run, undone on exit."""
    if not cfg.net.bw_profile or cfg.net.shaper == "none":
        reason = "shaper = none" if cfg.net.shaper == "none" else "no bandwidth profile"
        yield LoopbackNetwork(cfg, reason)
        return
    raise NotImplementedError("shaped networks arrive with the netem package")
