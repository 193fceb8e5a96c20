"""Every ``stealkit ...`` command line in README.md and docs/guide/*.md parses against today's CLI.

The lines are collected from fenced code blocks (with backslash continuations, leading ``VAR=value``
assignments and trailing ``# comments``) and from inline code spans that start with ``stealkit``. Each is
parsed, never run: the click groups are walked to the subcommand and ``make_context`` parses its arguments
with resilient parsing off, so an unknown command or option, a bad choice value or a malformed number is a
failure. Option callbacks (which would resolve or train a victim) and ``Path(exists=True)`` checks are left
out: a documented ``--victim runs/victim`` need not exist on the test machine.

Fenced lines must be complete commands (required options present). Inline spans are prose references: they
are checked for the command, its options and their values, but may leave out required options, and a span
that only names a command (``stealkit serve``) is checked for the command alone.

Placeholders: ``$VAR`` / ``${VAR}`` and ``<placeholder>`` tokens become a dummy value that fits the option
they follow (a choice's first value, ``1`` for numbers); ``...`` tokens are dropped; ``[--flag]`` brackets
are removed; a token ``a|b|c`` is checked once per alternative (in a markdown table ``\\|`` is a ``|``).
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from stealkit.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = "\x00placeholder"
_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE = re.compile(r"`(stealkit\s[^`]+)`")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    """One documented command line: where it is, its text, and whether it must be complete (fenced)."""

    source: str
    line: int
    text: str
    complete: bool

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.text}"


def documented_files() -> list[Path]:
    """README.md and every guide page."""
    return [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]


def _tokens(text: str) -> list[str] | None:
    """The tokens after ``stealkit`` (``None``: the text is not a stealkit command)."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:
        return None
    while tokens and _ENV.match(tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    if tokens[0] == "$":
        tokens = tokens[1:]
    if tokens[:3] == ["python", "-m", "stealkit"]:
        return tokens[3:]
    if tokens and (tokens[0] == "stealkit" or tokens[0].endswith("/stealkit")):
        return tokens[1:]
    return None


def collect(text: str, source: str = "<text>") -> list[DocCommand]:
    """Every stealkit command line of a markdown ``text``: fenced (complete) and inline (references)."""
    out: list[DocCommand] = []
    lines = text.splitlines()
    in_fence = False
    fence_lang = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m:
            in_fence = not in_fence
            fence_lang = line.strip()[3:].strip().lower() if in_fence else ""
            i += 1
            continue
        if in_fence:
            start = i
            joined = line
            while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined.rstrip()[:-1] + " " + lines[i].strip()
            if fence_lang not in ("python", "py", "toml", "json") and _tokens(joined) is not None:
                out.append(DocCommand(source, start + 1, " ".join(joined.split()), True))
        else:
            for span in _INLINE.findall(line.replace("\\|", "|")):
                out.append(DocCommand(source, i + 1, " ".join(span.split()), False))
        i += 1
    return out


def all_documented() -> list[DocCommand]:
    cmds: list[DocCommand] = []
    for path in documented_files():
        cmds.extend(collect(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))))
    return cmds


def _clean(tokens: list[str]) -> list[str]:
    """Drop ``...``, strip ``[ ]`` and mark placeholders."""
    out = []
    for tok in tokens:
        tok = tok.strip("[]")
        if not tok or tok in ("...", "…"):
            continue
        if tok.startswith("$") or (tok.startswith("<") and tok.endswith(">")):
            tok = PLACEHOLDER
        out.append(tok)
    return out


def variants(tokens: list[str]) -> list[list[str]]:
    """One token list per alternative of each ``a|b`` token (the others at their first alternative)."""
    def first(tok: str) -> str:
        return tok.split("|")[0] if "|" in tok and "://" not in tok else tok

    base = [first(t) for t in tokens]
    out = [base]
    for k, tok in enumerate(tokens):
        if "|" in tok and "://" not in tok:
            for alt in tok.split("|")[1:]:
                out.append(base[:k] + [alt] + base[k + 1:])
    return out


def _sanitised(cmd: click.Command, *, complete: bool) -> click.Command:
    """``cmd`` with its parameters' callbacks removed, paths unchecked, and (for references) nothing required."""
    twin = copy.copy(cmd)
    params = []
    for p in cmd.params:
        q = copy.copy(p)
        q.callback = None
        if isinstance(q.type, click.Path):
            q.type = click.Path()
        if not complete:
            q.required = False
        params.append(q)
    twin.params = params
    return twin


def _fill(cmd: click.Command, args: list[str]) -> list[str]:
    """Placeholders replaced by a value that fits the option before them."""
    by_flag = {opt: p for p in cmd.params for opt in getattr(p, "opts", [])}
    out = []
    for k, tok in enumerate(args):
        if tok == PLACEHOLDER:
            param = by_flag.get(args[k - 1]) if k else None
            ptype = getattr(param, "type", None)
            if isinstance(ptype, click.Choice):
                tok = str(ptype.choices[0])
            elif isinstance(ptype, (click.types.IntParamType, click.types.FloatParamType)):
                tok = "1"
            else:
                tok = "dummy"
        out.append(tok)
    return out


