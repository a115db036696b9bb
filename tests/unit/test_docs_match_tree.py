"""The docs name only what exists: every repo path, ``file.py::name``, ``gasloc-emu`` subcommand
and flag in README.md and docs/*.md is checked against the tree and the command line.

Pure reading: the Markdown is scanned with regular expressions, Python files with ``ast``, and
the commands and flags come from the click group ``gasloc_emu.commands.cli.main`` itself (no
subprocess, nothing run). Every problem is reported as ``file:line: what is missing``.
"""
from __future__ import annotations

import ast
import functools
import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click

from gasloc_emu.commands.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

# top-level folders whose paths the docs name; a path that starts with one must exist
PREFIXES = ("gasloc_emu", "netem", "tests", "benchmarks", "examples", "docs")
# gasloc_emu's subpackages, which the docs also name without the package (`algorithms/base.py`)
SUBPACKAGES = tuple(sorted(p.name for p in (ROOT / "gasloc_emu").iterdir()
                           if (p / "__init__.py").is_file()))

_ROOTS = "|".join(PREFIXES + SUBPACKAGES)
_PATH = re.compile(rf"(?<![\w./<>-])((?:{_ROOTS})/[\w./*<>-]*)((?:::?[\w.]+)*)")
_SPAN = re.compile(r"(?<!`)`([^`\n]+(?:\n(?!\s*\n)[^`\n]+)*)`(?!`)")  # inline code, may wrap
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_DOTTED = re.compile(r"^(gasloc_emu|netem)((?:\.\w+)+)$")
# a placeholder a reader fills in: PRESET, RUN_DIR, <name>, a glob
_PLACEHOLDER = re.compile(r"(^|/)([A-Z][A-Z0-9_]+(?!\.md)|<[^>]*>|[^/]*\*[^/]*)(\.\w+)*(/|$)")
_END_OF_COMMAND = {"&&", "||", "|", ";", ">", "2>", "#"}


@dataclass(frozen=True)
class Problem:
    doc: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.what}"


# ------------------------------------------------------------------------------ the tree

@functools.cache
def _defined(path: Path) -> frozenset[str]:
    """Every name a Python file binds anywhere (functions, classes, methods, assignments,
    imports), as ``name`` and as ``Class.name``."""
    names: set[str] = set()

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            bound: list[str] = []
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound = [child.name]
            elif isinstance(child, (ast.Assign, ast.AnnAssign)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                bound = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                bound = [(a.asname or a.name).split(".")[0] for a in child.names]
            for name in bound:
                names.add(name)
                if owner:
                    names.add(f"{owner}.{name}")
            visit(child, child.name if isinstance(child, ast.ClassDef) else owner)

    visit(ast.parse(path.read_text()), "")
    return frozenset(names)


def _resolve(raw: str) -> Path | None:
    """The file or folder a path of the docs means, or None: a bare subpackage path
    (`algorithms/base.py`) is taken under gasloc_emu/."""
    first = raw.split("/", 1)[0]
    if first in PREFIXES:
        return ROOT / raw
    if first in SUBPACKAGES:
        return ROOT / "gasloc_emu" / raw
    return None


def check_path(raw: str, suffix: str) -> str | None:
    """Why ``raw`` (with ``::name``, ``:name`` or ``:LINE``) names nothing, or None."""
    raw = raw.rstrip(".,;")
    if _PLACEHOLDER.search(raw):
        base = _PLACEHOLDER.split(raw, maxsplit=1)[0].rstrip("/")
        if "*" in raw and not list(ROOT.glob(raw if raw.split("/")[0] in PREFIXES
                                             else f"gasloc_emu/{raw}")):
            return f"`{raw}` matches no file"
        path = _resolve(base) if base else None
        if base and (path is None or not path.exists()):
            return f"`{raw}`: folder `{base}` does not exist"
        return None
    path = _resolve(raw)
    if path is None or not path.exists():
        return f"`{raw}` does not exist"
    names = [n for n in re.split(r"::?", suffix) if n]
    if not names:
        return None
    if path.suffix != ".py":
        return f"`{raw}{suffix}`: `{raw}` is not a Python file"
    if len(names) == 1 and names[0].isdigit():
        lines = len(path.read_text().splitlines())
        return None if int(names[0]) <= lines else f"`{raw}{suffix}`: it has {lines} lines"
    qual = ".".join(names)
    return None if qual in _defined(path) else f"`{raw}{suffix}`: no `{qual}` in `{raw}`"


@functools.cache
def entry_point_groups() -> frozenset[str]:
    """The entry-point groups the packages read (``"gasloc_emu.models"``; netem reads
    ``"gasloc_emu.shapers"``): dotted names that are no module."""
    return frozenset(g for pkg in ("gasloc_emu", "netem") for f in (ROOT / pkg).rglob("*.py")
                     for g in re.findall(r"[\"'](gasloc_emu\.\w+)[\"']", f.read_text()))


def check_dotted(text: str) -> str | None:
    """Why ``gasloc_emu.a.b.Name`` names no module or no name in it, or None."""
    m = _DOTTED.match(text)
    if not m or text in entry_point_groups():
        return None
    parts = [m.group(1), *m.group(2).lstrip(".").split(".")]
    for k in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:k])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                rest = ".".join(parts[k:])
                if not rest or rest in _defined(path):
                    return None
                return f"`{text}`: no `{rest}` in `{path.relative_to(ROOT)}`"
    return f"`{text}`: no module `{'.'.join(parts[:2])}`"


