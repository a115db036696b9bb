"""The config tree: TOML round trip, precedence, validation messages, per-worker H."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gasloc_emu import config as C
from gasloc_emu.config import to_toml


def write(tmp_path, text: str, name: str = "cfg.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------- round trip

def test_defaults_resolve_to_the_default_config():
    assert C.resolve() == C.Config()
    cfg = C.Config()
    assert cfg.algo.name == "gasloc" and cfg.topology.name == "ring" and cfg.model.preset == "tiny"


def _rich_config() -> C.Config:
    return C.resolve(overrides={
        "seed": 17, "workers": 6, "algo.name": "local-gossip",
        "algo.local_steps": [3, 5, 7, 1, 2, 9], "algo.outer_lr": 0.35, "algo.momentum": "auto",
        "algo.alpha": 0.5, "algo.inner.lr": 3e-4, "algo.inner.weight_decay": 0.0,
        "topology.name": "matching2", "topology.base": "torus", "model.preset": "small",
        "model.n_layer": 3, "model.dropout": 0.1, "data.path": "/data/x.bin",
        "data.val_fraction": 0.125, "net.bw_profile": "skewed", "net.rate_mbit": 12.5,
        "net.probe": True, "net.mtu": 9000, "run.rounds": 123, "run.eval_every": 5,
        "run.heartbeat_timeout_s": 2.5, "run.dashboard": "off"})


@pytest.mark.parametrize("make", [C.Config, _rich_config])
def test_toml_round_trip(tmp_path, make):
    cfg = make()
    path = write(tmp_path, to_toml(cfg))
    back = C.resolve(path)
    assert back == cfg
    assert to_toml(back) == to_toml(cfg)


@pytest.mark.parametrize("text", ['say "hi"', r"C:\runs\new", "ünïcode ✓ 名前", "tab\there",
                                  "two\nlines", "bell\x07"])
def test_toml_round_trip_of_awkward_strings(tmp_path, text):
    """run.name and data.path are free text; whatever they hold must survive to_toml -> resolve."""
    cfg = C.resolve(overrides={"run.name": text, "data.path": text})
    back = C.resolve(write(tmp_path, to_toml(cfg)))
    assert back.run.name == text and back.data.path == text


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), workers=st.integers(1, 64),
       lr=st.floats(0.0, 10.0, allow_nan=False), momentum=st.one_of(st.just("auto"),
                                                                     st.floats(0.0, 0.999)),
       rate=st.floats(0.001, 100_000.0), name=st.sampled_from(C.ALGORITHMS))
def test_toml_round_trip_property(tmp_path_factory, seed, workers, lr, momentum, rate, name):
    assume(not (name == "diloco" and momentum == "auto"))  # rejected: DiLoCo has no graph
    cfg = C.resolve(overrides={"seed": seed, "workers": workers, "algo.outer_lr": lr,
                               "algo.momentum": momentum, "net.rate_mbit": rate, "algo.name": name})
    path = tmp_path_factory.mktemp("rt") / "c.toml"
    path.write_text(to_toml(cfg))
    assert C.resolve(path) == cfg


# ---------------------------------------------------------------- precedence

def test_precedence_defaults_file_flags_set(tmp_path):
    path = write(tmp_path, """