def check_tokens(tokens: list[str], *, complete: bool = True) -> str | None:
    """Parse ``stealkit TOKENS`` without running it; the error, or ``None`` when it parses."""
    group: click.Command = cli
    parent: click.Context | None = None
    name = "stealkit"
    args = list(tokens)
    try:
        while isinstance(group, click.Group):
            if not complete and not [a for a in args if not a.startswith("-")]:
                return None  # a reference to a group ("stealkit study") names no command to check further
            ctx = group.make_context(name, args, parent=parent)  # placeholders are filled at the leaf
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
            if not rest:
                return f"'{' '.join(tokens)}' names no command under {name}"
            sub_name, sub, rest = group.resolve_command(ctx, rest)
            if sub is None:
                return f"no command {rest[0] if rest else ''!r} under {name}"
            parent, group, name, args = ctx, sub, sub_name or name, rest
        leaf = _sanitised(group, complete=complete)
        leaf.make_context(name, _fill(leaf, args), parent=parent)
    except click.exceptions.Exit:
        return None  # --version
    except click.ClickException as exc:  # UsageError, BadParameter, NoSuchOption, MissingParameter
        return exc.format_message()
    return None


def check(cmd: DocCommand | str) -> str | None:
    """Every variant of one documented command; the first error, or ``None``."""
    if isinstance(cmd, str):
        cmd = DocCommand("<test>", 0, cmd, True)
    tokens = _tokens(cmd.text)
    if tokens is None:
        return f"not a stealkit command: {cmd.text}"
    tokens = _clean(tokens)
    complete = cmd.complete
    if "--help" in tokens or "-h" in tokens:  # help is answered, not run: check what it asks help for
        tokens = [t for t in tokens if t not in ("--help", "-h")]
        complete = False
    if not tokens:
        return None
    for v in variants(tokens):
        error = check_tokens(v, complete=complete)
        if error is not None:
            return f"{' '.join(v)}: {error}"
    return None


DOCUMENTED = all_documented()


def test_the_docs_have_commands_to_check() -> None:
    """The collector finds the README tour and the guides' commands (an empty list would pass vacuously)."""
    fenced = [c for c in DOCUMENTED if c.complete]
    assert len(fenced) >= 40, f"only {len(fenced)} fenced stealkit lines found"
    assert {c.source for c in fenced} >= {"README.md", *(f"docs/guide/{p}.md" for p in
                                                        ("surrogate", "datafree", "explanations", "attacks", "certify",
                                                         "serve"))}
    print(f"\n{len(DOCUMENTED)} documented stealkit commands ({len(fenced)} fenced, "
          f"{len(DOCUMENTED) - len(fenced)} inline)")


@pytest.mark.parametrize("cmd", DOCUMENTED, ids=[f"{c.source}:{c.line}" for c in DOCUMENTED])
def test_documented_command_parses(cmd: DocCommand) -> None:
    assert check(cmd) is None, f"{cmd}\n  -> {check(cmd)}"


GOOD = "stealkit extract surrogate --victim runs/v --budget 100 --mode label --out runs/x"


@pytest.mark.parametrize("bad, why", [
    (GOOD + " --made-up-flag 3", "No such option"),
    (GOOD.replace("--mode label", "--mode labels"), "labels"),
    (GOOD.replace("--budget 100", "--budget many"), "many"),
    (GOOD.replace(" --out runs/x", ""), "--out"),
    ("stealkit extract steal --victim v --budget 1 --out o", "steal"),
    ("stealkit attack hopskipjump --victim v --preset fast --out o", "fast"),
    ("stealkit --no-such-global extract surrogate --victim v --budget 1 --out o", "no-such-global"),
])
def test_a_made_up_line_fails(bad: str, why: str) -> None:
    error = check(bad)
    assert error is not None and why in error, error


def test_a_good_line_and_its_forms_pass() -> None:
    assert check(GOOD) is None
    assert check("OMP_NUM_THREADS=1 " + GOOD + "   # a comment") is None
    assert check("stealkit -q --threads 2 " + GOOD[len("stealkit "):]) is None
    assert check("stealkit extract surrogate --victim http://h:1 --key $KEY --budget <n> --out o") is None
    assert check("stealkit extract codfe|dfme --victim v --mode label|probs --budget 10 --out o") is None
    assert check("stealkit extract codfe|steal --victim v --budget 10 --out o") is not None  # each alternative
    assert check("stealkit certify --help") is None


def test_the_collector_reads_fences_continuations_and_inline_spans() -> None:
    text = "\n".join([
        "Run `stealkit serve --protocol v2` or `stealkit export`.",
        "```bash",
        "stealkit train --dataset digits \\",
        "    --out runs/v          # a victim",
        "echo not stealkit",
        "```",
        "```python",
        "stealkit = 1",
        "```",
        "| `stealkit extract codfe --mode label\\|probs` |",
    ])
    found = collect(text, "x.md")
    assert [(c.line, c.text, c.complete) for c in found] == [
        (1, "stealkit serve --protocol v2", False),
        (1, "stealkit export", False),
        (3, "stealkit train --dataset digits --out runs/v # a victim", True),
        (10, "stealkit extract codfe --mode label|probs", False),
    ]
    assert all(check(c) is None for c in found)
    assert check(DocCommand("x.md", 1, "stealkit serve --protocol v3", False)) is not None