# ---------------------------------------------------------------------------- the commands

def _options(cmd: click.Command) -> frozenset[str]:
    opts = {"--help", "-h"}
    for p in cmd.params:
        if isinstance(p, click.Option):
            opts.update(p.opts + p.secondary_opts)
    return frozenset(opts)


@functools.cache
def commands() -> dict[str, frozenset[str]]:
    """``"run"``, ``"netem show"``, ...: the flags each command of the CLI takes."""
    out: dict[str, frozenset[str]] = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                walk(cmd, f"{prefix}{name} ")
                out[f"{prefix}{name}"] = frozenset()
            else:
                out[f"{prefix}{name}"] = _options(cmd)

    walk(cli_main, "")
    return out


@functools.cache
def known_flags() -> frozenset[str]:
    """Every flag of a gasloc-emu command or of a script in benchmarks/, for a flag the prose
    names alone (`--rates`)."""
    scripts = {f for p in (ROOT / "benchmarks").glob("*.py")
               for f in re.findall(r"[\"'](--[a-z][\w-]*)[\"']", p.read_text())}
    return frozenset(scripts.union(*commands().values()))


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=False)
    except ValueError:   # an unbalanced quote in prose
        return line.split()


def check_command_line(line: str) -> list[str]:
    """What is wrong with the ``gasloc-emu`` command in one (joined) line: an unknown
    subcommand or a flag the subcommand does not take; the flags of a
    ``python benchmarks/X.py`` line must appear in that script."""
    words, problems = _words(line), []
    for k, word in enumerate(words):
        if word == "gasloc-emu" or (word == "gasloc_emu" and k and words[k - 1] == "-m"):
            problems += _check_invocation(words[k + 1:])
        elif word.startswith("benchmarks/") and word.endswith(".py") and k \
                and words[k - 1].startswith("python"):
            problems += _check_script_flags(word, words[k + 1:])
    return problems


def _until_end(words: list[str]) -> list[str]:
    for k, w in enumerate(words):
        if w in _END_OF_COMMAND or w.startswith("#"):
            return words[:k]
    return words


def _check_invocation(words: list[str]) -> list[str]:
    words = _until_end(words)
    if not words or words[0].startswith("-") or not re.fullmatch(r"[a-z][\w-]*", words[0]):
        return []   # `gasloc-emu --help`, or the name in prose
    cmds = commands()
    name = words[0]
    if name not in cmds:
        return [f"`gasloc-emu {name}`: no such subcommand (known: "
                f"{', '.join(c for c in sorted(cmds) if ' ' not in c)})"]
    rest = words[1:]
    subs = sorted(c.split(" ", 1)[1] for c in cmds if c.startswith(name + " "))
    if subs:
        if not rest or rest[0] not in subs:
            got = rest[0] if rest else ""
            return [f"`gasloc-emu {name} {got}`: no such subcommand (known: {', '.join(subs)})"]
        name, rest = f"{name} {rest[0]}", rest[1:]
    return [f"`gasloc-emu {name}` takes no flag `{flag}`" for flag in _flags(rest)
            if flag not in cmds[name]]


def _flags(words: list[str]) -> list[str]:
    """The ``--flag`` words (``[--plot f.png]``: an optional one in a usage line)."""
    words = [w.strip("[]") for w in words]
    return [w.split("=", 1)[0] for w in words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w)]


def _check_script_flags(script: str, words: list[str]) -> list[str]:
    path = ROOT / script
    if not path.is_file():
        return []   # the path check names it
    text = path.read_text()
    return [f"`{script}` takes no flag `{flag}`" for flag in _flags(_until_end(words))
            if f'"{flag}"' not in text and f"'{flag}'" not in text]


