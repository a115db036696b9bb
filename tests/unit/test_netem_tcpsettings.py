"""TCP as a property of the link: settings, profile tables, the commands that set them."""
from __future__ import annotations

import json

import pytest

from gasloc_emu.config import ConfigError, NetConfig, TcpConfig, resolve
from netem.capabilities import CapabilityError, Decision
from netem.commands import NetTopology, check_supported, plan_commands, tcp_commands
from netem.profiles import ProfileError, build_link_plan
from netem.tcpsettings import (
    HOST_ENV,
    HostTcp,
    TcpSettings,
    TcpSettingsError,
    differences,
    effective,
    read_host,
    read_original_host,
    sysctl_writes,
)
from tests.unit.test_netem_capabilities import caps

HOST = HostTcp("bbr", ("reno", "bbr", "cubic"), ("reno", "bbr"), 1, (4096, 131072, 6291456),
               (4096, 16384, 4194304))
LINE = Decision("tc", "packet-line", "t", caps(netem=False))


def plan_of(tmp_path, text: str, workers: int = 3, **tcp):
    path = tmp_path / "p.toml"
    path.write_text(text)
    return build_link_plan(NetConfig(bw_profile=str(path)), workers, 0, tcp=TcpConfig(**tcp))


@pytest.mark.parametrize("kwargs, words", [
    ({"congestion_control": "vegas"}, "congestion_control = 'vegas' is not allowed; expected "
                                      "one of cubic, reno, bbr"),
    ({"slow_start_after_idle": 2}, "slow_start_after_idle = 2 is not allowed; expected 0, 1"),
    ({"rmem_max_bytes": 12}, r"rmem_max_bytes = 12 is out of range; expected an integer in "
                             r"\[4096, "),
    ({"init_cwnd": 5000}, r"init_cwnd = 5000 is out of range"),
])
def test_bad_settings_name_the_value_and_the_range(kwargs, words):
    with pytest.raises(TcpSettingsError, match=words):
        TcpSettings(**kwargs)


def test_the_config_section_refuses_what_the_kernel_words_do_not_allow():
    with pytest.raises(ConfigError, match="tcp.congestion_control = 'vegas' is not allowed"):
        resolve(overrides={"tcp": {"congestion_control": "vegas"}})
    cfg = resolve(overrides={"tcp": {"congestion_control": "cubic", "slow_start_after_idle": 0}})
    assert (cfg.tcp.congestion_control, cfg.tcp.slow_start_after_idle) == ("cubic", 0)


def test_a_profile_tcp_table_and_a_link_override(tmp_path):
    plan = plan_of(tmp_path, "[default]\nrate_mbit = 20\nlatency_ms = 25\n"
                             "[tcp]\ncongestion_control = 'cubic'\nslow_start_after_idle = 1\n"
                             "[[link]]\nsrc = 0\ndst = 2\ntcp = {congestion_control = 'bbr'}\n")
    assert plan.links[(0, 1)].tcp == TcpSettings("cubic", 1)
    assert plan.links[(0, 2)].tcp == TcpSettings("bbr", 1)
    # the run's tcp.* settings, where set, win over the profile's (A/B from the command line)
    plan = plan_of(tmp_path, "[tcp]\ncongestion_control = 'cubic'\n", congestion_control="reno")
    assert {link.tcp.congestion_control for link in plan.links.values()} == {"reno"}


def test_a_profile_tcp_table_with_an_unknown_key_is_one_line(tmp_path):
    with pytest.raises(ProfileError, match=r"\[tcp\]: unknown key 'cc'; allowed: "):
        plan_of(tmp_path, "[tcp]\ncc = 'cubic'\n")


def test_idle_restart_cannot_differ_between_the_links_of_one_sender(tmp_path):
    plan = plan_of(tmp_path, "[[link]]\nsrc = 0\ndst = 1\ntcp = {slow_start_after_idle = 0}\n")
    with pytest.raises(CapabilityError, match="worker 0's links ask for different "
                                              "slow_start_after_idle"):
        check_supported(plan, LINE, HOST)


