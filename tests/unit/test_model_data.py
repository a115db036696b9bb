"""Model presets and the flat parameter buffer; corpora, disjoint shards, the shared eval set."""
from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
import torch

from gasloc_emu import config as C
from gasloc_emu.training import data as D
from gasloc_emu.training import model as M

# ---------------------------------------------------------------- model


def _meta_params(preset: str, **kw) -> int:
    with torch.device("meta"):
        net = M.GPT(M.shape_from_config(C.ModelConfig(preset=preset, **kw)))
    return net.num_params()


@pytest.mark.parametrize("preset,lo,hi", [("tiny", 0.08e6, 0.16e6), ("small", 0.8e6, 1.3e6),
                                          ("gpt2", 123.5e6, 125.5e6)])
def test_preset_sizes(preset, lo, hi):
    """tiny ~0.1M, small ~1M, gpt2 124M (counted on the meta device, nothing allocated)."""
    n = _meta_params(preset)
    assert lo <= n <= hi, f"{preset}: {n} parameters"


def test_gpt2_shape_and_exact_count():
    s = M.shape_from_config(C.ModelConfig(preset="gpt2"))
    assert (s.n_layer, s.n_head, s.n_embd, s.block_size, s.vocab_size) == (12, 12, 768, 1024, 50304)
    # 124M GPT-2 with tied embeddings: wte + wpe + 12 blocks + ln_f
    d, v, t = 768, 50304, 1024
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    assert _meta_params("gpt2") == v * d + t * d + 12 * block + 2 * d


def test_shape_overrides_and_bad_head_count():
    s = M.shape_from_config(C.ModelConfig(preset="tiny", n_layer=3, block_size=32))
    assert (s.n_layer, s.n_head, s.n_embd, s.block_size, s.vocab_size) == (3, 2, 64, 32, 256)
    with pytest.raises(ValueError, match="divisible"):
        M.shape_from_config(C.ModelConfig(preset="tiny", n_head=3))


