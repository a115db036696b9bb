"""Where this host cannot run the network tests, they skip, and fail where GASLOC_REQUIRE_NET=1
(CI): a CI host that lost namespaces or tc goes red. Nothing here needs namespaces."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest

from netem.capabilities import TC_REQUIRED, Capabilities

REPO = Path(__file__).resolve().parents[2]
NO_TC = Capabilities(root=False, in_userns=False, userns=False, tools=("unshare",),
                     probed_with="")
NO_USERNS = Capabilities(root=True, in_userns=False, userns=False,
                         tools=("ip", "tc", "unshare", "mount"), probed_with="unshare",
                         features=dict.fromkeys(TC_REQUIRED, True))


def _outcome(call) -> tuple[str, str]:
    """("skip" or "fail", message) of a call that must end the test one of those two ways (caught
    here: a skip escaping pytest.raises would skip this test instead of failing it)."""
    try:
        call()
    except pytest.skip.Exception as exc:
        return "skip", str(exc)
    except pytest.fail.Exception as exc:
        return "fail", str(exc)
    return "returned", ""


@pytest.mark.parametrize("caps, reason", [(NO_TC, "the ip and tc programs"),
                                          (NO_USERNS, "user namespaces are disabled")])
def test_missing_namespaces_or_tc_skip_here_and_fail_where_required(monkeypatch, caps, reason):
    monkeypatch.delenv(needs.REQUIRE_NET, raising=False)
    kind, message = _outcome(lambda: needs.tc_or_unavailable(caps))
    assert kind == "skip" and reason in message, (kind, message)
    monkeypatch.setenv(needs.REQUIRE_NET, "1")
    kind, message = _outcome(lambda: needs.tc_or_unavailable(caps))
    assert kind == "fail" and message.startswith("GASLOC_REQUIRE_NET=1 ") and reason in message, \
        (kind, message)


def test_root_mode_as_another_user_skips_here_and_fails_where_required(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv(needs.REQUIRE_NET, "0")   # "0" is the same as unset
    assert _outcome(needs.root_or_unavailable) == ("skip", "root mode needs root")
    monkeypatch.setenv(needs.REQUIRE_NET, "1")
    kind, message = _outcome(needs.root_or_unavailable)
    assert kind == "fail" and message.endswith("root mode needs root"), (kind, message)


NO_NET_PLUGIN = """
import netem.capabilities as C
NO_NET = C.Capabilities(root=False, in_userns=False, userns=False, tools=(), probed_with="")
C.probe = lambda: NO_NET   # before tests/net/conftest.py imports it
"""


@pytest.mark.parametrize("require", ["", "1"])
def test_a_net_test_on_a_host_without_namespaces_fails_where_required(tmp_path, require):
    """The tc_caps fixture end to end: a real net test, in a pytest whose probe finds neither
    namespaces nor tc, is skipped, or failed under GASLOC_REQUIRE_NET=1."""
    (tmp_path / "no_net.py").write_text(NO_NET_PLUGIN)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
                        needs.REQUIRE_NET: require}
    test = "tests/net/test_run_shaped.py::test_expander_under_skewed_completes_and_records_links"
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no_net", "-p", "no:cacheprovider",
                          "-q", "-rsf", test], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    if require:
        assert res.returncode == 1 and "1 error" in res.stdout, res.stdout
        assert "GASLOC_REQUIRE_NET=1 and this host cannot run the network tests: needs network " \
               "namespaces and tc: the ip and tc programs (iproute2) are not installed" \
               in res.stdout, res.stdout
    else:
        assert res.returncode == 0 and "1 skipped" in res.stdout, res.stdout