seed = 5
workers = 8
[algo]
outer_lr = 0.5
momentum = 0.8
[algo.inner]
lr = 0.002
[net]
rate_mbit = 20.0
""")
    from_file = C.resolve(path)
    assert (from_file.seed, from_file.workers, from_file.algo.outer_lr) == (5, 8, 0.5)
    assert from_file.algo.inner.lr == 0.002 and from_file.net.rate_mbit == 20.0
    assert from_file.algo.inner.beta1 == C.InnerConfig().beta1  # untouched default

    flags = {"workers": 6, "algo.outer_lr": 0.6, "algo.inner.lr": None}  # None = flag not given
    with_flags = C.resolve(path, flags)
    assert with_flags.workers == 6 and with_flags.algo.outer_lr == 0.6
    assert with_flags.algo.inner.lr == 0.002 and with_flags.seed == 5

    sets = ["workers=2", "algo.inner.lr=4e-4", "algo.momentum=auto", "net.probe=true"]
    final = C.resolve(path, flags, sets)
    assert final.workers == 2 and final.algo.inner.lr == 4e-4 and final.algo.momentum == "auto"
    assert final.net.probe is True
    assert final.algo.outer_lr == 0.6 and final.seed == 5 and final.net.rate_mbit == 20.0


def test_set_values_are_read_as_toml():
    cfg = C.resolve(sets=["workers=3", "algo.local_steps=[1, 2, 3]", "run.name=my run",
                          "algo.outer_lr=1", "data.path=/tmp/a b.txt"])
    assert cfg.algo.local_steps == (1, 2, 3)
    assert cfg.run.name == "my run" and cfg.data.path == "/tmp/a b.txt"
    assert isinstance(cfg.algo.outer_lr, float) and cfg.algo.outer_lr == 1.0


def test_sweep_table_in_a_preset_is_ignored(tmp_path):
    path = write(tmp_path, "workers = 4\n[sweep]\ntopology = ['ring', 'torus']\n")
    assert C.resolve(path).workers == 4


# ---------------------------------------------------------------- validation messages

@pytest.mark.parametrize("override,parts", [
    ({"algo.outer_lr": -1}, ["algo.outer_lr", "-1", "[0.0, 10.0]"]),
    ({"algo.inner.lr": -1}, ["algo.inner.lr", "-1", "[0.0, 10.0]"]),
    ({"net.rate_mbit": -5}, ["net.rate_mbit", "-5", "0.001"]),
    ({"run.rounds": -1}, ["run.rounds", "-1", "[1, "]),
    ({"algo.local_steps": -3}, ["algo.local_steps", "-3", "[0, "]),
    ({"workers": 0}, ["workers", "0", "[1, 4096]"]),
    ({"topology.name": "star"}, ["topology.name", "'star'", "'ring'", "'matching2'"]),
    ({"algo.momentum": 1.5}, ["algo.momentum", "1.5", "0.999", "auto"]),
    ({"algo.momentum": "fast"}, ["algo.momentum", "'fast'", "auto"]),
    ({"data.val_fraction": 0.9}, ["data.val_fraction", "0.9", "0.5"]),
    ({"net.loss_pct": float("nan")}, ["net.loss_pct", "nan"]),
    ({"workers": "four"}, ["workers", "'four'", "int"]),
    ({"workers": True}, ["workers", "True", "int"]),
    ({"algo.outer_lr": "fast"}, ["algo.outer_lr", "'fast'", "1-momentum"]),
])
def test_errors_name_key_value_and_allowed(override, parts):
    with pytest.raises(C.ConfigError) as info:
        C.resolve(overrides=override)
    msg = str(info.value)
    assert "\n" not in msg
    for part in parts:
        assert part in msg, (part, msg)


def test_unknown_keys_are_rejected_with_the_known_ones(tmp_path):
    with pytest.raises(C.ConfigError, match=r"unknown setting algo\.foo.*outer_lr"):
        C.resolve(sets=["algo.foo=1"])
    with pytest.raises(C.ConfigError, match=r"unknown setting net\.rate_mbits"):
        C.resolve(write(tmp_path, "[net]\nrate_mbits = 5.0\n"))
    with pytest.raises(C.ConfigError, match="unknown setting colour"):
        C.resolve(sets=["colour=1"])
    with pytest.raises(C.ConfigError, match="algo.inner"):
        C.resolve(sets=["algo.inner=1"])  # a section given a value


@pytest.mark.parametrize("item", ["noequals", "=5"])
def test_malformed_set_items(item):
    with pytest.raises(C.ConfigError, match="--set"):
        C.resolve(sets=[item])


def test_bad_config_files(tmp_path):
    with pytest.raises(C.ConfigError, match="does not exist"):
        C.resolve(tmp_path / "missing.toml")
    with pytest.raises(C.ConfigError, match="not valid TOML"):
        C.resolve(write(tmp_path, "workers = = 3\n"))


# ---------------------------------------------------------------- per-worker H, algorithm rules

def test_per_worker_local_steps():
    cfg = C.resolve(overrides={"workers": 3, "algo.local_steps": [10, 5, 1]})
    assert [cfg.algo.steps_for(r, 10) for r in range(3)] == [10, 5, 1]
    with pytest.raises(C.ConfigError, match=r"3 entries; expected one per worker \(4\)"):
        C.resolve(overrides={"workers": 4, "algo.local_steps": [10, 5, 1]})
    with pytest.raises(C.ConfigError, match=r"5 entries; expected one per worker \(4\)"):
        C.resolve(overrides={"workers": 4, "algo.local_steps": [1, 1, 1, 1, 1]})
    with pytest.raises(C.ConfigError, match="at least 1"):
        C.resolve(overrides={"workers": 2, "algo.local_steps": [3, 0]})
    with pytest.raises(C.ConfigError, match="algo.local_steps"):
        C.resolve(overrides={"workers": 2, "algo.local_steps": [3, -2]})
    with pytest.raises(C.ConfigError, match="algo.local_steps"):
        C.resolve(overrides={"workers": 2, "algo.local_steps": []})


def _steps(**overrides) -> tuple[int, ...]:
    """Each worker's H as the run plan derives it."""
    from gasloc_emu.plan import build_plan
    return build_plan(C.resolve(overrides=overrides), data=False).compute.fixed_steps


