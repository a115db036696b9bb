"""Tokenised corpora: a subword tokenizer trained here on a local text corpus, the corpus written
as flat memory-mapped token files with a held-out split, and a small JSON header
(``gasloc-emu data prepare``; docs/RECIPE.md, "Tokenised data").

The tokenizer is HuggingFace ``tokenizers``' byte-level BPE (GPT-2's scheme: Radford et al.
2019, section 2.2), trained on the corpus itself, so nothing is downloaded; it is saved beside
the tokens (``tokenizer.json``) so the ids can be decoded again. A prepared folder holds::

    meta.json        TokenHeader: vocabulary, dtype, files, source, counts, SHA-256 of each file
    tokenizer.json   the trained tokenizer
    train.bin        the training tokens, flat uint16 (uint32 above 65536 ids)
    val.bin          the held-out tokens

Workers open both files with ``numpy.memmap`` and read only the windows they sample, so the
corpus is never loaded whole; each worker's shard is a disjoint slice of train.bin
(``data.Corpus.shard``). ``data.path`` names the folder (or its meta.json).

Built-in sources (``corpora.CORPORA``): ``pydoc-topics``, the English help texts of the Python
reference that every CPython ships (``pydoc_data.topics``; the default for ``data prepare``),
and ``stdlib``, the standard library's sources.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gasloc_emu.config import ConfigError
from gasloc_emu.training.corpora import CORPORA, CorpusUnavailable

FORMAT = "gasloc-emu tokens"
VERSION = 1
HEADER = "meta.json"
TOKENIZER = "tokenizer.json"
FILES = {"train": "train.bin", "val": "val.bin"}
END_OF_TEXT = "<|endoftext|>"    # between documents, as GPT-2 separates them
_SPLIT_BLOCK = 1 << 10           # held-out split: every k-th block of 1024 tokens


class TokenError(ValueError):
    """A prepared corpus that is missing, damaged or does not fit; a source that cannot be
    tokenised; the tokenizers package absent."""


DEFAULT_CORPUS = "pydoc-topics"


def documents(source: str, max_mb: float = 64.0) -> list[str]:
    """The documents of ``source``: a name of ``CORPORA``, a text file or a folder of text
    files (each file a document, in path order, binaries skipped), up to ``max_mb`` MiB."""
    if source in CORPORA:
        try:
            docs = CORPORA[source].documents()
        except CorpusUnavailable as exc:
            raise TokenError(str(exc)) from None
    else:
        p = Path(source)
        if not p.exists():
            raise TokenError(f"corpus {source!r} is neither a file, a folder nor one of "
                             f"{', '.join(CORPORA)}")
        files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
        docs = [raw.decode("utf-8", errors="replace") for raw in map(Path.read_bytes, files)
                if b"\0" not in raw[:4096]]
    out, left = [], int(max_mb * (1 << 20))
    for d in docs:
        if left <= 0:
            break
        out.append(d[:left])
        left -= len(out[-1])
    if not any(out):
        raise TokenError(f"corpus {source!r} holds no text")
    return out


@dataclass(frozen=True)
class TokenHeader:
    """meta.json of a prepared corpus."""

    vocab_size: int
    dtype: str                      # uint16 or uint32
    tokenizer: str                  # the tokenizer's file, beside this header
    source: str                     # what was tokenised
    source_chars: int
    documents: int
    tokens: dict[str, int]          # per split: how many
    sha256: dict[str, str]          # per file name: its digest
    files: dict[str, str] = field(default_factory=lambda: dict(FILES))
    format: str = FORMAT
    version: int = VERSION

    def __post_init__(self):
        if self.format != FORMAT or self.version != VERSION:
            raise TokenError(f"{HEADER}: format {self.format!r} version {self.version!r} is not "
                             f"{FORMAT!r} version {VERSION}")
        if self.dtype not in ("uint16", "uint32"):
            raise TokenError(f"{HEADER}: dtype {self.dtype!r} is not uint16 or uint32")
        if set(self.tokens) != set(FILES) or set(self.files) != set(FILES):
            raise TokenError(f"{HEADER}: expected the splits {sorted(FILES)}")

    @classmethod
    def read(cls, folder: Path) -> TokenHeader:
        try:
            obj = json.loads((folder / HEADER).read_text())
            return cls(**obj)
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise TokenError(f"{folder / HEADER}: not a prepared corpus header ({exc})") \
                from None

    def write(self, folder: Path) -> None:
        (folder / HEADER).write_text(json.dumps(asdict(self), indent=2) + "\n")


def is_prepared(path: str) -> bool:
    """Whether ``data.path`` names a prepared corpus (its folder or its meta.json)."""
    if not path:
        return False
    p = Path(path)
    return (p.is_dir() and (p / HEADER).is_file()) or (p.name == HEADER and p.is_file())


def folder_of(path: str) -> Path:
    p = Path(path)
    return p.parent if p.name == HEADER else p


def open_prepared(path: str) -> tuple[TokenHeader, np.ndarray, np.ndarray]:
    """The header and the train and held-out tokens as read-only memory maps (nothing read
    until sampled); a file whose size does not match its count is refused."""
    folder = folder_of(path)
    head = TokenHeader.read(folder)
    maps = []
    for split, name in head.files.items():
        f = folder / name
        itemsize = np.dtype(head.dtype).itemsize
        if not f.is_file() or f.stat().st_size != head.tokens[split] * itemsize:
            raise TokenError(f"{f}: expected {head.tokens[split]} {head.dtype} tokens "
                             f"({head.tokens[split] * itemsize} bytes) as {HEADER} says")
        maps.append(np.memmap(f, dtype=head.dtype, mode="r") if head.tokens[split]
                    else np.empty(0, dtype=head.dtype))
    return head, maps[0], maps[1]


def verify(path: str) -> list[str]:
    """The files whose SHA-256 differs from the header's (reads them whole)."""
    folder = folder_of(path)
    head = TokenHeader.read(folder)
    return [name for name, digest in head.sha256.items() if _sha256(folder / name) != digest]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- preparing

