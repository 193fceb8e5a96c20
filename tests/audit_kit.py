"""The audit's tests call :func:`stealkit.audit.run.run_audit` through :func:`run_audit_command`: the command's
keywords (``budgets="20,40"``, ``recipe=[...]`` in the old ``--recipe`` spelling, sizes as keywords) mapped to
:class:`~stealkit.audit.options.AuditOptions`; returns the failed gates, as the command's exit code reads them. :func:`kill_when` stops an audit run as a
separate process at a chosen moment (the resume tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stealkit.audit.kinds import part_id  # noqa: F401  (the tests name parts by it)
from stealkit.audit.options import AuditOptions, parse_answers, parse_gradmatch, parse_ints, recipe_from_args
from stealkit.audit.run import run_audit

SIZES = ("transfer_images", "decision_images", "decision_queries", "datafree_budget", "exact_budget", "seeds")


def options(*, victim: Any, out: str, answers: str = "label,topk,probs", budgets: str | None = None,
            recipe: Any = (), settings: dict[str, Any] | None = None, gradmatch_budgets: str | None = None,
            defences: Any = (), fail_if: Any = (), **kw: Any) -> AuditOptions:
    sizes = {k: kw.pop(k) for k in SIZES if k in kw}
    if gradmatch_budgets is not None:
        sizes["gradmatch"] = parse_gradmatch(gradmatch_budgets)
    return AuditOptions(victim=victim, out=out, answers=parse_answers(answers),
                        budgets=parse_ints(budgets) if budgets else None,
                        recipe={**recipe_from_args(list(recipe)), **(settings or {})}, defences=tuple(defences),
                        fail_if=tuple(fail_if), sizes=sizes, **kw)


def run_audit_command(*, on_part: Any = None, plan_only: bool = False, **kw: Any) -> list[str]:
    result = run_audit(options(**kw), plan_only=plan_only, on_part=on_part)
    return [] if plan_only else result.failed


def kill_when(proc: subprocess.Popen[bytes], ready: Callable[[], bool], log: Path) -> None:
    """SIGKILL the process group of ``proc`` (started with ``start_new_session=True``) once ``ready()`` is true,
    polled every 50 ms; fails with the end of ``log`` if the process ends first. The group is killed whatever
    happens (``ready`` may assert)."""
    try:
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            if ready():
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
