"""Checkpoints: each worker's whole state at the end of a round, on disk, and the round a run
resumes from.

A worker writes ``w{rank}-r{round}.ckpt`` in the run's ``checkpoints/`` folder every
``run.checkpoint_every`` rounds, after the round's outer step: its parameters, the inner
AdamW's state, the algorithm's state (``Algorithm.state_dict``) and its channel's copies, the
random generators (its data shard's and torch's), its step count, compute speed and
overruns, and the run's clock at that point. Nothing is in flight then: every message of the
round was received before its outer step finished (an overlapped exchange is, so overlap
does not checkpoint).

A file is written whole or not at all: to a temporary name, flushed to the disk (fsync), then
renamed over (POSIX rename is atomic) and the folder synced. Its first line says what it is;
its second, a JSON header, gives its rank, round and the SHA-256 of the payload, which is
checked before anything of it is used: a truncated or altered file is refused by name and an
earlier round is taken instead. The payload is read with ``torch.load(weights_only=True)``,
which builds tensors and plain containers only, never code.

Workers do not finish a round together, so the run resumes from the latest round that every
worker taking part in it has a valid checkpoint of (``Checkpoints.latest_common``; on
several hosts, each checks its own folder, ``Checkpoints.holdings``, and node 0 chooses from
all of them, ``common_point``). Older
files are removed only below the round before that one (``prune``, called by whoever sees
every worker's rows: the launcher, or the simulator; on several hosts, each host on node 0's
order), so two resumable rounds stay on disk (a
damaged file of the latest leaves the other) and no more than the workers' spread in rounds
plus one checkpoint round is kept.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"gasloc-emu checkpoint\n"
VERSION = 1
FOLDER = "checkpoints"
_NAME = re.compile(r"^w(\d+)-r(\d+)\.ckpt$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, read or resumed from; the message names the file."""


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run starts: after ``round``, the run's clock at ``time_s``."""

    round: int
    time_s: float
    skipped: tuple[str, ...] = ()   # files refused on the way (truncated, altered), by name


def file_name(rank: int, round_idx: int) -> str:
    return f"w{rank}-r{round_idx:06d}.ckpt"


