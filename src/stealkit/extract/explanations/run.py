"""The runners of ``stealkit extract gradient-matching`` and ``stealkit extract exact``: reconstruction from
explanations (Milli et al. 2019): :func:`run_gradient_matching`, :func:`run_exact` (with :func:`open_exact`,
the victim as exact recovery opens it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stealkit.errors import InputError
from stealkit.extract.common import ExtractionResult, ExtractionRun, save_extraction, student_factory
from stealkit.extract.registry import METHODS
from stealkit.oracle.victim import Target, Victim, make_evaluator, own_data_config, victim_splits, victim_test
from stealkit.rundir import RunDir
from stealkit.settings import apply_settings


@dataclass(frozen=True)
class GradMatchOptions:
    """Every option of ``stealkit extract gradient-matching`` but the target's, the budget, the checkpoints and
    ``--out``; the defaults are the command's. ``settings``: ``--set`` on the config, already parsed."""

    membership_only: bool = False
    explanation: str = "gradient"
    smooth_sigma: float = 0.3
    smooth_samples: int = 10
    lam: float = 1.0
    pool: str = "pool"
    student: str = "conv2"
    student_kwargs: Mapping[str, Any] = field(default_factory=dict)
    steps: int = 600
    settings: Mapping[str, Any] = field(default_factory=dict)


def run_gradient_matching(target: Target, budget: int, *, checkpoints: Sequence[int] | None = None,
                          options: GradMatchOptions = GradMatchOptions(), out: str | Path) -> ExtractionRun:
    """A reconstruction of ``target`` trained on ``budget`` inputs' answers and (unless ``membership_only``)
    input-gradient explanations (l_G + lambda l_M), scored at each of ``checkpoints`` (default: the budget):
    exactly what the command runs."""
    from stealkit.data import load_query_source

    o = options
    cps = tuple(checkpoints) if checkpoints else (budget,)
    kwargs = dict(o.student_kwargs)
    v = target.open(mode="probs", budget=None if o.membership_only else 2 * budget, explain=not o.membership_only)
    if not o.membership_only:
        v.oracle.ledger.budgets["predict"] = budget
        v.oracle.ledger.budgets["explain"] = budget
    else:
        v.oracle.ledger.budget = budget
    test = victim_test(v, target.data_dir)
    x_pool = load_query_source(o.pool, input_shape=v.input_shape, n=max(cps), seed=target.seed,
                               data_dir=target.data_dir, victim_dataset=v.dataset, split_seed=v.split_seed,
                               features=v.features)
    from stealkit.models.zoo import student_for

    student = student_for(o.student, v.input_shape)  # a feature-vector victim: mlp in place of an image network
    method = METHODS["gradient-matching"]
    config = method.config(use_gradients=not o.membership_only, explanation=o.explanation,  # type: ignore[misc]
                           lam=o.lam, smooth_sigma=o.smooth_sigma, smooth_samples=o.smooth_samples, steps=o.steps,
                           seed=target.seed)
    config = apply_settings(config, dict(o.settings), who="gradient-matching")
    cfg = {"victim": target.location, "budget": budget, "pool": o.pool, "student": student,
           "student_kwargs": kwargs, "dataset": v.dataset, "gradmatch": config,
           **own_data_config(v, {"--pool": o.pool}, target.data_dir)}
    run = RunDir(out).create(command="extract gradient-matching", seed=target.seed, config=cfg)
    result = method.run(v.oracle, x_pool, make_student=student_factory(student, v, target.seed, **kwargs),
                        evaluator=make_evaluator(v, test.x, test.y, target.device),
                        config=config, checkpoints=cps, device=target.device, on_point=run.append_record)
    save_extraction(run, result, v, student_arch=student, student_kwargs=kwargs, seed=target.seed, config=cfg)
    return ExtractionRun(path=run.path, result=result, victim=v, config=cfg)


