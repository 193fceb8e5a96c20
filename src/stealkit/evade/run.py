"""The runners of ``stealkit attack``: :func:`run_transfer` (craft on a substitute, count successes on the
victim) and :func:`run_decision` (decision-based attacks on the victim's labels). Each writes the run directory
(config.json, adversarial.npz, records.jsonl, summary.json, report.html) and returns an :class:`AttackRun`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.inputs import load_model_substitute, load_start_pool
from stealkit.evade.registry import ATTACKS
from stealkit.oracle.victim import Target, Victim, module_location, own_data_config, victim_test
from stealkit.rundir import RunDir


@dataclass
class AttackRun:
    """An attack's run directory and what its summary.json holds."""

    path: Path
    summary: dict[str, Any]

    @property
    def queries(self) -> dict[str, int]:
        """The victim ledger's counts by kind."""
        return {k: int(v) for k, v in dict(self.summary["victim_queries"]).items()}

    @property
    def asr(self) -> float | None:
        return self.summary.get("asr")

    @property
    def attempts(self) -> int | None:
        return self.summary.get("attempts")

    @property
    def successes(self) -> int | None:
        return self.summary.get("successes")

    @property
    def median_l2(self) -> float | None:
        """The median perturbation norm of the successful examples."""
        return self.summary.get("median_norm_successful")

    @property
    def median_queries_per_image(self) -> float | None:
        return self.summary.get("median_queries_per_image")

    @property
    def victim_accuracy(self) -> float | None:
        return self.summary.get("victim_accuracy")

    @property
    def substitute_agreement(self) -> float | None:
        return self.summary.get("substitute_agreement")

    @property
    def report(self) -> Path:
        return self.path / "report.html"


def run_transfer(target: Target, method: str, substitute: str | Path | nn.Module, *, n: int = 1000,
                 budget: int | None = None, targeted: str | None = None, eps: float = 0.1, norm: str = "linf",
                 steps: int = 10, step: float | None = None, restarts: int = 1, kappa: float = 0.0,
                 batch_size: int = 256, settings: Mapping[str, Any] = {}, out: str | Path) -> AttackRun:
    """A transfer attack (``method`` of :data:`~stealkit.evade.registry.TRANSFER`) crafted on ``substitute``
    (a model or extraction run directory, a TorchScript file, or an ``nn.Module``) against ``n`` seeded test
    images of ``target``, answered as labels: what ``stealkit attack METHOD`` runs."""
    from stealkit.models.locate import load_substitute
    from stealkit.settings import apply_settings

    if isinstance(substitute, nn.Module):
        sub, where = substitute.to(target.device).eval(), module_location(substitute)
    else:
        sub, where = load_substitute(substitute, device=target.device), os.fspath(substitute)
    v = target.open(mode="label", budget=budget)
    if not isinstance(substitute, nn.Module):
        check_ranges(substitute, v)
    x, y = sample_test_images(v, target.data_dir, n, target.seed)
    spec = ATTACKS[method]
    cfg = spec.config(method=method, eps=eps, steps=steps, step=step, norm=norm, targeted=targeted,
                      restarts=restarts, kappa=kappa, seed=target.seed, batch_size=batch_size)
    cfg = apply_settings(cfg, dict(settings), who=method)
    run = RunDir(out).create(command=f"attack {method}", seed=target.seed, config={
        "substitute": where, "victim": target.location, "dataset": v.dataset, "n": n, "attack": cfg,
        **own_data_config(v, data_dir=target.data_dir)})
    res = spec.run(sub, v.oracle, x.to(target.device), y.to(target.device), cfg)
    arrays = res.arrays()
    save_npz(run.path / "adversarial.npz", arrays | feature_arrays(v, arrays))
    summary = res.summary() | {"substitute": where, "victim": target.location, "seed": target.seed} | space_of(v)
    finish(run, summary)
    return _written(run)


