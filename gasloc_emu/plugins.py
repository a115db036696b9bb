"""Finding what a user brings: an object named ``package.module:Name``, or a short name
registered by an installed package under an entry-point group (``gasloc_emu.algorithms``,
``gasloc_emu.models``; the built-in algorithms register the same way).

A name that does not resolve is one ``ConfigError`` line (exit 2 before anything starts),
naming what was asked, why it failed, and what is known.
"""
from __future__ import annotations

import functools
import importlib
from importlib import metadata
from typing import Any

from gasloc_emu.config import ConfigError


class PluginError(ConfigError):
    """A plugin that cannot be found, imported or used."""


def is_path(ref: str) -> bool:
    """``package.module:Name`` rather than a registered short name."""
    return ":" in ref


@functools.cache
def registered(group: str) -> dict[str, metadata.EntryPoint]:
    """The short names installed packages register under ``group``; the first one wins when
    two packages register the same name (entry points come in installation order)."""
    out: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=group):
        out.setdefault(ep.name, ep)
    return out


def load(ref: str, group: str, key: str, also: tuple[str, ...] = ()) -> Any:
    """The object ``ref`` names: ``package.module:Name`` or a name registered under ``group``.
    ``key``: the setting it came from; ``also``: the names the setting takes besides these
    (a model's presets), listed first when ``ref`` is none of them."""
    if is_path(ref):
        return _import(ref, key)
    ep = registered(group).get(ref)
    if ep is None:
        known = ", ".join([*also, *sorted(registered(group))]) or \
            "none (is gasloc-emu installed?)"
        raise PluginError(f"{key} = {ref!r} is not known; expected one of {known}, or "
                          "package.module:Name")
    return _import(ep.value, key)


def _import(path: str, key: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is the user's plugin's
        raise PluginError(f"{key} = {path!r}: module {module_name!r} did not import "
                          f"({type(exc).__name__}: {exc})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{key} = {path!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def origin(obj: Any) -> dict[str, str | None]:
    """Where an object comes from, for the run record: its ``module:qualname``, the installed
    distribution that ships its top-level package, and that distribution's version."""
    module = obj.__module__
    top = module.partition(".")[0]
    dist = _OWN_DISTRIBUTION if top == __package__ else _distribution(top)
    version = metadata.version(dist) if dist else None
    return {"object": f"{module}:{obj.__qualname__}", "package": dist, "version": version}


_OWN_DISTRIBUTION = "gasloc-emu"   # pyproject.toml's name: ours needs no scan of site-packages


def _distribution(top: str) -> str | None:
    """The installed distribution that ships the top-level package ``top`` (a scan of every
    installed distribution's file list: about 0.3 s)."""
    dists = metadata.packages_distributions().get(top) or [None]
    return dists[0]