def encode(state: dict, rank: int, round_idx: int) -> bytes:
    """A checkpoint file's bytes: the magic line, the JSON header, the payload."""
    import torch  # here, not above: reading a record's checkpoints needs no torch
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = {"version": VERSION, "rank": rank, "round": round_idx, "bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def decode(data: bytes, where: str, load: bool = True) -> tuple[dict, dict | None]:
    """(header, state) of a checkpoint file's bytes, the payload checked against its header;
    ``load=False``: only checked (state None). A CheckpointError naming ``where``."""
    if not data.startswith(MAGIC):
        raise CheckpointError(f"{where}: not a gasloc-emu checkpoint")
    line, sep, payload = data[len(MAGIC):].partition(b"\n")
    try:
        header = json.loads(line)
        version, size, digest = header["version"], header["bytes"], header["sha256"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{where}: its header is unreadable") from None
    if version != VERSION:
        raise CheckpointError(f"{where}: checkpoint version {version!r}, this gasloc-emu reads "
                              f"{VERSION}")
    if not sep or len(payload) != size:
        raise CheckpointError(f"{where}: truncated ({len(payload)} of {size} payload bytes)")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{where}: its checksum does not match (the file was altered)")
    if not load:
        return header, None
    import torch  # here, not above: checking a file needs no torch
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad file
        raise CheckpointError(f"{where}: unreadable payload ({exc})") from None
    return header, state


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all (a failure leaves the old file and no
    temporary one)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)   # the rename itself reaches the disk
    finally:
        os.close(dir_fd)


class Checkpoints:
    """A run's checkpoint folder."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / FOLDER

    def path(self, rank: int, round_idx: int) -> Path:
        return self.dir / file_name(rank, round_idx)

    def save(self, rank: int, round_idx: int, state: dict) -> Path:
        """Write worker ``rank``'s state at the end of ``round_idx``; a CheckpointError naming
        the file when the disk refuses (the earlier checkpoints stay as they were)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path(rank, round_idx)
        try:
            write_atomic(path, encode(state, rank, round_idx))
        except OSError as exc:
            raise CheckpointError(f"checkpoint {path} not written: {exc.strerror or exc}; the "
                                  "previous checkpoint is kept") from None
        return path

    def load(self, rank: int, round_idx: int, check_only: bool = False) -> dict | None:
        """Worker ``rank``'s state at the end of ``round_idx``, checked whole (``check_only``:
        checked, not built); a CheckpointError naming the file."""
        path = self.path(rank, round_idx)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CheckpointError(f"{path}: {exc.strerror or exc}") from None
        header, state = decode(data, str(path), load=not check_only)
        if (header.get("rank"), header.get("round")) != (rank, round_idx):
            raise CheckpointError(f"{path}: holds worker {header.get('rank')} round "
                                  f"{header.get('round')}, not what its name says")
        return state

    def rounds(self) -> dict[int, set[int]]:
        """{round: ranks with a file of it} (files not checked)."""
        out: dict[int, set[int]] = {}
        for p in self.dir.glob("*.ckpt") if self.dir.is_dir() else ():
            m = _NAME.match(p.name)
            if m:
                out.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
        return out

    def latest_common(self, ranks: Iterable[int],
                      rows: dict[int, dict[int, float]]) -> ResumePoint:
        """The latest round of which every worker of ``ranks`` has a checkpoint and a row in
        the record (``rows``: {round: {worker: time_s}}), each file checked whole; a round
        with a bad file is passed over for an earlier one (named in ``skipped``). A
        CheckpointError when there is none."""
        need, skipped = set(ranks), []
        files = self.rounds()
        for r in sorted(files, reverse=True):
            if not (need <= files[r] and need <= set(rows.get(r, {}))):
                continue
            try:
                for rank in sorted(need):
                    self.load(rank, r, check_only=True)
            except CheckpointError as exc:
                skipped.append(str(exc))
                continue
            return ResumePoint(r, max(rows[r][w] for w in need), tuple(skipped))
        why = f"; refused: {'; '.join(skipped)}" if skipped else ""
        raise CheckpointError(f"{self.dir}: no round that every worker has a checkpoint of"
                              + why)

    def last_whole(self, rank: int, before: int) -> tuple[int, dict, tuple[str, ...]]:
        """Worker ``rank``'s latest checkpoint of a round before ``before``, read whole: (its
        round, its state, one line per damaged file passed over on the way); a
        CheckpointError naming them when none is left (a worker rejoining from its own
        checkpoint: ``training.rounds``)."""
        refused = []
        for r in sorted((r for r, ranks in self.rounds().items()
                         if rank in ranks and r < before), reverse=True):
            try:
                return r, self.load(rank, r), tuple(refused)
            except CheckpointError as exc:
                refused.append(str(exc))
        why = f"; refused: {'; '.join(refused)}" if refused else ""
        raise CheckpointError(f"{self.dir}: worker {rank} has no checkpoint of a round before "
                              f"{before}" + why)

    def holdings(self, ranks: Iterable[int]) -> tuple[dict[int, tuple[int, ...]],
                                                      tuple[Refusal, ...]]:
        """What this folder holds of ``ranks``: {rank: the rounds of which its file is whole},
        every file checked, and each file refused on the way (a host's side of choosing the
        round a run on several hosts resumes from: ``common_point``)."""
        want = set(ranks)
        held: dict[int, list[int]] = {rank: [] for rank in sorted(want)}
        refused = []
        for r, found in sorted(self.rounds().items()):
            for rank in sorted(found & want):
                try:
                    self.load(rank, r, check_only=True)
                except CheckpointError as exc:
                    refused.append(Refusal(rank, r, str(exc)))
                    continue
                held[rank].append(r)
        return {rank: tuple(rs) for rank, rs in held.items()}, tuple(refused)

    def prune(self, keep_from: int) -> None:
        """Remove every checkpoint of a round before ``keep_from`` (a round every worker has
        a checkpoint of, or later) but each worker's latest, and what a write killed before
        its rename left of one. A worker's latest stays: a departed worker may rejoin from it
        (``JoinEvent.from_checkpoint``) however long it is away."""
        files = self.rounds()
        latest = {}
        for r, ranks in files.items():
            for rank in ranks:
                latest[rank] = max(latest.get(rank, r), r)
        for r, ranks in files.items():
            if r < keep_from:
                for rank in ranks:
                    if latest[rank] != r:
                        self.path(rank, r).unlink(missing_ok=True)
        for tmp in self.dir.glob("*.ckpt.tmp"):
            m = _NAME.match(tmp.name[:-len(".tmp")])
            if m and int(m.group(2)) < keep_from:
                tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Refusal:
    """A checkpoint file that failed its check: worker ``rank``'s of ``round``, and why (one
    line naming the file)."""

    rank: int
    round: int
    why: str


def common_point(held: Mapping[int, Iterable[int]], ranks: Iterable[int],
                 rows: dict[int, dict[int, float]],
                 refused: Iterable[Refusal] = ()) -> ResumePoint:
    """The latest round of which every worker of ``ranks`` holds a whole checkpoint
    (``held``: {rank: rounds}, each host's files checked there: ``Checkpoints.holdings``) and
    has a row in the record (``rows``: {round: {worker: time_s}}); ``skipped`` names the files
    refused of later rounds. A CheckpointError when there is none."""
    need = sorted(set(ranks))
    whole = [set(held.get(rank, ())) for rank in need]
    both = set.intersection(*whole) if whole else set()
    ok = [r for r in both if set(need) <= set(rows.get(r, {}))]
    refused = sorted(refused, key=lambda x: (-x.round, x.rank))
    if not ok:
        why = f"; refused: {'; '.join(x.why for x in refused)}" if refused else ""
        raise CheckpointError(f"no round that every worker of {need[0]}..{need[-1]} has a "
                              f"whole checkpoint and a row of" + why)
    r = max(ok)
    return ResumePoint(r, max(rows[r][w] for w in need),
                       tuple(x.why for x in refused if x.round > r))


class CheckpointWatch:
    """Who has checkpointed which round, from the rows every worker reports after its
    checkpoint rounds. The latest round all have is ``common``; the one before it is kept
    too, so that a damaged file of the latest still leaves a round to resume from, and files
    below that can go (``row`` says from when). ``alive``: the workers taking part in a round
    (a scenario's ``World.alive``), who alone write its checkpoints; None: all of ``ranks``."""

    def __init__(self, every: int, ranks: Iterable[int],
                 alive: Callable[[int], Iterable[int]] | None = None):
        self.every, self.ranks, self.alive = every, frozenset(ranks), alive
        self.done: dict[int, set[int]] = {}
        self.common, self.before = -1, -1

    def row(self, rank: int, round_idx: int) -> int | None:
        """A row of ``rank``'s ``round_idx``; when it completes a round every worker has, the
        round from which files must stay (the previous such round), else None."""
        if not due(self.every, round_idx):
            return None
        self.done.setdefault(round_idx, set()).add(rank)
        expected = self.ranks if self.alive is None else frozenset(self.alive(round_idx))
        if round_idx > self.common and expected <= self.done[round_idx]:
            self.before, self.common = self.common, round_idx
            for r in [r for r in self.done if r <= round_idx]:
                del self.done[r]
            return self.before if self.before >= 0 else None
        return None


def due(every: int, round_idx: int) -> bool:
    """Whether round ``round_idx`` ends with a checkpoint (every K rounds: K-1, 2K-1, ...)."""
    return every > 0 and (round_idx + 1) % every == 0