def run_decision(target: Target, method: str, *, max_queries: int = 5000, n: int = 1000, budget: int | None = None,
                 iterations: int | None = None, substitute: str | Path | None = None, start_pool: str | None = None,
                 preset: str | None = None, targeted: str | None = None, settings: Mapping[str, Any] = {},
                 out: str | Path) -> AttackRun:
    """A decision-based attack (``method`` of :data:`~stealkit.evade.registry.DECISION`) on ``target``'s labels,
    minimum L2, on the ``n`` seeded test images it classifies correctly: what ``stealkit attack METHOD`` runs.
    ``preset=None``: ``tuned`` for hopskipjump and triangle, ``paper`` otherwise."""
    from stealkit.oracle import labels_from_answer
    from stealkit.settings import apply_settings

    preset = preset if preset is not None else ("tuned" if method in ("hopskipjump", "triangle") else "paper")
    if targeted is not None:
        raise InputError("decision-based targeted attacks need start images of the target class; use the "
                         "Python API (starting_points=) or drop --targeted")
    if max_queries < 1:
        raise InputError(f"--max-queries must be a positive number of queries per image, got {max_queries}")
    if start_pool is not None and substitute is not None:
        raise InputError("--start-pool and --substitute both make the starting points: give one")
    sub_path = os.fspath(substitute) if substitute is not None else None
    v = target.open(mode="label", budget=budget)
    sub = load_model_substitute(sub_path, v, target.device) if sub_path is not None else None
    if sub_path is not None:
        check_ranges(sub_path, v)
    x, y = sample_test_images(v, target.data_dir, n, target.seed)
    pool = load_start_pool(start_pool, v, target.data_dir) if start_pool is not None else None
    spec = ATTACKS[method]
    rounds: dict[str, object] = {"boundary": {"steps": iterations or 5000},
                                 "triangle": {"steps": iterations or 100_000}}.get(
                                     method, {"iterations": iterations or 40})
    if method == "hopskipjump" and preset == "tuned":
        from stealkit.evade.decision_based.hopskipjump import tuned_settings

        tuned = tuned_settings(substitute=sub is not None, shape=tuple(v.oracle.input_shape),
                               budgeted=True, pool=pool is not None)  # --max-queries: a per-image budget
        rounds = rounds | tuned
    elif method == "triangle" and preset == "tuned":
        from stealkit.evade.decision_based.triangle import TUNED

        rounds = rounds | TUNED
    config = apply_settings(spec.config(seed=target.seed, **rounds), dict(settings), who=method)  # type: ignore[misc]
    clean = v.oracle.query(x)  # which images the victim gets right (charged)
    ok = (labels_from_answer(clean, v.oracle.mode).cpu() == y).nonzero().squeeze(1)
    if ok.numel() == 0:
        raise InputError(f"the victim classifies none of the {len(y)} sampled test images correctly, so there "
                         "is nothing to attack; raise --n or check the victim and --dataset")
    run_config = {"victim": target.location, "dataset": v.dataset, "n": n, "max_queries": max_queries,
                  "iterations": iterations, "substitute": sub_path} | (
                      {"preset": preset} if method in ("hopskipjump", "triangle") else {}) | (
                      {"settings": dict(settings)} if settings else {}) | (
                      {"start_pool": start_pool, "start_pool_images": len(pool)} if pool is not None else {}) | (
                      own_data_config(v, data_dir=target.data_dir))
    run = RunDir(out).create(command=f"attack {method}", seed=target.seed, config=run_config)
    if v.oracle.ledger.budget is None:  # the query bar's end: every image may spend --max-queries
        from stealkit.progress import expect

        expect(v.oracle.ledger.total + int(ok.numel()) * max_queries)
    res = spec.run(v.oracle, x[ok], y[ok], max_queries=max_queries, config=config, substitute=sub,
                   **({"start_pool": pool} if pool is not None else {}))
    x_adv = x.clone()
    x_adv[ok] = res.x_adv
    attempted = torch.zeros(len(y), dtype=torch.bool)
    attempted[ok] = True
    success = torch.zeros(len(y), dtype=torch.bool)
    success[ok] = res.success
    arrays = {"x": x.numpy(), "x_adv": x_adv.numpy(), "y": y.numpy(), "attempted": attempted.numpy(),
              "success": success.numpy()}
    save_npz(run.path / "adversarial.npz", arrays | feature_arrays(v, arrays))
    per = res.extra["queries_per_example"].float()
    summary = {"method": method, "asr": res.success_rate if ok.numel() else None, "attempts": int(ok.numel()),
               "successes": int(res.success.sum()), "victim_queries": v.oracle.ledger.as_dict(),
               "median_norm_successful": res.summary()["median_norm_successful"],
               "median_queries_per_image": float(per.median()) if per.numel() else None,
               "victim": target.location, "seed": target.seed} | space_of(v)
    finish(run, summary)
    return _written(run)


