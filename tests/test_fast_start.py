"""A fast start: importing the CLI, asking for help and refusing a one-line input error load no torch.

Each check runs in a fresh interpreter (this test process has torch loaded already) and reads ``sys.modules`` after
the command, so a module-level ``import torch`` anywhere on the path fails it whatever the machine's speed. What
needs torch imports it inside the function that uses it (or under ``if TYPE_CHECKING:`` for annotations).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stealkit

SRC = Path(stealkit.__file__).resolve().parents[1]
#: what a start must not load: torch and the heavy numeric stack (numpy comes with torch)
HEAVY = ("torch", "numpy", "scipy", "sklearn", "matplotlib", "pandas")

#: runs each argv given as a JSON list through stealkit.cli.main, then prints the exit codes and the heavy modules
RUN = f"""
import json, sys
from stealkit.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        codes.append(main(argv))
    except SystemExit as exc:
        codes.append(exc.code)
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print("RESULT " + json.dumps({{"codes": codes, "heavy": heavy}}))
"""


def _python(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
                        "STEALKIT_CACHE": str(tmp_path / "cache"), "COLUMNS": "120"}
    return subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)


def _run(argvs: list[list[str]], tmp_path: Path) -> tuple[list[int], list[str], str]:
    proc = _python("-c", RUN, json.dumps(argvs), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    return result["codes"], result["heavy"], proc.stderr


def test_importing_the_cli_loads_no_torch(tmp_path: Path) -> None:
    proc = _python("-c", f"import stealkit.cli, sys; print([m for m in {HEAVY!r} if m in sys.modules])",
                   tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"`import stealkit.cli` loaded {proc.stdout.strip()}"


@pytest.mark.parametrize("argv", [["--help"], ["audit", "--help"], ["extract", "surrogate", "--help"]],
                         ids=" ".join)
def test_help_loads_no_torch(argv: list[str], tmp_path: Path) -> None:
    codes, heavy, _ = _run([argv], tmp_path)
    assert codes == [0] and heavy == [], f"stealkit {' '.join(argv)} loaded {heavy}"


def test_every_commands_help_loads_no_torch(tmp_path: Path) -> None:
    from stealkit.cli import cli

    def paths(group: object, prefix: list[str]) -> list[list[str]]:
        out = []
        for name, cmd in group.commands.items():  # type: ignore[attr-defined]
            out.append([*prefix, name])
            if hasattr(cmd, "commands"):
                out.extend(paths(cmd, [*prefix, name]))
        return out

    argvs = [[*p, "--help"] for p in paths(cli, [])]
    assert len(argvs) > 20
    codes, heavy, _ = _run(argvs, tmp_path)
    assert codes == [0] * len(argvs) and heavy == [], heavy


@pytest.mark.parametrize("argv", [
    ["extract", "surrogate", "--victim", "/nonexistent/path", "--budget", "10", "--out", "X"],
    ["audit", "--victim", "/nonexistent", "--out", "X"],
], ids=lambda a: " ".join(a[:2]))
def test_a_missing_victim_is_one_line_before_torch(argv: list[str], tmp_path: Path) -> None:
    codes, heavy, err = _run([argv], tmp_path)
    lines = err.strip().splitlines()
    assert codes == [2] and len(lines) == 1 and lines[0].startswith("error: --victim /nonexistent"), err
    assert heavy == [], f"refusing a missing --victim loaded {heavy}"
    assert not (tmp_path / "X").exists()
