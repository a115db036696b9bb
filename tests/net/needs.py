"""What a net test does where this host cannot run it: skip, saying why, or fail in CI.

CI sets GASLOC_REQUIRE_NET=1 (``.ci/run``): there a missing namespace, tc or root is a broken
host, and a suite that skipped every network test would be green with no network coverage.
"""
from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_NET = "GASLOC_REQUIRE_NET"


def required() -> bool:
    return os.environ.get(REQUIRE_NET, "") not in ("", "0")


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it where GASLOC_REQUIRE_NET is set."""
    if required():
        pytest.fail(f"{REQUIRE_NET}={os.environ[REQUIRE_NET]} and this host cannot run the "
                    f"network tests: {reason}", pytrace=False)
    pytest.skip(reason)


def tc_or_unavailable(caps):
    """``caps`` when the tc shaper and user namespaces work here; else ``unavailable``."""
    missing = caps.tc_missing()
    if missing:
        unavailable(f"needs network namespaces and tc: {missing}")
    if not caps.userns:
        unavailable("needs network namespaces and tc: user namespaces are disabled "
                    "(`unshare -Urnm true` fails)")
    return caps


def root_or_unavailable() -> None:
    if os.geteuid() != 0:
        unavailable("root mode needs root")
