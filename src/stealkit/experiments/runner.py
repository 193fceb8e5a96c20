"""Run an experiment config into a run directory; finished steps are not redone on restart.

Each step runs its command in-process into ``OUT/STEP_ID``. A step is finished when its directory holds
``summary.json`` and a ``.step.json`` stamp with the step's fingerprint (command, arguments, seed); a
restarted run skips finished steps and re-runs the rest (commands that checkpoint resume from their own
checkpoints, so no query is spent twice).

The run's ``device`` (``run/sweep/reproduce --device``) goes to every step whose command takes ``--device``
and whose args do not name one; it is not part of the fingerprint, so a run resumed on another device keeps
its finished steps (each step's ``config.json`` records the device it ran on).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stealkit.errors import StealkitError
from stealkit.experiments.config import ExperimentConfig, substitute, to_argv
from stealkit.fsutil import atomic_write_json
from stealkit.rundir import RunDir, environment

log = logging.getLogger(__name__)


@dataclass
class StepOutcome:
    id: str
    command: str
    out: Path
    skipped: bool
    seconds: float
    summary: dict[str, Any]


def _takes(command: str, option: str) -> bool:
    """Whether ``command`` has the option ``option`` (``--seed``, ``--device``)."""
    from stealkit.cli import cli
    from stealkit.experiments.config import _resolve_command

    cmd = _resolve_command(cli, command, "config")
    return any(option in p.opts for p in cmd.params if hasattr(p, "opts"))


def step_done(out: Path, fingerprint: str) -> bool:
    stamp = out / ".step.json"
    if not (stamp.exists() and (out / "summary.json").exists()):
        return False
    try:
        return json.loads(stamp.read_text()).get("fingerprint") == fingerprint
    except json.JSONDecodeError:
        return False


def _invoke(argv: list[str], step_id: str, command: str) -> None:
    """Run one CLI command in-process; a failure becomes a :class:`StealkitError` that carries its message."""
    import click

    from stealkit.cli import cli

    def failed(why: str) -> StealkitError:
        return StealkitError(f"step {step_id!r} ({command}) failed: {why}. Fix it and run again: finished steps "
                             "are kept")

    try:
        rv = cli.main(args=argv, prog_name="stealkit", standalone_mode=False)
    except StealkitError as exc:
        raise failed(str(exc)) from exc
    except click.ClickException as exc:
        raise failed(exc.format_message()) from exc
    except click.exceptions.Abort as exc:
        raise failed("aborted") from exc
    if isinstance(rv, int) and rv != 0:
        raise failed(f"exit code {rv}")


def _stamped_seconds(out: Path) -> float:
    """The wall time a finished step took when it ran (0 for stamps written before it was recorded)."""
    try:
        return float(json.loads((out / ".step.json").read_text()).get("seconds", 0.0))
    except (OSError, ValueError, TypeError):
        return 0.0


def run_experiment(config: ExperimentConfig, out: str | Path, *, force: bool = False,
                   device: str | None = None) -> list[StepOutcome]:
    """Run every step of ``config`` into ``out``; writes ``out/experiment.json`` and ``out/summary.json``.

    ``device``: passed as ``--device`` to each step that takes it and does not set its own (``None``: the
    steps resolve their own default, ``$STEALKIT_DEVICE`` or auto)."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "experiment.json", {"config": config.to_dict(), **environment(), "device": device})
    env = {"seed": str(config.seed), "out": str(out)}
    outcomes: list[StepOutcome] = []
    for step in config.steps:
        step_out = out / step.id
        env[step.id] = str(step_out)
        fp = step.fingerprint(config.seed)
        if not force and step_done(step_out, fp):
            log.info("step %s already finished; skipping", step.id)
            outcomes.append(StepOutcome(step.id, step.command, step_out, True, _stamped_seconds(step_out),
                                        RunDir(step_out).load_summary()))
            continue
        args = substitute(dict(step.args), env)
        if "seed" not in args and _takes(step.command, "--seed"):
            args["seed"] = config.seed
        if device is not None and "device" not in args and _takes(step.command, "--device"):
            args["device"] = device
        args["out"] = str(step_out)
        argv = to_argv(step.command, args)
        log.info("step %s: stealkit %s", step.id, " ".join(argv))
        t0 = time.perf_counter()
        _invoke(argv, step.id, step.command)
        seconds = time.perf_counter() - t0
        atomic_write_json(step_out / ".step.json", {"fingerprint": fp, "argv": argv, "seconds": seconds})
        outcomes.append(StepOutcome(step.id, step.command, step_out, False, seconds, RunDir(step_out).load_summary()))
    final = outcomes[-1].summary if outcomes else {}
    atomic_write_json(out / "summary.json", {
        "name": config.name, "seed": config.seed,
        "steps": [{"id": o.id, "command": o.command, "skipped": o.skipped, "seconds": round(o.seconds, 2)}
                  for o in outcomes],
        "final": final,
    })
    return outcomes