def test_default_local_steps_per_algorithm():
    for name, h in (("gasloc", 10), ("diloco", 10), ("local-gossip", 10), ("dsgd", 1)):
        assert _steps(**{"algo.name": name}) == (h,) * 4
    assert _steps(**{"algo.local_steps": 7}) == (7,) * 4


def test_dsgd_takes_one_step_per_communication():
    assert _steps(**{"algo.name": "dsgd", "algo.local_steps": 1}) == (1,) * 4
    with pytest.raises(C.ConfigError, match="dsgd.*local-gossip"):
        _steps(**{"algo.name": "dsgd", "algo.local_steps": 5})
    with pytest.raises(C.ConfigError, match="dsgd"):
        _steps(**{"algo.name": "dsgd", "workers": 2, "algo.local_steps": [1, 4]})


# ---------------------------------------------------------------- the tree itself

def _literal(v) -> str:
    """A TOML literal for a default value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, C.Params):
        return "{}"
    return repr(v)


def test_config_is_frozen_and_replace_validates():
    cfg = C.Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.workers = 3  # type: ignore[misc]
    other = C.replace(cfg, **{"algo.name": "dsgd", "algo.local_steps": 1, "workers": 8})
    assert (other.algo.name, other.workers, cfg.workers) == ("dsgd", 8, 4)
    with pytest.raises(C.ConfigError, match="workers"):
        C.replace(cfg, workers=-1)


def test_every_setting_is_documented():
    docs = C.field_docs()
    keys = [k for k, _, _ in docs]
    assert len(keys) == len(set(keys)) > 30
    for key, _, doc in docs:
        assert doc.strip(), f"{key} has no documentation"
    assert {"algo.inner.lr", "topology.degree", "net.rate_mbit", "run.rounds", "seed"} <= set(keys)
    # every documented key can be set through --set with its own default
    cfg = C.resolve(sets=[f"{k}={_literal(d)}" for k, d, _ in docs])
    assert cfg == C.Config()


def test_bw_profile_names_are_the_profiles_netem_builds():
    """config takes the names from netem (declared once), and its flag shows them."""
    from netem.profiles import NAMED
    assert C.BW_PROFILES is NAMED
    assert C.setting_spec("net.bw_profile").meta["names"] == NAMED


def test_setting_specs_describe_the_tree():
    specs = C.setting_specs()
    assert [(s.key, s.default, s.doc) for s in specs] == C.field_docs()
    assert C.setting_spec("algo.inner.lr").hint is float
    assert C.setting_spec("net.probe").hint is bool
    with pytest.raises(C.ConfigError, match="unknown setting algo.bogus"):
        C.setting_spec("algo.bogus")


@pytest.mark.parametrize("key,value,parts", [
    ("workers", "four", ["workers", "'four'", "int"]),
    ("net.rate_mbit", -5.0, ["net.rate_mbit", "-5.0", "0.001"]),
    ("algo.momentum", 1.5, ["algo.momentum", "0.999", "'auto'"]),
])
def test_check_setting_gives_the_set_message(key, value, parts):
    """Flags that click rejects reuse this, so every way of giving a setting fails alike."""
    with pytest.raises(C.ConfigError) as info:
        C.check_setting(key, value)
    for part in parts:
        assert part in str(info.value), (part, str(info.value))
    assert C.check_setting("workers", 3) == 3


def test_momentum_auto_times_a_factor_is_that_fraction_of_gamma_star():
    from gasloc_emu.algorithms import momentum_value
    from gasloc_emu.topology import Topology
    cfg = C.resolve(overrides={"workers": 8, "algo.momentum": "auto*0.5"})
    assert momentum_value(cfg.algo, Topology("ring", 8)) == pytest.approx(
        0.5 * Topology("ring", 8).gamma_star)
    for bad in ("auto*0", "auto*1.5", "auto*x", "auto0.5"):
        with pytest.raises(C.ConfigError, match="auto\\*F"):
            C.resolve(overrides={"algo.momentum": bad})
    with pytest.raises(C.ConfigError, match="needs a gossip graph"):
        _steps(**{"algo.name": "diloco", "algo.momentum": "auto*0.5"})