# ------------------------------------------------------------------------------- the docs

def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _joined(block: str) -> list[tuple[int, str]]:
    """(line offset in the block, command) with ``\\`` continuations joined."""
    out, start, parts = [], 0, []
    for k, line in enumerate(block.splitlines()):
        if not parts:
            start = k
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        out.append((start, " ".join([*parts, line])))
        parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def check_text(text: str, doc: str) -> list[Problem]:
    """Every problem of one Markdown text, ``doc`` naming it in the messages."""
    problems: list[Problem] = []

    def add(offset: int, what: str | None) -> None:
        if what:
            problems.append(Problem(doc, _line_of(text, offset), what))

    fenced = list(_FENCE.finditer(text))
    for block in fenced:
        first = _line_of(text, block.start(1))
        for k, command in _joined(block.group(1)):
            for what in check_command_line(command):
                problems.append(Problem(doc, first + k, what))
            for m in _PATH.finditer(command):
                what = check_path(m.group(1), m.group(2))
                if what:
                    problems.append(Problem(doc, first + k, what))
    prose = text
    for block in reversed(fenced):   # blank the blocks out, keeping the line numbers
        prose = prose[:block.start()] + re.sub(r"[^\n]", " ", block.group(0)) \
            + prose[block.end():]
    for m in _SPAN.finditer(prose):
        span = " ".join(m.group(1).split())
        for p in _PATH.finditer(span):
            add(m.start(), check_path(p.group(1), p.group(2)))
        add(m.start(), check_dotted(span))
        for what in check_command_line(span):
            add(m.start(), what)
        words = _words(span)
        if len(words) > 1 and words[0] in commands() and "gasloc-emu" not in span:
            for what in _check_invocation(words):   # `config --show`: the command in prose
                add(m.start(), what)
        if span.startswith("--") and "gasloc-emu" not in span:
            flag = _flags(span.split()[:1])
            if flag and flag[0] not in known_flags():
                add(m.start(), f"`{flag[0]}` is a flag of no gasloc-emu command and no "
                               "benchmark")
    for m in _LINK.finditer(prose):
        target = m.group(1).split("#", 1)[0]
        if target and "://" not in target:
            where = (ROOT / doc).parent / target
            if not where.resolve().exists():
                add(m.start(), f"link `{target}` does not exist")
    bare = _LINK.sub(lambda s: " " * len(s.group(0)), prose)
    for m in _PATH.finditer(_SPAN.sub(lambda s: " " * len(s.group(0)), bare)):
        if m.group(1).split("/", 1)[0] in PREFIXES:   # bare mentions: only full paths
            add(m.start(), check_path(m.group(1), m.group(2)))
    return problems


def test_the_docs_name_only_paths_commands_and_flags_that_exist():
    problems = [str(p) for doc in DOCS
                for p in check_text(doc.read_text(), str(doc.relative_to(ROOT)))]
    assert problems == [], "the docs name what does not exist:\n" + "\n".join(problems)


# ------------------------------------------------------------------ the checker itself

MADE_UP = """\
The codecs are in `gasloc_emu/comm/codecs.py` (`make_codec`), the plan in
`gasloc_emu/plan.py::build_plan`, and the kit in `gasloc_emu.testing`.

```bash
gasloc-emu simulate --workers 4 --codec int8 \\
    --set run.rounds=3
gasloc-emu netem show --bw-profile skewed
torchrun --nnodes 2 -m gasloc_emu run --workers 16 --secret-file /shared/run.secret
```

Usage: `gasloc-emu compare RUN... [--plot f.png]`, and `config --fields` in prose.

Bad: `gasloc_emu/comm/zstd.py`, `tests/unit/test_codecs.py::test_nothing_here`,
`gasloc_emu.comm.codecs.Zstd`, [a link](docs/NOWHERE.md) and docs/MISSING.md.

```bash
gasloc-emu simulate --workers 4 \\
    --colour red
gasloc-emu transmogrify --workers 4
gasloc-emu netem shout
python benchmarks/bench_codecs.py --turbo
python -m gasloc_emu run --bogus
```

Usage: `gasloc-emu compare RUN... [--plots f.png]`, and `config --show` in prose.
"""


