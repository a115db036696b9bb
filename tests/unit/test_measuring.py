"""``netem measure``'s checks before any byte is measured: which hosts it talks to, where the
file goes, and bad input as one line and exit 2."""
from __future__ import annotations

import pytest

from gasloc_emu.cluster.measuring import check_hosts, check_out, resolve_allowlist
from gasloc_emu.cluster.roles import ClusterError
from gasloc_emu.commands.cli import run_cli
from netem.measureplan import HostReport


def _report(node: int, addr: str) -> HostReport:
    return HostReport(node, f"h{node}", addr, 4000, "1", {}, 1)


def test_only_the_allowlisted_hosts_are_measured():
    reports = [_report(0, "198.18.0.1"), _report(1, "198.18.0.2")]
    assert check_hosts(reports, None) == {"198.18.0.1", "198.18.0.2"}
    assert check_hosts(reports, frozenset({"198.18.0.1", "198.18.0.2", "198.18.0.3"}))
    with pytest.raises(ClusterError, match=r"node 1 \(h1\) publishes address 198.18.0.2, "
                                           "which is not on --hosts"):
        check_hosts(reports, frozenset({"198.18.0.1"}))


def test_two_nodes_on_one_address_are_refused():
    with pytest.raises(ClusterError, match="nodes 0 and 1 both publish address 198.18.0.1"):
        check_hosts([_report(0, "198.18.0.1"), _report(1, "198.18.0.1")], None)


def test_the_allowlist_resolves_names_and_refuses_what_does_not_resolve():
    assert resolve_allowlist(["127.0.0.1", "localhost"]) >= {"127.0.0.1"}
    with pytest.raises(ClusterError, match="does not resolve"):
        resolve_allowlist(["no-such-host.invalid"])


def test_the_output_file(tmp_path):
    assert check_out(str(tmp_path / "p.json"), False) == tmp_path / "p.json"
    (tmp_path / "p.json").write_text("{}")
    with pytest.raises(ClusterError, match="exists; give --overwrite"):
        check_out(str(tmp_path / "p.json"), False)
    assert check_out(str(tmp_path / "p.json"), True)
    with pytest.raises(ClusterError, match=r"name it \*.json"):
        check_out(str(tmp_path / "p.toml"), False)


@pytest.mark.parametrize("argv, message", [
    (["--max-bytes-per-pair", "10"],
     "--max-bytes-per-pair = 10 is out of range; expected an integer in [65536, 68719476736]"),
    (["--max-seconds", "0.5"], "--max-seconds = 0.5 is out of range; expected a number in [1, "),
    ([], "needs at least 2 hosts"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setenv("GASLOC_SECRET", "a test secret, long enough")
    with pytest.raises(SystemExit) as code:
        run_cli(["netem", "measure", "--out", str(tmp_path / "p.json"), *argv])
    err = capsys.readouterr().err
    assert code.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