def train_tokenizer(docs: list[str], vocab_size: int):
    """A byte-level BPE tokenizer of ``vocab_size`` ids trained on ``docs`` (every byte is in
    its alphabet, so any text encodes); ``END_OF_TEXT`` is id 0."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise TokenError("tokenising a corpus needs the tokenizers package: pip install "
                         "'gasloc-emu[tokens]'") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def split_blocks(ids: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Every k-th block of 1024 tokens held out (k = round(1/val_fraction)), or the tail of a
    corpus of fewer than k blocks: both splits see every part of the corpus."""
    every = max(2, round(1 / val_fraction))
    n_blocks = -(-ids.size // _SPLIT_BLOCK)
    if n_blocks < every:
        cut = int(ids.size * (1 - val_fraction))
        return ids[:cut], ids[cut:]
    block = np.arange(ids.size) // _SPLIT_BLOCK
    held = block % every == every - 1
    return ids[~held], ids[held]


def prepare(source: str, out: Path, vocab_size: int, val_fraction: float = 0.05,
            max_mb: float = 64.0) -> TokenHeader:
    """Tokenise ``source`` into ``out`` (created; must not hold a prepared corpus already)."""
    if not 257 <= vocab_size <= 1 << 20:
        raise ConfigError(f"--vocab-size {vocab_size} is out of range; expected 257 .. "
                          f"{1 << 20} (the 256 bytes, the end-of-text id and merges)")
    if not 0.001 <= val_fraction <= 0.5:
        raise ConfigError(f"--val-fraction {val_fraction} is out of range; expected 0.001 .. 0.5")
    if (out / HEADER).exists():
        raise TokenError(f"{out} already holds a prepared corpus; choose another --out")
    docs = documents(source, max_mb)
    tok = train_tokenizer(docs, vocab_size)
    eot = tok.token_to_id(END_OF_TEXT)
    dtype = np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.uint32
    ids = np.concatenate([np.array([*e.ids, eot], dtype=dtype)
                          for e in tok.encode_batch(docs)])
    train, val = split_blocks(ids, val_fraction)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / TOKENIZER))
    digests = {}
    for split, arr in (("train", train), ("val", val)):
        arr.tofile(out / FILES[split])
        digests[FILES[split]] = _sha256(out / FILES[split])
    src = source if source in CORPORA else str(Path(source).resolve())
    head = TokenHeader(vocab_size=tok.get_vocab_size(), dtype=np.dtype(dtype).name,
                       tokenizer=TOKENIZER, source=src, source_chars=sum(map(len, docs)),
                       documents=len(docs), tokens={"train": int(train.size),
                                                    "val": int(val.size)},
                       sha256=digests)
    head.write(out)
    return head

