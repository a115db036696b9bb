"""The text corpora that need no download: the running Python's standard library sources (the
byte-level default of the tiny runs) and the English help texts of the Python reference
(``pydoc_data.topics``, shipped with every CPython: the default for ``gasloc-emu data
prepare``). Each is a list of documents in a stable order."""
from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}


class CorpusUnavailable(ValueError):
    """A built-in corpus this Python installation does not ship."""


def stdlib_files() -> list[Path]:
    """The standard library's .py files in a stable order (installed packages pruned, not
    walked)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _NOT_STDLIB)
        out += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(out)


def pydoc_topics() -> list[str]:
    """The Python reference's topic help texts (what ``help("assert")`` prints), by topic."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise CorpusUnavailable("corpus 'pydoc-topics': this Python ships no pydoc_data; give "
                                "a text file or folder instead") from None
    return [topics[k] for k in sorted(topics)]


def stdlib_texts() -> list[str]:
    return [f.read_text(errors="replace") for f in stdlib_files()]


def read_files(files: list[Path], cap_bytes: int) -> bytes:
    """The files' bytes in order up to ``cap_bytes``, unreadable and binary files skipped."""
    chunks, total = [], 0
    for f in files:
        try:
            raw = f.read_bytes()
        except OSError:
            continue
        if b"\0" in raw[:4096]:  # binary file in a text folder
            continue
        chunks.append(raw[: cap_bytes - total])
        total += len(chunks[-1])
        if total >= cap_bytes:
            break
    return b"".join(chunks)


@dataclass(frozen=True)
class Builtin:
    """A corpus by name: its documents (to train a tokenizer on) and its bytes up to a cap
    (the byte tokens of a run that names it in ``data.path``)."""

    documents: Callable[[], list[str]]
    raw: Callable[[int], bytes]
    about: str


CORPORA = {
    "stdlib": Builtin(stdlib_texts, lambda cap: read_files(stdlib_files(), cap),
                      "the running Python's standard library sources (code)"),
    "pydoc-topics": Builtin(pydoc_topics,
                            lambda cap: "\n\n".join(pydoc_topics()).encode()[:cap],
                            "the Python reference's help texts (English prose, ~0.45 MB)"),
}
