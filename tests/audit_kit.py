"""The audit's tests call :func:`stealkit.audit.run.run_audit` through :func:`run_audit_command`: the command's
keywords (``budgets="20,40"``, ``recipe=[...]`` in the old ``--recipe`` spelling, sizes as keywords) mapped to
:class:`~stealkit.audit.options.AuditOptions`; returns the failed gates, as the command's exit code reads them."""

from __future__ import annotations

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