def open_exact(target: Target, *, variant: str = "gradient", budget: int | None = None) -> Victim:
    """The victim as exact recovery opens it: logits (probabilities for ``logistic``), with explanations
    unless ``mq``."""
    return target.open(mode="probs" if variant == "logistic" else "logits", budget=budget, explain=variant != "mq")


def run_exact(target: Target, *, variant: str = "gradient", hidden: int | None = None, budget: int | None = None,
              search: str = "secant", lines: int = 40, anchors: int = 500, epsilon: float | None = None,
              settings: Mapping[str, Any] = {}, out: str | Path, victim: Victim | None = None) -> ExtractionRun:
    """Exact recovery of a two-layer ReLU ``target`` (Milli et al. Alg. 1, or 1-MQ with ``variant="mq"``) or the
    identification of a logistic one, scored and written to ``out``: exactly what the command runs. ``victim``:
    an already opened victim (:func:`open_exact`), whose ledger still holds what was spent when the recovery
    fails or exhausts its budget; default: opened here."""
    import torch

    from stealkit.extract.explanations.exact import relative_error

    v = victim if victim is not None else open_exact(target, variant=variant, budget=budget)
    seed, device = target.seed, target.device
    test = victim_test(v, target.data_dir)
    if variant != "logistic" and hidden is None:
        hidden = spec_hidden(v.spec)
        if hidden is None:
            raise InputError("pass --hidden, the victim's hidden width (the algorithm's input h)")
    cfg: dict[str, Any] = {"victim": target.location, "variant": variant, "budget": budget, "dataset": v.dataset,
                           **own_data_config(v, data_dir=target.data_dir)}
    run = RunDir(out).create(command="extract exact", seed=seed, config=cfg)
    extra: dict[str, Any] = {"variant": variant}
    method = METHODS[f"exact-{variant}"]
    if variant == "logistic":
        if settings:
            raise InputError("--set: the logistic identification has no settings")
        ident = method.run(v.oracle)
        student, arch, kwargs = ident.model, "logistic", {}
    else:
        assert hidden is not None
        config = method.config(search=search, lines=lines, epsilon=epsilon, seed=seed)  # type: ignore[misc]
        config = apply_settings(config, dict(settings), who="exact")
        cfg.update(hidden=hidden, exact=config)
        pool = victim_splits(v, target.data_dir).attacker_pool.x[:anchors]
        rec = method.run(v.oracle, hidden, config, anchors=pool)
        student, arch, kwargs = rec.model.to_mlp2(), "mlp2", {"hidden": rec.model.hidden}
        extra |= {"hidden_found": rec.hidden_found, "lines": rec.lines, "fit_residual": rec.fit_residual}
        if v.model is not None:
            x_rand = torch.rand(10_000, *v.input_shape, generator=torch.Generator().manual_seed(seed))
            extra |= {"max_relative_error_test": relative_error(v.model.double(), rec.model, test.x),
                      "max_relative_error_uniform": relative_error(v.model.double(), rec.model, x_rand)}
            v.model.float()
    evaluator = make_evaluator(v, test.x, test.y, device)
    scores = evaluator(student)
    result = ExtractionResult(method=f"exact-{variant}", student=student, queries=v.oracle.ledger.as_dict(),
                              accuracy=scores["accuracy"], fidelity=scores.get("fidelity"),
                              victim_accuracy=evaluator.victim_accuracy, extra=extra)
    save_extraction(run, result, v, student_arch=arch, student_kwargs=kwargs, seed=seed, config=cfg)
    return ExtractionRun(path=run.path, result=result, victim=v, config=cfg)


def spec_hidden(spec: Any) -> int | None:
    """A local zoo mlp2's hidden width (its spec's kwargs, else the architecture default); ``None`` otherwise."""
    if spec is None or getattr(spec, "arch", None) != "mlp2":
        return None
    from stealkit.models import arch_defaults

    return int({**arch_defaults("mlp2"), **(spec.kwargs or {})}["hidden"])