def test_build_model_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    _, a = M.build_model(C.ModelConfig(), seed=7)
    assert torch.equal(torch.rand(3), expected_next)  # global RNG untouched
    _, b = M.build_model(C.ModelConfig(), seed=7)
    _, c = M.build_model(C.ModelConfig(), seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_flat_buffer_views_every_parameter():
    net, flat = M.build_model(C.ModelConfig(), seed=0)
    params = list(net.parameters())
    assert flat.dim() == 1 and flat.is_contiguous()
    assert flat.numel() == net.num_params() == sum(p.numel() for p in params)
    base, end = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
    spans = []
    for p in params:
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert base <= p.data_ptr() < end
        spans.append((p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()))
    spans.sort()
    assert all(a_end <= b for (_, a_end), (b, _) in pairwise(spans))  # no overlaps
    assert net.head.weight is net.wte.weight  # tied weights stay tied (one copy in the buffer)


def test_writing_the_flat_buffer_changes_the_model_and_back():
    net, flat = M.build_model(C.ModelConfig(), seed=0)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    net.eval()
    with torch.no_grad():
        before = net(x)[0].clone()
        flat.mul_(0.5)
        after = net(x)[0]
    assert not torch.allclose(before, after)
    # zeroing the buffer zeroes every parameter
    with torch.no_grad():
        flat.zero_()
    assert all(float(p.detach().abs().sum()) == 0.0 for p in net.parameters())
    # and an optimizer step on the parameters shows up in the buffer
    with torch.no_grad():
        flat.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
    snap = flat.clone()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net.train()
    _, loss = net(x, x)
    loss.backward()
    opt.step()
    assert not torch.equal(flat, snap)


def test_initial_loss_is_about_uniform():
    net, _ = M.build_model(C.ModelConfig(), seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (4, 64), generator=g)
    y = torch.randint(0, 256, (4, 64), generator=g)
    _, loss = net(x, y)
    assert abs(loss.item() - math.log(256)) < 0.1


# ---------------------------------------------------------------- data

def dcfg(**kw) -> C.DataConfig:
    return C.DataConfig(**kw)


def write_bin(path, tokens) -> str:
    np.asarray(tokens, dtype=np.uint16).tofile(path)
    return str(path)


def test_shards_are_disjoint_ranges(tmp_path):
    """Unique tokens 0..N-1: every worker's shard and every batch it draws stay in its own range."""
    total, workers, block = 40_000, 4, 16
    path = write_bin(tmp_path / "u.bin", np.arange(total))
    corpus = D.Corpus(dcfg(path=path, batch_size=8, val_fraction=0.1), block, 65536, workers,
                      seed=3)
    shards = [corpus.shard(r) for r in range(workers)]
    sets = [set(s.tokens.tolist()) for s in shards]
    val = set(corpus.val.tolist())
    part = corpus.train.size // workers
    for r, s in enumerate(sets):
        assert len(s) == part
        assert not (s & val)
        for q in range(r):
            assert not (s & sets[q]), f"shards {q} and {r} overlap"
    assert sum(len(s) for s in sets) + len(val) <= total
    assert len(val) == pytest.approx(0.1 * total, rel=0.01)
    ranges = sorted((min(s), max(s)) for s in sets)
    assert all(a[1] < b[0] for a, b in pairwise(ranges))
    for r, shard in enumerate(shards):
        for _ in range(5):
            x, y = shard.batch()
            assert x.shape == y.shape == (8, block) and x.dtype == torch.int64
            assert set(x.flatten().tolist()) | set(y.flatten().tolist()) <= sets[r]
            assert torch.equal(y[:, :-1], x[:, 1:])  # targets are the next tokens
            assert torch.equal(y[:, 0] - x[:, 0], torch.ones(8, dtype=torch.int64))


def test_shard_sample_order_is_seeded_per_worker(tmp_path):
    path = write_bin(tmp_path / "u.bin", np.arange(20_000))
    make = lambda seed: D.Corpus(dcfg(path=path), 16, 65536, 2, seed)  # noqa: E731
    a0, a0_again, a1 = make(1).shard(0), make(1).shard(0), make(1).shard(1)
    b0 = make(2).shard(0)
    xa = [a0.batch()[0] for _ in range(3)]
    assert all(torch.equal(x, a0_again.batch()[0]) for x in xa)
    offset = a1.tokens[0] - a0.tokens[0]
    assert not all(torch.equal(x + offset, a1.batch()[0]) for x in xa)  # not the same positions
    assert not all(torch.equal(x, b0.batch()[0]) for x in xa)


def test_split_interleaves_blocks_for_large_corpora():
    """Above 1/val_fraction blocks of 64 KiB, every k-th block is held out: a partition, spread
    out."""
    tokens = np.arange(1_500_000, dtype=np.int64)
    train, val = D.split_train_val(tokens, 0.1)
    hits = np.zeros(tokens.size, dtype=np.int64)
    np.add.at(hits, train, 1)
    np.add.at(hits, val, 1)
    assert (hits == 1).all()  # every token in exactly one split
    assert val.size == pytest.approx(0.1 * tokens.size, rel=0.2)
    assert val.min() < tokens.size // 2  # held-out blocks throughout, not only the tail
    assert (np.diff(train) > 0).all() and (np.diff(val) > 0).all()  # order kept


def test_eval_batches_identical_for_every_worker():
    """Separate Corpus objects (as separate worker processes build them) give the same eval set."""
    cfg = dcfg(max_corpus_mb=0.5, eval_batches=3, batch_size=4)
    corpora = [D.Corpus(cfg, 64, 256, 4, seed=11) for _ in range(2)]
    sets = [c.eval_batches() for c in corpora] + [corpora[0].eval_batches()]
    assert len(sets[0]) == 3
    for other in sets[1:]:
        for (x0, y0), (x1, y1) in zip(sets[0], other, strict=True):
            assert torch.equal(x0, x1) and torch.equal(y0, y1)
    val = set(corpora[0].val.tolist())
    assert set(sets[0][0][0].flatten().tolist()) <= val
    # a different run seed draws a different evaluation set
    other_seed = D.Corpus(cfg, 64, 256, 4, seed=12).eval_batches()
    assert not torch.equal(other_seed[0][0], sets[0][0][0])


def test_workers_share_the_eval_set_and_evaluate_the_same_model_alike():
    from gasloc_emu.plan import build_plan
    from gasloc_emu.simulator.memory import Hub
    from gasloc_emu.training.worker import Worker
    cfg = C.resolve(overrides={"workers": 2, "data.max_corpus_mb": 0.5, "data.eval_batches": 2})
    plan = build_plan(cfg)
    hub = Hub(2)
    w = [Worker(plan, r, hub.transport(r)) for r in range(2)]
    for (x0, y0), (x1, y1) in zip(w[0].eval_set, w[1].eval_set, strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert torch.equal(w[0].theta, w[1].theta)  # same init on every worker
    assert w[0].evaluate() == w[1].evaluate()
    assert not torch.equal(w[0].shard.batch()[0], w[1].shard.batch()[0])


def test_text_folder_loads_in_order_and_skips_binaries(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_bytes(b"second file\n")
    (tmp_path / "a.txt").write_bytes(b"first file\n")
    (tmp_path / "sub" / "c.md").write_bytes(b"third\n")
    (tmp_path / "blob.dat").write_bytes(b"\x00\x01\x02binary")
    tokens = D.load_tokens(str(tmp_path), 256, 1.0)
    assert tokens.dtype == np.uint8
    assert tokens.tobytes() == b"first file\nsecond file\nthird\n"
    one = D.load_tokens(str(tmp_path / "a.txt"), 256, 1.0)
    assert one.tobytes() == b"first file\n"


def test_text_cap_in_mib(tmp_path):
    (tmp_path / "big.txt").write_bytes(b"x" * 300_000)
    assert D.load_tokens(str(tmp_path), 256, 0.1).size == int(0.1 * (1 << 20))


def test_bin_token_file_loads(tmp_path):
    toks = np.array([0, 1, 500, 49_999, 7, 7, 3], dtype=np.uint16)
    out = D.load_tokens(write_bin(tmp_path / "t.bin", toks), 50_000, 8.0)
    assert out.dtype == np.uint16 and np.array_equal(np.asarray(out), toks)


def test_default_corpus_is_the_standard_library():
    tokens = D.load_tokens("", 256, 0.25)
    assert tokens.dtype == np.uint8 and tokens.size == int(0.25 * (1 << 20))
    text = tokens[:20_000].tobytes()
    assert b"def " in text or b"import " in text


def _bad_corpus(kind: str, p) -> str:
    if kind == "missing":
        return str(p / "missing.txt")
    if kind == "empty-text":
        (p / "empty.txt").write_bytes(b"")
        return str(p / "empty.txt")
    if kind == "empty-folder":
        (p / "emptydir").mkdir()
        return str(p / "emptydir")
    if kind == "empty-bin":
        (p / "empty.bin").write_bytes(b"")
        return str(p / "empty.bin")
    if kind == "odd-bin":
        (p / "odd.bin").write_bytes(b"\x01\x00\x02")
        return str(p / "odd.bin")
    assert kind == "vocab-bin"
    return write_bin(p / "big.bin", [1, 2, 300, 4])


@pytest.mark.parametrize("kind,match", [
    ("missing", "does not exist"), ("empty-text", "no tokens"), ("empty-folder", "no tokens"),
    ("empty-bin", "no tokens"), ("odd-bin", "odd"), ("vocab-bin", "300.*256"),
])
def test_bad_corpora_raise_data_error(tmp_path, kind, match):
    path = _bad_corpus(kind, tmp_path)
    with pytest.raises(D.DataError, match=match):
        D.load_tokens(path, 256, 8.0)


def test_corpus_errors(tmp_path):
    (tmp_path / "small.txt").write_bytes(b"hello world " * 10)
    with pytest.raises(D.DataError, match="too small"):
        D.Corpus(dcfg(path=str(tmp_path / "small.txt")), 64, 256, 4, seed=0)
    with pytest.raises(D.DataError, match="vocab_size >= 256"):
        D.load_tokens(str(tmp_path / "small.txt"), 100, 8.0)


def test_evaluate_is_mean_cross_entropy_and_restores_mode():
    net, _ = M.build_model(C.ModelConfig(), seed=0)
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randint(0, 256, (2, 32), generator=g),
                torch.randint(0, 256, (2, 32), generator=g)) for _ in range(3)]
    net.train()
    got = D.evaluate(net, batches)
    assert net.training
    with torch.no_grad():
        ref = np.mean([torch.nn.functional.cross_entropy(net(x)[0].reshape(-1, 256),
                                                         y.reshape(-1)).item() for x, y in batches])
    assert got == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("overrides", [{"model.preset": "tiny"}, {"model.preset": "small"},
                                       {"model.preset": "gpt2"},
                                       {"model.n_layer": 3, "model.n_embd": 96,
                                        "model.n_head": 3, "model.block_size": 32}])
def test_the_gpts_count_from_its_shape_is_the_modules_own(overrides):
    from gasloc_emu.training.model import _construct, count_parameters
    mcfg = C.resolve(overrides=overrides).model
    with torch.device("meta"):
        built = _construct(mcfg).num_params()
    assert count_parameters(mcfg) == built


def test_the_language_model_presets_default_to_english_and_tiny_to_python():
    small = D.build_corpus(C.resolve(overrides={"model.preset": "small", "workers": 2}))
    assert small.dcfg.path == "pydoc-topics" and small.describe()["source"] == "pydoc-topics"
    text = np.asarray(small.train[:5000]).tobytes()
    assert b" the " in text and b"statement" in text
    tiny = D.build_corpus(C.resolve(overrides={"workers": 2, "data.max_corpus_mb": 0.25}))
    named = D.build_corpus(C.resolve(overrides={"workers": 2, "data.max_corpus_mb": 0.25,
                                                "data.path": "stdlib"}))
    assert tiny.dcfg.path == "stdlib"
    assert np.array_equal(tiny.train, named.train)    # the name is the old empty default
    assert np.array_equal(tiny.train, D.split_train_val(D.load_tokens("", 256, 0.25),
                                                        0.05)[0])
