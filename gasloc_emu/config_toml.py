"""A resolved ``Config`` written back as TOML (run records, ``config --show``), read back by
``config.resolve`` to an equal Config."""
from __future__ import annotations

from typing import Any

from gasloc_emu.config import Config, to_dict


def _toml_char(c: str) -> str:
    """One character of a TOML basic string: quotes, backslashes and control codes escaped."""
    if c in '"\\':
        return "\\" + c
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\u{ord(c):04x}"
    return c


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + "".join(_toml_char(c) for c in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML that ``resolve(file=...)`` reads back to an equal Config."""
    lines: list[str] = []
    _emit_table(to_dict(cfg), "", lines)
    return "\n".join(lines).strip() + "\n"


def _emit_table(table: dict, name: str, lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    if name:
        lines.append(f"\n[{name}]")
    lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
    for k, v in table.items():
        if isinstance(v, dict):
            _emit_table(v, f"{name}.{k}" if name else k, lines)