def test_the_checker_names_each_bad_path_subcommand_and_flag_with_its_line():
    got = [str(p) for p in check_text(MADE_UP, "docs/MADE_UP.md")]
    want = [
        "docs/MADE_UP.md:17: `gasloc-emu simulate` takes no flag `--colour`",
        "docs/MADE_UP.md:19: `gasloc-emu transmogrify`: no such subcommand",
        "docs/MADE_UP.md:20: `gasloc-emu netem shout`: no such subcommand (known: clean, "
        "measure, probe, show)",
        "docs/MADE_UP.md:21: `benchmarks/bench_codecs.py` takes no flag `--turbo`",
        "docs/MADE_UP.md:22: `gasloc-emu run` takes no flag `--bogus`",
        "docs/MADE_UP.md:13: `gasloc_emu/comm/zstd.py` does not exist",
        "docs/MADE_UP.md:13: `tests/unit/test_codecs.py::test_nothing_here`: no "
        "`test_nothing_here` in `tests/unit/test_codecs.py`",
        "docs/MADE_UP.md:14: `gasloc_emu.comm.codecs.Zstd`: no `Zstd` in "
        "`gasloc_emu/comm/codecs.py`",
        "docs/MADE_UP.md:25: `gasloc-emu compare` takes no flag `--plots`",
        "docs/MADE_UP.md:25: `gasloc-emu config` takes no flag `--show`",
        "docs/MADE_UP.md:14: link `docs/NOWHERE.md` does not exist",
        "docs/MADE_UP.md:14: `docs/MISSING.md` does not exist",
    ]
    assert len(got) == len(want), "\n".join(got)
    for line, expected in zip(got, want, strict=True):
        assert line.startswith(expected), (line, expected)


def test_the_checker_passes_what_exists():
    good = MADE_UP.split("Bad:")[0]
    assert check_text(good, "README.md") == []
    assert check_path("gasloc_emu/algorithms/", "") is None
    assert check_path("algorithms/registry.py", "") is None           # under gasloc_emu/
    assert check_path("gasloc_emu/config.py", ":30") is None           # a line that exists
    assert check_path("gasloc_emu/config.py", ":99999") is not None
    assert check_path("docs/results/PRESET.jsonl", "") is None          # a placeholder
    assert check_path("nodocs/results/PRESET.jsonl", "") is not None


# ------------------------------------------------------------- the architecture's layers

def _structure_layers() -> tuple[str, ...]:
    """tests/unit/test_structure.py's LAYERS, read from its source."""
    tree = ast.parse((ROOT / "tests/unit/test_structure.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "LAYERS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("tests/unit/test_structure.py has no LAYERS")


def _page_layers(text: str) -> tuple[str, ...]:
    m = re.search(r"in this order: ((?:`[\w_]+`,?\s*(?:and\s+)?)+)", text)
    assert m, "docs/ARCHITECTURE.md names no layer order ('in this order: `a`, `b`, ...')"
    return tuple(re.findall(r"`([\w_]+)`", m.group(1)))


def _file_table_layers(text: str) -> list[str]:
    """The layer of every file row under "## Files", in page order."""
    section = ("\n" + text).split("\n## Files", 1)[1].split("\n## ", 1)[0]
    out = []
    for m in re.finditer(r"^\| `(gasloc_emu|netem)/([\w]+)", section, re.M):
        out.append("netem" if m.group(1) == "netem" else m.group(2).removesuffix(".py")
                   if m.group(2) != "__main__" else "__main__")
    return out


def _stack_layers(text: str) -> tuple[str, ...]:
    """The first word of each line of the page's layer stack (the block that starts with
    ``__main__``)."""
    m = re.search(r"^```\n(__main__ .*?)^```", text, re.S | re.M)
    assert m, "docs/ARCHITECTURE.md draws no layer stack (a block starting with __main__)"
    return tuple(line.split()[0] for line in m.group(1).splitlines() if line.strip())


def test_the_architecture_page_lists_the_layers_in_the_enforced_order():
    text = (ROOT / "docs/ARCHITECTURE.md").read_text()
    assert _page_layers(text) == _structure_layers()
    assert _stack_layers(text) == _structure_layers()
    rank = {name: i for i, name in enumerate(_structure_layers())}
    rows = _file_table_layers(text)
    out_of_order = [(a, b) for a, b in itertools.pairwise(rows) if rank[a] > rank[b]]
    assert rows and out_of_order == [], f"file tables out of layer order: {out_of_order}"


def test_the_layer_check_sees_a_page_out_of_order():
    assert _page_layers("in this order: `commands`, `config`.") == ("commands", "config")
    swapped = "## Files\n| `gasloc_emu/config.py` | x |\n| `gasloc_emu/plan.py` | y |\n"
    rank = {name: i for i, name in enumerate(_structure_layers())}
    rows = _file_table_layers(swapped)
    assert rows == ["config", "plan"] and rank[rows[0]] > rank[rows[1]]
