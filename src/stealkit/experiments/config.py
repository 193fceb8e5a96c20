"""Experiment configs: a TOML file naming a sequence of stealkit commands and their arguments.

```toml
name = "digits-baseline"
seed = 0                      # passed as --seed to every step that takes one

[[step]]
id = "victim"                 # the step writes to OUT/victim
command = "train"
args = { dataset = "digits", arch = "conv2", epochs = 40 }

[[step]]
id = "steal"
command = "extract baseline"
args = { victim = "${victim}", mode = "probs", budget = 400, checkpoints = "50,100,200,400" }
```

``${ID}`` stands for the output directory of an earlier step, ``${seed}`` for the seed, ``${out}`` for the
run's directory. A value may be a list (``checkpoints = [50, 100]`` becomes ``50,100``) or a boolean (a
flag). Because every capability is a command, any of them (train, extract, attack, certify, study) is an
experiment step with no glue code.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stealkit.errors import InputError

_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_REF = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")


@dataclass(frozen=True)
class Step:
    id: str
    command: str
    args: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self, seed: int) -> str:
        blob = json.dumps({"command": self.command, "args": self.args, "seed": seed}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    seed: int
    steps: tuple[Step, ...]
    description: str = ""
    paper: dict[str, Any] = field(default_factory=dict)  # the paper's numbers this experiment reproduces

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "description": self.description, "paper": self.paper,
                "step": [{"id": s.id, "command": s.command, "args": s.args} for s in self.steps]}

    def with_value(self, key: str, value: Any) -> ExperimentConfig:
        """A copy with ``seed``, or ``STEP.ARG``, set to ``value`` (for sweeps)."""
        if key == "seed":
            return ExperimentConfig(self.name, int(value), self.steps, self.description, self.paper)
        if "." not in key:
            raise InputError(f"sweep key {key!r} must be 'seed' or STEP.ARG (steps: {[s.id for s in self.steps]})")
        sid, arg = key.split(".", 1)
        if sid not in {s.id for s in self.steps}:
            raise InputError(f"sweep key {key!r}: no step {sid!r}; steps are {[s.id for s in self.steps]}")
        steps = tuple(
            Step(s.id, s.command, {**copy.deepcopy(s.args), arg: value}) if s.id == sid else s for s in self.steps
        )
        return ExperimentConfig(self.name, self.seed, steps, self.description, self.paper)


def parse_config(data: dict[str, Any], *, source: str = "config") -> ExperimentConfig:
    """Validate a config dictionary (as read from TOML)."""
    from stealkit.cli import cli

    unknown = set(data) - {"name", "seed", "step", "description", "paper"}
    if unknown:
        raise InputError(f"{source}: unknown top-level keys {sorted(unknown)}; expected name, seed, step, description")
    raw_steps = data.get("step")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise InputError(f"{source}: needs at least one [[step]] table with a command")
    steps: list[Step] = []
    for i, raw in enumerate(raw_steps):
        if not isinstance(raw, dict) or "command" not in raw:
            raise InputError(f"{source}: step {i + 1} needs a 'command' (e.g. command = \"extract baseline\")")
        sid = str(raw.get("id", f"step{i + 1}"))
        if not _ID.match(sid) or sid in {s.id for s in steps}:
            raise InputError(f"{source}: step id {sid!r} must be unique and made of letters, digits, _ . -")
        command = str(raw["command"]).strip()
        _resolve_command(cli, command, source)
        args = raw.get("args", {})
        if not isinstance(args, dict):
            raise InputError(f"{source}: args of step {sid!r} must be a table")
        extra = set(raw) - {"id", "command", "args"}
        if extra:
            raise InputError(f"{source}: step {sid!r} has unknown keys {sorted(extra)}; put options under args")
        for ref in _refs(args):
            if ref not in {"seed", "out"} and ref not in {s.id for s in steps}:
                raise InputError(f"{source}: step {sid!r} refers to ${{{ref}}}, which is not an earlier step")
        steps.append(Step(sid, command, dict(args)))
    seed = data.get("seed", 0)
    if not isinstance(seed, int):
        raise InputError(f"{source}: seed must be an integer")
    return ExperimentConfig(str(data.get("name", Path(source).stem)), seed, tuple(steps),
                            str(data.get("description", "")), dict(data.get("paper", {})))


def load_config(path: str | Path) -> ExperimentConfig:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"config file {path} not found")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(data, source=str(path))


def _resolve_command(cli: Any, command: str, source: str) -> Any:
    import click

    node = cli
    for word in command.split():
        if not isinstance(node, click.Group) or word not in node.commands:
            raise InputError(f"{source}: unknown command {command!r}; run 'stealkit --help' for the commands")
        node = node.commands[word]
    if isinstance(node, click.Group):
        raise InputError(f"{source}: {command!r} is a group; name one of {sorted(node.commands)}")
    return node


def _refs(value: Any) -> set[str]:
    if isinstance(value, str):
        return set(_REF.findall(value))
    if isinstance(value, dict):
        return set().union(*(_refs(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value)) if value else set()
    return set()


def substitute(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _REF.sub(lambda m: env[m.group(1)], value)
    if isinstance(value, list):
        return [substitute(v, env) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, env) for k, v in value.items()}
    return value


def to_argv(command: str, args: dict[str, Any]) -> list[str]:
    """``("extract baseline", {"budget": 10, "checkpoints": [5, 10]})`` -> CLI argument list.

    A list becomes a repeated option when the command's option is ``multiple`` (``arch_arg = ["depth=8"]``),
    else one comma-separated value. ``True`` is a flag; ``False`` leaves it out.
    """
    from stealkit.cli import cli

    cmd = _resolve_command(cli, command, "config")
    multiple = {name for p in cmd.params if getattr(p, "multiple", False) for name in p.opts}
    argv = command.split()
    for key, value in args.items():
        opt = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                argv.append(opt)
            continue
        if isinstance(value, list):
            if opt in multiple:
                for v in value:
                    argv += [opt, str(v)]
                continue
            value = ",".join(str(v) for v in value)
        argv += [opt, str(value)]
    return argv
