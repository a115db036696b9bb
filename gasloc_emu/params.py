"""``algo.params``: the one free-form table of the config tree, whose keys the algorithm's own
``Settings`` dataclass checks (``config.build_section``)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Params(Mapping):
    """A section of free-form settings (``algo.params``): a read-only, hashable mapping of
    TOML values, so the frozen config stays hashable. Whoever owns the keys validates them."""

    def __init__(self, items: Mapping[str, Any] | None = None):
        self._items = dict(sorted((items or {}).items()))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(repr(self._items))

    def __repr__(self) -> str:   # as the table reads in TOML and in ``config --fields``
        return repr(self._items)
