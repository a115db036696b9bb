"""Which class an ``algo.name`` means, and its settings: the one path for built-ins and plugins.

``algo.name`` is a name registered under the entry-point group ``gasloc_emu.algorithms`` (the
five built-ins are registered by this package's own pyproject.toml) or ``package.module:Class``.
The class must subclass one kind's base (``OuterAlgorithm`` for rounds, ``PairwiseAlgorithm``
for asynchronous pairwise exchanges); its ``Settings`` dataclass validates
``algo.params`` exactly as the config tree validates its sections.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from gasloc_emu import plugins
from gasloc_emu.algorithms.base import Algorithm, OuterAlgorithm, PairwiseAlgorithm
from gasloc_emu.config import ConfigError, build_section

GROUP = "gasloc_emu.algorithms"


@functools.cache
def load(name: str) -> type[Algorithm]:
    """The algorithm class ``name`` means (a one-line ``ConfigError`` when it means none)."""
    cls = plugins.load(name, GROUP, "algo.name")
    if not (isinstance(cls, type) and issubclass(cls, (OuterAlgorithm, PairwiseAlgorithm))):
        raise plugins.PluginError(f"algo.name = {name!r} is {cls!r}, not a subclass of "
                                  "gasloc_emu.algorithms.OuterAlgorithm (or PairwiseAlgorithm)")
    if not dataclasses.is_dataclass(cls.Settings):
        raise plugins.PluginError(f"algo.name = {name!r}: its Settings ({cls.Settings!r}) is not "
                                  "a dataclass")
    return cls


def known() -> list[str]:
    """The registered short names."""
    return sorted(plugins.registered(GROUP))


@dataclass(frozen=True)
class Resolved:
    """An algorithm with its settings checked: the class, and its ``Settings`` instance."""

    cls: type[Algorithm]
    params: Any

    def record(self) -> dict[str, Any]:
        """The record's ``algorithm`` block: the name, where it came from, its settings."""
        return {"name": self.cls.name, **plugins.origin(self.cls),
                "params": dataclasses.asdict(self.params)}


def resolve(acfg) -> Resolved:
    """``algo.name`` and ``algo.params`` as a class and its settings, with every rule the
    algorithm states about the shared ``algo.*`` settings checked (a ``ConfigError`` each)."""
    cls = load(acfg.name)
    params = build_section(cls.Settings, dict(acfg.params), "algo.params.")
    why = cls.check_settings(acfg, params)
    if why:
        raise ConfigError(why)
    return Resolved(cls, params)
