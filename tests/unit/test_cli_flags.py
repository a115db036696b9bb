"""CLI flags generated from the config tree: the table, help text, errors, and where values land.

Everything runs click in-process through the `config` command, which only resolves and prints
TOML, so nothing here trains or touches the network.
"""
from __future__ import annotations

import sys

import click
import pytest
from click.testing import CliRunner

from gasloc_emu import config as C
from gasloc_emu.commands import cli
from gasloc_emu.commands.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

ROWS = [*cli.FLAGS, *cli.RUN_FLAGS, *cli.SIM_FLAGS, *cli.CONSENSUS_FLAGS]
CHOICE_ROWS = [r for r in cli.FLAGS if C.setting_spec(r[1]).meta.get("choices")]
TYPED_ROWS = [r for r in cli.FLAGS if C.setting_spec(r[1]).hint in (int, float)
              and r[1] not in cli._PARSERS]

# Every flag spelling users had before the flags were generated; none may change.
TODAY_RUN = {"--config", "--algo", "--topology", "--workers", "-n", "--local-steps", "-H",
             "--rounds", "-R", "--model", "--seed", "--data", "--outer-lr", "--momentum", "--lr",
             "--degree", "--eval-every", "--bw-profile", "--shaper", "--rate-mbit",
             "--latency-ms", "--out", "--no-dashboard", "--set"}
# flags added since; a new flag is listed here on purpose
ADDED_RUN = {"--overwrite", "--compute-profile", "--step-time-s", "--inner-budget-s", "--scenario",
             "--link-trace", "--overlap", "--codec", "--codec-ratio", "--jitter-ms",
             "--loss-pct", "--delay", "--tcp-cc", "--placement", "--cloud-rate",
             "--cloud-missing", "--checkpoint-every", "--lr-schedule", "--warmup-steps",
             "--micro-batches", "--precision", "--compile", "--no-compile", "--time-scale"}
NODE_FLAGS = {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--nproc-per-node",
              "--secret-file"}  # run only: one node agent per host
TODAY_NET = {"--config", "--bw-profile", "--workers", "-n", "--rate-mbit", "--latency-ms",
             "--seed", "--shaper", "--set"}
ADDED_NET = {"--delay", "--placement", "--cloud-rate", "--cloud-missing"}


def invoke(args: list[str]):
    """Wide terminal, so help lines are not wrapped (click may break words at hyphens)."""
    return CliRunner().invoke(main, args, catch_exceptions=False, terminal_width=10_000)


def flat(text: str) -> str:
    return " ".join(text.split())


def toml_at(text: str, key: str):
    node = tomllib.loads(text)
    for part in key.split("."):
        node = node[part]
    return node