def test_a_congestion_control_the_kernel_lacks_is_refused(tmp_path):
    plan = plan_of(tmp_path, "", congestion_control="cubic")
    host = HostTcp("bbr", ("reno", "bbr"), ("reno", "bbr"), 1, (), ())
    with pytest.raises(CapabilityError, match="'cubic' is not in this kernel .*reno, bbr"):
        plan_commands(plan, NetTopology("ab", 3), LINE, host_tcp=host)


def test_commands_set_sysctls_per_namespace_and_congestion_control_per_route(tmp_path):
    plan = plan_of(tmp_path, "[[link]]\nsrc = 0\ndst = 2\ntcp = {congestion_control = 'bbr'}\n",
                   congestion_control="cubic", slow_start_after_idle=0, wmem_max_bytes=8 << 20,
                   init_cwnd=20)
    topo = NetTopology("ab", 3)
    cmds = [str(c) for c in tcp_commands(plan, topo, 0, HOST)]
    assert cmds[0] == ("ip netns exec glab-w0 sh -c 'printf '\"'\"'%s\\n'\"'\"' '\"'\"'0'\"'\"' > "
                       "/proc/sys/net/ipv4/tcp_slow_start_after_idle'")
    assert "tcp_wmem" in cmds[1] and "4096 16384 8388608" in cmds[1]
    # cubic is not in this host's allowed list, so not a namespace default: a route attribute
    assert cmds[2] == ("ip -n glab-w0 route replace 198.18.0.0/15 dev eth0 initcwnd 20 initrwnd "
                       "20 congctl cubic")
    assert cmds[3] == ("ip -n glab-w0 route replace 198.18.0.3/32 dev eth0 initcwnd 20 initrwnd "
                       "20 congctl bbr")
    assert len(cmds) == 4
    assert tcp_commands(plan_of(tmp_path, ""), topo, 0, HOST) == []   # nothing asked: nothing


def test_the_plan_runs_the_tcp_commands_only_when_asked(tmp_path):
    topo = NetTopology("ab", 3)
    plain = [str(c) for c in plan_commands(plan_of(tmp_path, ""), topo, LINE, host_tcp=HOST)]
    asked = [str(c) for c in plan_commands(plan_of(tmp_path, "", congestion_control="reno"),
                                           topo, LINE, host_tcp=HOST)]
    assert not any("congctl" in c for c in plain)
    assert sum("congctl reno" in c for c in asked) == 3


def test_sysctl_values_keep_the_hosts_minimum_and_default():
    writes = dict(sysctl_writes(TcpSettings(rmem_max_bytes=65536), HOST))
    assert writes == {"tcp_rmem": "4096 65536 65536"}


def test_effective_settings_of_a_new_namespace():
    eff = effective(TcpSettings(), HOST)
    assert eff == {"congestion_control": "bbr", "slow_start_after_idle": 1,
                   "rmem_max_bytes": 6291456, "wmem_max_bytes": 4194304, "init_cwnd": 10}
    assert effective(TcpSettings("cubic", 0), HOST)["congestion_control"] == "cubic"


def test_differences_say_what_a_host_without_namespaces_does_not_have():
    rows = differences([TcpSettings("cubic", 0)], HOST)
    assert {r["setting"]: (r["asked"], r["host"]) for r in rows} == {
        "congestion_control": ("cubic", "bbr"), "slow_start_after_idle": (0, 1)}
    assert differences([TcpSettings("bbr")], HOST) == []


def test_the_host_snapshot_survives_the_reexec_and_is_not_trusted_beyond_its_types():
    snap = json.dumps(HOST.as_dict())
    assert read_original_host({HOST_ENV: snap}) == HOST
    assert read_original_host({HOST_ENV: '{"congestion_control": 3}'}) == read_host()
    assert read_original_host({}) == read_host()


def test_this_host_is_read():
    host = read_host()
    assert host.congestion_control in host.available
    assert host.slow_start_after_idle in (0, 1)