def _written(run: RunDir) -> AttackRun:
    """The run as its summary.json records it (figures as written)."""
    import json

    return AttackRun(run.path, json.loads((run.path / "summary.json").read_text()))


def sample_test_images(v: Victim, data_dir: str | None, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` test images of the victim's task and their labels, a seeded sample."""
    if n < 1:
        raise InputError(f"--n must be a positive number of images, got {n}")
    test = victim_test(v, data_dir)
    idx = torch.randperm(len(test.y), generator=torch.Generator().manual_seed(seed))[:n]
    return test.x[idx], test.y[idx]


def check_ranges(substitute: str | Path, v: Victim) -> None:
    """Warn when a feature-vector victim's substitute (an extraction run) was trained under other feature ranges:
    its points of [0, 1]^d then mean other features."""
    import json
    import logging

    if v.features is None:
        return
    config = Path(substitute) / "config.json"
    try:
        recorded = json.loads(config.read_text())["config"]["feature_ranges"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if recorded != v.features.digest:
        logging.getLogger(__name__).warning(
            "the substitute %s was trained under other feature ranges (sha256 %s...) than the victim is opened under "
            "(%s...): its points of [0, 1]^d mean other features; give both the same --test-data or ranges file",
            substitute, recorded[:12], v.features.digest[:12])


def space_of(v: Victim) -> dict[str, str]:
    """For a feature-vector victim, the space its norms and eps are measured in (the summary says it)."""
    if v.features is None:
        return {}
    return {"space": f"[0, 1]^{v.features.d}: each feature's range ({v.features.source}) mapped onto [0, 1]; eps "
                     "and norms are in these units"}


def feature_arrays(v: Victim, arrays: Mapping[str, Any]) -> dict[str, Any]:
    """For a feature-vector victim, the clean and adversarial points as the model's raw features
    (``x_features``, ``x_adv_features``: ``FeatureRange.to_model`` of ``x`` and ``x_adv``), else nothing."""
    if v.features is None:
        return {}
    return {f"{k}_features": v.features.to_model(torch.as_tensor(arrays[k]).double()).numpy()
            for k in ("x", "x_adv")}


def save_npz(path: Path, arrays: dict[str, Any]) -> None:
    """``arrays`` as a compressed ``.npz``, written atomically."""
    import numpy as np

    from stealkit.fsutil import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def finish(run: RunDir, summary: dict[str, Any]) -> None:
    """Per-example records (from ``adversarial.npz``), the summary, the report."""
    from stealkit.report.builders import build_report

    npz = run.path / "adversarial.npz"
    if npz.exists():
        import numpy as np

        with np.load(npz) as data:
            delta = (data["x_adv"] - data["x"]).reshape(len(data["x"]), -1)
            l2, linf = np.linalg.norm(delta, axis=1), np.abs(delta).max(axis=1)
            for i in range(len(delta)):
                run.append_record({"index": i, "label": int(data["y"][i]),
                                   **{k: bool(data[k][i]) for k in ("attempted", "success") if k in data},
                                   "l2": float(l2[i]), "linf": float(linf[i])})
    run.write_summary(summary)
    run.write_report(build_report(run))
