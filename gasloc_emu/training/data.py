"""Corpora, byte tokens, disjoint per-worker shards and the shared validation split.

The default corpus is the text of the running Python's standard library sources: real text that
exists on every machine, so nothing has to be downloaded. ``data.path`` may instead name a text
file, a folder of text files, a flat ``.bin`` file of uint16 tokens, or a corpus prepared by
``gasloc-emu data prepare`` (``tokens``: subword tokens, its own held-out split, memory-mapped).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gasloc_emu.training import corpora
from gasloc_emu.training import tokens as prepared
from gasloc_emu.training.model import default_corpus, shape_from_config

_SPLIT_BLOCK = 1 << 16  # the train/val split interleaves 64 KiB blocks, so both see every file kind


class DataError(ValueError):
    """The corpus is missing, empty or does not fit the model."""


def _read_files(files: list[Path], cap_bytes: int) -> np.ndarray:
    return np.frombuffer(corpora.read_files(files, cap_bytes), dtype=np.uint8)


def load_tokens(path: str, vocab_size: int, max_mb: float) -> np.ndarray:
    """All tokens of the corpus, as uint8 (bytes) or uint16 (token file). ``path``: empty
    (the standard library's sources), a built-in corpus's name (``corpora.CORPORA``: names win
    over files of the same name), a file or folder of text, or a ``.bin`` token file."""
    cap = int(max_mb * (1 << 20))
    if not path:
        tokens = _read_files(corpora.stdlib_files(), cap)
    elif path in corpora.CORPORA:   # a built-in corpus by name, as bytes
        try:
            tokens = np.frombuffer(corpora.CORPORA[path].raw(cap), dtype=np.uint8)
        except corpora.CorpusUnavailable as exc:
            raise DataError(str(exc)) from None
    else:
        p = Path(path)
        if not p.exists():
            raise DataError(f"data path {path!r} does not exist")
        if p.suffix == ".bin":
            tokens = _load_token_file(p, vocab_size)
        else:
            files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
            tokens = _read_files(files, cap)
    if tokens.size == 0:
        raise DataError(f"data path {path or '<stdlib>'!r} holds no tokens")
    if tokens.dtype == np.uint8 and vocab_size < 256:
        raise DataError(f"byte tokens need model.vocab_size >= 256; got {vocab_size}")
    return tokens


def _load_token_file(p: Path, vocab_size: int) -> np.ndarray:
    if p.stat().st_size == 0:
        return np.empty(0, dtype=np.uint16)  # reported as "holds no tokens" by the caller
    if p.stat().st_size % 2:
        raise DataError(f"token file {str(p)!r} has an odd size; expected flat uint16 tokens")
    tokens = np.memmap(p, dtype=np.uint16, mode="r")
    if tokens.size and int(tokens.max()) >= vocab_size:
        raise DataError(f"token file {str(p)!r} holds token {int(tokens.max())}, "
                        f"outside the model's vocabulary of {vocab_size} (set model.vocab_size)")
    return tokens


def split_train_val(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Every k-th 64 KiB block goes to validation (k = round(1/val_fraction)); the rest trains."""
    n_blocks = max(1, -(-tokens.size // _SPLIT_BLOCK))
    every = max(2, round(1 / val_fraction))
    if n_blocks < every:  # small corpus: hold out the tail instead
        cut = int(tokens.size * (1 - val_fraction))
        return tokens[:cut], tokens[cut:]
    blocks = np.array_split(np.asarray(tokens), n_blocks)
    val = [b for k, b in enumerate(blocks) if k % every == every - 1]
    train = [b for k, b in enumerate(blocks) if k % every != every - 1]
    return np.concatenate(train), np.concatenate(val)


@dataclass
class Shard:
    """A contiguous token range from which one worker samples random windows."""

    tokens: np.ndarray
    block_size: int
    batch_size: int
    generator: torch.Generator

    def batch(self, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        hi = self.tokens.size - self.block_size - 1
        starts = torch.randint(0, hi + 1, (self.batch_size,), generator=self.generator).numpy()
        idx = starts[:, None] + np.arange(self.block_size + 1)[None, :]
        seq = torch.from_numpy(self.tokens[idx].astype(np.int64))
        return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)


class Corpus:
    """The tokens of one run: train shards per worker and a fixed evaluation set."""

    def __init__(self, dcfg, block_size: int, vocab_size: int, workers: int, seed: int):
        self.header: prepared.TokenHeader | None = None
        if prepared.is_prepared(dcfg.path):   # memory maps of its own splits, read when sampled
            self.header, self.train, self.val = prepared.open_prepared(dcfg.path)
            if self.header.vocab_size > vocab_size:
                raise DataError(f"the corpus {dcfg.path!r} has {self.header.vocab_size} token "
                                f"ids, more than model.vocab_size = {vocab_size}")
        else:
            self.train, self.val = split_train_val(
                load_tokens(dcfg.path, vocab_size, dcfg.max_corpus_mb), dcfg.val_fraction)
        self.dcfg, self.block_size, self.workers, self.seed = dcfg, block_size, workers, seed
        need = block_size + 2
        if self.train.size // workers < need or self.val.size < need:
            raise DataError(f"corpus too small: {self.train.size} train and {self.val.size} "
                            f"validation tokens for {workers} shards of at least {need} tokens")

    def shard(self, rank: int) -> Shard:
        """Worker ``rank``'s disjoint slice of the training tokens, with its own sample order."""
        part = self.train.size // self.workers
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + rank + 1)
        return Shard(self.train[rank * part:(rank + 1) * part], self.block_size,
                     self.dcfg.batch_size, gen)

    def describe(self) -> dict:
        """The record's ``corpus`` block: where the tokens come from and how many there are."""
        out = {"source": self.dcfg.path or "stdlib", "train_tokens": int(self.train.size),
               "val_tokens": int(self.val.size)}
        if self.header is not None:
            out |= {"source": self.header.source, "prepared": self.dcfg.path,
                    "vocab_size": self.header.vocab_size, "tokenizer": self.header.tokenizer}
        return out

    def eval_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The same evaluation batches for every worker and every evaluation."""
        gen = torch.Generator().manual_seed(self.seed * 7919 + 12345)
        val = Shard(self.val, self.block_size, self.dcfg.batch_size, gen)
        return [val.batch() for _ in range(self.dcfg.eval_batches)]


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches, device: str | torch.device = "cpu") -> float:
    """Mean cross-entropy (nats per token) over fixed batches."""
    was_training = model.training
    model.eval()
    losses = [model(x.to(device), y.to(device))[1].item() for x, y in batches]
    model.train(was_training)
    return float(np.mean(losses))


def vocab_of(dcfg) -> int | None:
    """The vocabulary of a prepared corpus named by ``data.path`` (its header), else None."""
    return prepared.TokenHeader.read(prepared.folder_of(dcfg.path)).vocab_size \
        if prepared.is_prepared(dcfg.path) else None


def build_corpus(cfg) -> Corpus:
    """The corpus of a resolved ``Config``: token ids sized for its model, one shard per worker;
    an empty ``data.path`` reads the model preset's default corpus (``model.default_corpus``)."""
    shape = shape_from_config(cfg.model)
    dcfg = cfg.data if cfg.data.path else dataclasses.replace(
        cfg.data, path=default_corpus(cfg.model))
    return Corpus(dcfg, shape.block_size, shape.vocab_size, cfg.workers, cfg.seed)
