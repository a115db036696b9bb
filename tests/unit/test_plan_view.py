"""`gasloc-emu config --plan`: the derived plan, said as the run will be, under the settings."""
from __future__ import annotations

import json
import sys

from click.testing import CliRunner

from gasloc_emu import config as C
from gasloc_emu.commands.cli import main
from gasloc_emu.netplan import used_pairs
from gasloc_emu.plan import build_plan
from gasloc_emu.report.plan_view import MAX_LINK_ROWS, plan_lines

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _plan(settings: dict, sets=()):
    cfg = C.resolve(None, {}, [f"{k}={v}" for k, v in settings.items()] + list(sets))
    return cfg, build_plan(cfg, data=False)


def test_the_graph_links_and_compute_are_the_plans_own():
    cfg, plan = _plan({"workers": 8, "topology.name": "expander", "topology.degree": 2,
                       "net.bw_profile": "skewed", "net.latency_ms": 50.0},
                      ("net.delay=packet-line",))
    lines = plan_lines(plan.describe(), used_pairs(cfg, plan.topology))
    for rank, peers in enumerate(plan.topology.neighbors(0)):
        assert f"#   worker {rank:3d}: peers {peers}" in lines
    used = used_pairs(cfg, plan.topology)
    assert f"{len(used)} of 56 directed links carry training" in "\n".join(lines)
    src, dst = used[0]
    rate = plan.link_plan.effective_rate_mbit(src, dst)
    assert any(line.split()[1:4] == [str(src), str(dst), f"{rate:g}"] for line in lines)
    # TCP sees a 50 ms delay on the packet line: simulate times links by their TCP
    assert any(line.startswith("# simulate times messages by: TCP") for line in lines)
    assert "#   inner steps per round: 8 x 10" in lines


def test_the_fastest_graph_says_its_rule_and_bottleneck():
    cfg, plan = _plan({"workers": 8, "topology.name": "fastest", "topology.degree": 3,
                       "net.bw_profile": "cloud", "net.placement": "aws8"})
    lines = plan_lines(plan.describe(), used_pairs(cfg, plan.topology))
    assert "#   peers chosen by fastest: a spanning tree of greatest bottleneck under the " \
           "degree cap d = 3" in "\n".join(lines)
    assert f"#   slowest edge a round may use: {plan.topology.bottleneck_mbit():g} Mbit/s" in lines
    for rank, peers in enumerate(plan.topology.neighbors(0)):
        assert f"#   worker {rank:3d}: peers {peers}" in lines


def test_an_unshaped_run_says_so_and_simulate_predicts_no_network_time():
    cfg, plan = _plan({"workers": 4, "algo.name": "diloco"})
    lines = plan_lines(plan.describe(), used_pairs(cfg, plan.topology))
    assert "# graph: ring-allreduce (no gossip graph)" in lines
    assert "# links: unshaped (no bandwidth profile, or net.shaper = none)" in lines
    assert "# simulate times messages by: none: unshaped, simulate predicts no network time" \
        in lines
    assert "# scenario: none (every worker, every round, the links as above)" in lines


def test_a_scenarios_events_are_listed_by_round():
    cfg, plan = _plan({"workers": 8, "run.rounds": 30},
                      ("run.scenario=runs/scenarios/two-leave-one-returns.toml",))
    lines = plan_lines(plan.describe(), used_pairs(cfg, plan.topology))
    at = lines.index("# scenario: scenario two-leave-one-returns.toml, 3 events")
    assert lines[at + 1:at + 4] == ["#   round 10: worker 3 leaves",
                                    "#   round 10: worker 6 leaves",
                                    "#   round 20: worker 3 joins"]


def test_a_long_link_list_is_cut_and_says_how_many_are_left():
    cfg, plan = _plan({"workers": 12, "topology.name": "complete", "net.bw_profile": "uniform"})
    lines = plan_lines(plan.describe(), used_pairs(cfg, plan.topology))
    assert f"#   ... and {12 * 11 - MAX_LINK_ROWS} more (config --plan-json has all)" in lines


def test_the_command_keeps_the_settings_loadable_and_json_carries_both():
    args = ["config", "-n", "6", "--topology", "expander", "--degree", "2",
            "--bw-profile", "skewed"]
    text = CliRunner().invoke(main, [*args, "--plan"])
    assert text.exit_code == 0, text.output
    assert "# derived plan" in text.output
    assert tomllib.loads(text.output)["topology"]["name"] == "expander"  # comments only below
    raw = CliRunner().invoke(main, [*args, "--plan-json"])
    assert raw.exit_code == 0, raw.output
    both = json.loads(raw.output)
    assert both["settings"]["workers"] == 6
    assert both["plan"]["links"]["profile"] == "skewed"
    assert len(both["plan"]["topology"]["neighbours"]) == 6


def test_a_bad_setting_is_refused_as_run_would():
    res = CliRunner().invoke(main, ["config", "--plan", "-n", "6", "--set",
                                    "run.scenario=runs/scenarios/two-clusters-cut.toml"])
    assert res.exit_code == 2 and "worker 6 is not a worker of this run" in res.output


def test_the_time_scale_line_says_k_and_what_auto_picked_it_from(monkeypatch):
    from netem import capacity
    monkeypatch.setattr(capacity, "host_capacity",
                        lambda: capacity.Capacity(20_000.0, "measured", "test"))
    cfg, plan = _plan({"workers": 8, "topology.name": "expander", "topology.degree": 2,
                       "net.bw_profile": "uniform", "net.rate_mbit": 400.0,
                       "net.latency_ms": 10.0, "run.time_scale": "auto"},
                      ("net.delay=packet-line",))
    lines = plan_lines(plan.describe(), used_pairs(cfg, plan.topology))
    k = plan.time_scale
    assert k > 1
    assert f"# time scale: K = {k:g} (asked 'auto'): every rate / {k:g}, every delay, step " \
           f"time and timer x {k:g}; times reported are emulated (wall / K)" in lines
    auto = next(line for line in lines if line.startswith("#   auto: peak "))
    assert "against 50% of 20000 frames/s the line moves here (test)" in auto
    cfg, plan = _plan({"workers": 2})
    assert "# time scale: K = 1 (asked 1.0): as asked" in \
        plan_lines(plan.describe(), used_pairs(cfg, plan.topology))