def command(*path: str) -> click.Command:
    cmd = main
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def option_strings(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


# ---------------------------------------------------------------- the table

@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_every_row_names_an_existing_key(row):
    flag, key, *short = row
    assert key in {s.key for s in C.setting_specs()}, key
    assert flag.startswith("--") and all(len(s) == 2 and s[0] == "-" for s in short)


def test_rows_are_unique_and_net_flags_come_from_the_table():
    flags = [r[0] for r in ROWS]
    keys = [r[1] for r in ROWS]
    assert len(flags) == len(set(flags)) and len(keys) == len(set(keys))
    assert set(cli.NET_FLAGS) <= {r[0] for r in cli.FLAGS}


@pytest.mark.parametrize("cmd,expected", [
    (("run",), TODAY_RUN | ADDED_RUN | NODE_FLAGS | {"--probe", "--no-probe", "--dry-run",
                                                     "--resume", "--require-faithful",
                                                     "--no-require-faithful"}),
    (("simulate",), TODAY_RUN | ADDED_RUN | {"--batched", "--no-batched", "--timing-only",
                                             "--no-timing-only", "--replay",
                                             "--resume"}),
    (("config",), TODAY_RUN | ADDED_RUN | {"--fields", "--plan", "--plan-json"}),
    (("netem", "show"), TODAY_NET | ADDED_NET),
    (("netem", "probe"), TODAY_NET | ADDED_NET | {"--topology", "--seconds"}),
])
def test_flag_spellings_did_not_change(cmd, expected):
    assert option_strings(command(*cmd)) - {"-h", "--help"} == expected


def test_any_setting_gets_a_flag_from_one_row():
    """The generator types every leaf of the tree, so adding a row is all a new flag needs
    (a table of free-form settings, ``algo.params``, is given key by key with --set)."""
    for spec in C.setting_specs():
        if spec.hint is C.Params:
            continue
        flag = "--" + spec.key.replace(".", "-").replace("_", "-")
        fn = cli._setting_option(flag, spec.key)(lambda **kw: None)
        param = click.command()(fn).params[0]
        assert param.help.startswith(spec.doc) and param.default is None


def test_a_row_of_an_untyped_kind_is_refused(monkeypatch):
    monkeypatch.setattr(cli, "_PARSERS", {})
    with pytest.raises(TypeError, match="algo.local_steps"):
        cli._setting_option("--local-steps", "algo.local_steps", "-H")


# ---------------------------------------------------------------- help text follows the tree

@pytest.mark.parametrize("cmd,rows", [
    (("run",), [*cli.FLAGS, *cli.RUN_FLAGS]),
    (("simulate",), [*cli.FLAGS, *cli.SIM_FLAGS]),
    (("netem", "show"), [r for r in cli.FLAGS if r[0] in cli.NET_FLAGS]),
    (("consensus",), [*(r for r in cli.FLAGS if r[0] in cli.CONSENSUS_SHARED),
                      *cli.CONSENSUS_FLAGS]),
])
def test_help_shows_each_flag_with_its_fields_doc(cmd, rows):
    """The drift test: hand-written help (the old way) fails it at the first reworded doc."""
    out = invoke([*cmd, "--help"])
    assert out.exit_code == 0
    text = flat(out.stdout)
    for flag, key, *short in rows:
        assert flag in text and all(s in text for s in short), flag
        assert flat(C.setting_spec(key).doc) in text, (flag, key)


def test_choices_come_from_the_tree():
    text = invoke(["run", "--help"]).stdout
    for flag, key, *_ in CHOICE_ROWS:
        assert f"{flag} [" + "|".join(C.setting_spec(key).meta["choices"]) + "]" in text, flag


@pytest.mark.parametrize("cmd", [("run",), ("simulate",), ("netem", "show"), ("netem", "probe")])
def test_bw_profile_help_lists_every_profile_name(cmd):
    text = flat(invoke([*cmd, "--help"]).stdout)
    helps = [p.help for p in command(*cmd).params if "--bw-profile" in p.opts]
    assert len(helps) == 1
    for name in C.BW_PROFILES:
        assert name in helps[0] and name in text, name
    assert "skewed-worker" in text


# ---------------------------------------------------------------- bad values

def assert_one_line_exit_2(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("row", CHOICE_ROWS, ids=[r[0] for r in CHOICE_ROWS])
@pytest.mark.parametrize("cmd", [["config"], ["run", "--dry-run"], ["simulate"]])
def test_a_bad_choice_exits_2_with_one_line(row, cmd):
    flag, key, *_ = row
    choices = C.setting_spec(key).meta["choices"]
    result = CliRunner().invoke(main, [*cmd, flag, "bogus"])
    assert_one_line_exit_2(result, key, "'bogus'", repr(choices[0]))


@pytest.mark.parametrize("row", TYPED_ROWS, ids=[r[0] for r in TYPED_ROWS])
def test_a_value_of_the_wrong_type_exits_2_with_one_line(row):
    flag, key, *_ = row
    result = CliRunner().invoke(main, ["config", flag, "many"])
    assert_one_line_exit_2(result, key, "'many'", C.setting_spec(key).hint.__name__)


def test_netem_show_rejects_a_bad_shaper_in_one_line():
    assert_one_line_exit_2(CliRunner().invoke(main, ["netem", "show", "--shaper", "tcp"]),
                           "net.shaper", "'tcp'")


# ---------------------------------------------------------------- config --fields

def test_config_fields_lists_every_key_with_its_flag_and_allowed_values():
    out = invoke(["config", "--fields"])
    assert out.exit_code == 0
    lines = {ln.split()[0]: ln for ln in out.stdout.splitlines()[1:]}
    assert set(lines) == {s.key for s in C.setting_specs()}
    for flag, key, *short in ROWS:
        assert flag in lines[key] and all(s in lines[key] for s in short), lines[key]
    assert "--no-dashboard" in lines["run.dashboard"]
    assert "[range: 1..4096]" in lines["workers"]
    assert "[names: gasloc, diloco, dsgd, local-gossip, a2cid2]" in lines["algo.name"]
    assert "skewed-worker" in lines["net.bw_profile"]
    assert lines["algo.inner.beta1"].split()[1] == "-"  # no flag: --set only


# ---------------------------------------------------------------- values land at their keys

def sample(key: str) -> tuple[str, object]:
    """A valid non-default command-line value of a setting and what the config must hold."""
    spec = C.setting_spec(key)
    special = {"algo.local_steps": ("3", 3), "algo.momentum": ("0.5", 0.5),
               "data.path": ("/tmp/x.txt", "/tmp/x.txt"), "net.bw_profile": ("skewed", "skewed"),
               "compute.profile": ("straggler", "straggler"),
               "run.scenario": ("/tmp/s.toml", "/tmp/s.toml"),
               "net.link_trace": ("/tmp/t.csv", "/tmp/t.csv"),
               "algo.name": ("diloco", "diloco"), "model.preset": ("small", "small"),
               "comm.codec": ("int8", "int8"), "net.placement": ("aws8", "aws8"),
               "net.shaper": ("userspace", "userspace"), "topology.name": ("torus", "torus")}
    if key in special:
        return special[key]
    if spec.meta.get("choices"):
        value = next(c for c in spec.meta["choices"] if c != spec.default)
        return value, value
    if spec.hint is int:
        return str(spec.default + 1), spec.default + 1
    lo, hi = spec.meta["lo"], spec.meta["hi"]
    value = lo + (hi - lo) / 4
    return repr(value), value


@pytest.mark.parametrize("row", cli.FLAGS, ids=[r[0] for r in cli.FLAGS])
def test_a_flag_lands_at_its_dotted_key(row):
    flag, key, *short = row
    if C.setting_spec(key).hint is bool:   # a --x/--no-x pair: the flag alone is the value
        out = invoke(["config", flag])
        assert out.exit_code == 0, out.stderr
        assert toml_at(out.stdout, key) is (not C.setting_spec(key).default)
        return
    raw, expected = sample(key)
    for spelled in (flag, *short):
        out = invoke(["config", spelled, raw])
        assert out.exit_code == 0, out.stderr
        got = toml_at(out.stdout, key)
        assert got == expected and got != C.setting_spec(key).default, (spelled, got)


def test_run_only_flags_and_special_flags_land_at_their_keys():
    assert cli.resolve_from_flags({"probe": False}).net.probe is False
    assert cli.resolve_from_flags({"probe": None}).net.probe is True
    assert cli.resolve_from_flags({"no_dashboard": True}).run.dashboard == "off"
    cfg = cli.resolve_from_flags({"workers": 3, "local_steps": "4,5,6", "momentum": "auto"})
    assert cfg.algo.local_steps == (4, 5, 6) and cfg.algo.momentum == "auto"


def test_precedence_defaults_file_flags_set(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("workers = 8\n[net]\nrate_mbit = 20.0\n")
    base = ["config", "--config", str(path)]
    for args, workers, rate in [
        ([], 8, 20.0),
        (["-n", "6"], 6, 20.0),
        (["-n", "6", "--set", "workers=2"], 2, 20.0),
        (["--rate-mbit", "7", "--set", "net.rate_mbit=9"], 8, 9.0),
    ]:
        out = invoke([*base, *args])
        assert out.exit_code == 0, out.stderr
        assert (toml_at(out.stdout, "workers"), toml_at(out.stdout, "net.rate_mbit")) \
            == (workers, rate), args
    default = invoke(["config"])
    assert toml_at(default.stdout, "workers") == C.Config().workers
