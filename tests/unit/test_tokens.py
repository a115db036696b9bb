"""`gasloc-emu data prepare`: a BPE tokenizer trained on a local corpus, memory-mapped token
files with a held-out split and a header, workers' disjoint shards read by memmap, the model's
vocabulary following the tokenizer's, perplexity in the summary."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tokenizers  # noqa: F401  (the test extra has it: missing is an error, not a skip)
from click.testing import CliRunner

from gasloc_emu import config as C
from gasloc_emu.commands.cli import main
from gasloc_emu.training import tokens as T
from gasloc_emu.training.corpora import CORPORA


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "pydoc"
    head = T.prepare("pydoc-topics", out, vocab_size=512, val_fraction=0.05, max_mb=0.1)
    return out, head


def test_the_header_matches_the_files(prepared):
    out, head = prepared
    assert head.vocab_size == 512 and head.dtype == "uint16" and head.source == "pydoc-topics"
    assert head.source_chars == int(0.1 * (1 << 20))
    for split, name in T.FILES.items():
        assert (out / name).stat().st_size == 2 * head.tokens[split] > 0
    assert json.loads((out / "meta.json").read_text())["tokens"] == head.tokens
    assert T.verify(str(out)) == []
    assert head.tokens["val"] / sum(head.tokens.values()) == pytest.approx(0.05, abs=0.02)


def test_the_tokenizer_beside_the_tokens_decodes_them(prepared):
    from tokenizers import Tokenizer
    out, head = prepared
    tok = Tokenizer.from_file(str(out / head.tokenizer))
    _, train, _ = T.open_prepared(str(out))
    text = tok.decode(np.asarray(train[:200]).tolist())
    first = CORPORA["pydoc-topics"].documents()[0]
    assert first.startswith(text[:100]) and len(text) > 200  # subwords: > 1 character a token
    assert int(np.asarray(train).max()) < head.vocab_size


def test_preparing_is_deterministic(prepared, tmp_path):
    _, head = prepared
    again = T.prepare("pydoc-topics", tmp_path / "again", vocab_size=512, max_mb=0.1)
    assert again.sha256 == head.sha256


def test_damaged_files_are_refused(prepared, tmp_path):
    out, _ = prepared
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in out.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "val.bin").write_bytes((bad / "val.bin").read_bytes()[:-2])
    with pytest.raises(T.TokenError, match="expected .* uint16 tokens"):
        T.open_prepared(str(bad))
    raw = bytearray((bad / "train.bin").read_bytes())
    raw[0] ^= 1
    (bad / "train.bin").write_bytes(bytes(raw))
    assert T.verify(str(bad)) == ["train.bin", "val.bin"]


def test_workers_read_disjoint_memmapped_shards_and_the_model_follows(prepared):
    from gasloc_emu.plan import build_plan
    out, head = prepared
    cfg = C.resolve(overrides={"workers": 3, "data.path": str(out), "data.eval_batches": 1})
    plan = build_plan(cfg)
    assert plan.cfg.model.vocab_size == head.vocab_size          # followed, not the preset's
    corpus = plan.corpus
    assert isinstance(corpus.train, np.memmap) and isinstance(corpus.val, np.memmap)
    shards = [corpus.shard(r).tokens for r in range(3)]
    assert all(isinstance(s, np.memmap) for s in shards)       # views, nothing loaded
    base = corpus.train.__array_interface__["data"][0]
    starts = [(s.__array_interface__["data"][0] - base) // 2 for s in shards]
    assert starts == [r * (corpus.train.size // 3) for r in range(3)]    # disjoint slices
    assert not any(np.shares_memory(a, b) for a, b in zip(shards, shards[1:], strict=False))
    assert corpus.describe()["vocab_size"] == head.vocab_size
    with pytest.raises(C.ConfigError, match="smaller than the tokenizer's 512"):
        build_plan(C.replace(cfg, **{"model.vocab_size": 300}), data=False)
    assert build_plan(C.replace(cfg, **{"model.vocab_size": 640}), data=False) \
        .cfg.model.vocab_size == 640                             # padded: kept


def test_a_run_on_prepared_tokens_reports_perplexity(prepared, tmp_path):
    out, _ = prepared
    got = CliRunner().invoke(main, [
        "simulate", "--workers", "2", "--model", "tiny", "--data", str(out), "--rounds", "2",
        "--local-steps", "2", "--no-dashboard", "--step-time-s", "0.01",
        "--set", "data.eval_batches=1", "--out", str(tmp_path / "run")])
    assert got.exit_code == 0, got.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_perplexity"] == pytest.approx(math.exp(summary["final_eval_loss"]))
    assert summary["corpus"]["vocab_size"] == 512
    assert f"perplexity {summary['final_perplexity']:.4f}" in got.output
    assert math.log(512) - 0.5 < summary["final_eval_loss"] < math.log(512) + 0.5


def test_prepare_refusals_are_one_line(prepared, tmp_path, monkeypatch):
    out, _ = prepared
    run = CliRunner().invoke
    for args, words in [(["--out", str(out)], "already holds a prepared corpus"),
                        (["--out", str(tmp_path / "x"), "--vocab-size", "100"], "out of range"),
                        (["--out", str(tmp_path / "y"), "--corpus", str(tmp_path / "none")],
                         "neither a file, a folder nor one of")]:
        got = run(main, ["data", "prepare", *args])
        assert got.exit_code == 2 and words in got.output, got.output
        assert got.output.count("\n") == 1
    import builtins
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **kw: (
        (_ for _ in ()).throw(ImportError(name)) if name == "tokenizers" else
        real(name, *a, **kw)))
    with pytest.raises(T.TokenError, match=r"pip install 'gasloc-emu\[tokens\]'"):
        T.train_tokenizer(["some text"], 300)


def test_a_text_folder_is_a_corpus_of_its_files(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("the quick brown fox " * 400)
    (tmp_path / "src" / "b.bin").write_bytes(b"\0\1binary")
    assert T.documents(str(tmp_path / "src")) == ["the quick brown fox " * 400]
    head = T.prepare(str(tmp_path / "src"), tmp_path / "out", vocab_size=300)
    assert head.documents == 1 and head.source == str((tmp_path / "src").resolve())
