"""The demo: train a digits victim, steal it through a metered oracle at several budgets, write a report.

Runs on the embedded scikit-learn digits in seconds on 2 CPU cores: the two oracles are stolen in two worker
processes, started before the victim is loaded (or trained, the first time) so that their start-up overlaps it.
The same student is stolen through a probability oracle and a label-only oracle, so the report shows what the
richer answer buys.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

from stealkit import __version__
from stealkit.report.html import Figure, Section, markup
from stealkit.rundir import RunDir

log = logging.getLogger(__name__)

#: four budgets: 20 and 50 queries (the steep start), 100 (most of the way) and 400 (the plateau). A fifth, 200,
#: cost 26% more student steps for a point between the last two (0.956 / 0.962, probabilities / labels).
DEFAULT_BUDGETS = (20, 50, 100, 400)


def run_demo(out: str | Path, *, seed: int = 0, budgets: tuple[int, ...] = DEFAULT_BUDGETS,
             victim_epochs: int = 40, student_epochs: int = 60, arch: str = "conv2",
             device: str = "cpu", jobs: int = 2) -> dict[str, Any]:
    """The demo; ``jobs`` > 1 steals through the two oracles in parallel processes (CPU only)."""
    import torch

    from stealkit.data import load_splits
    from stealkit.metrics import Evaluator, predict_labels
    from stealkit.report.builders import build_report
    from stealkit.train import TrainConfig
    from stealkit.victims import RECIPES, standard_victim, train_victim

    t0 = time.perf_counter()
    out = Path(out)
    victim_cfg = TrainConfig(epochs=victim_epochs, batch_size=64, seed=seed)
    student_cfg = TrainConfig(epochs=student_epochs, batch_size=32, seed=seed)
    config = {"dataset": "digits", "victim_arch": arch, "student_arch": arch, "budgets": list(budgets),
              "victim_train": victim_cfg.to_dict(), "student_train": student_cfg.to_dict()}
    run = RunDir(out).create(command="demo", seed=seed, config=config)

    modes = ("probs", "label")
    workers = None
    if jobs > 1 and device == "cpu" and "fork" in mp.get_all_start_methods():
        # the two oracles are independent: one forked process each, started before this process loads data and
        # the victim so that their start-up (torch's optimiser imports) overlaps that work; figures as in one process
        workers = mp.get_context("fork").Pool(min(jobs, len(modes)), initializer=_worker_setup,
                                              initargs=(torch.get_num_threads() // min(jobs, len(modes)),))
    try:
        log.info("training the victim (%s on digits, %d epochs)", arch, victim_epochs)
        if (arch, victim_cfg, seed) == ("conv2", RECIPES["digits-conv2"].train, 0):
            victim = standard_victim("digits-conv2", device=device)  # the same recipe: trained once, then cached
        else:
            victim = train_victim("digits", arch, victim_cfg, out=out / "victim", split_seed=seed, device=device)
        splits = load_splits("digits", seed=seed)
        evaluator = Evaluator(splits.test.x, splits.test.y, predict_labels(victim.model, splits.test.x))
        log.info("stealing through the probability and the label-only oracle at %s queries",
                 ", ".join(f"{b:,}" for b in budgets))
        steal = functools.partial(_steal, victim=victim, pool=splits.attacker_pool.x, evaluator=evaluator,
                                  budgets=budgets, arch=arch, student_cfg=student_cfg, seed=seed, device=device)
        results = workers.map(steal, modes) if workers is not None else [steal(mode) for mode in modes]
    finally:
        if workers is not None:
            workers.terminate()
            workers.join()
    summary: dict[str, Any] = {"victim_accuracy": evaluator.victim_accuracy, "stealkit_version": __version__,
                               "seed": seed}
    for mode, (curve, queries) in zip(modes, results, strict=True):
        for point in curve:
            run.append_record({"mode": mode, **point})
        key = "extraction" if mode == "probs" else "extraction_label"
        summary[key] = [{"queries": p["queries"], "accuracy": p["accuracy"], "fidelity": p["fidelity"]}
                        for p in curve]
        summary[f"ledger_{mode}"] = queries
    summary["wall_seconds"] = round(time.perf_counter() - t0, 1)
    run.write_summary(summary)
    run.write_report(build_report(run))
    log.debug("demo finished in %.1f s; report: %s", summary["wall_seconds"], run.report_path)
    return summary


def _worker_setup(threads: int) -> None:
    """A demo worker's start: ``threads`` intra-op threads (at least one; the processes are the parallelism, so
    together they use no more threads than the parent would), and the modules its training needs, imported
    while the parent loads the victim (the first optimiser pulls in ``torch._dynamo``, a second or more)."""
    import torch
    import torch._dynamo  # noqa: F401

    from stealkit.extract.surrogate_data import baseline  # noqa: F401

    torch.set_num_threads(max(1, threads))


def _steal(mode: str, *, victim: Any, pool: Any, evaluator: Any, budgets: tuple[int, ...], arch: str,
           student_cfg: Any, seed: int, device: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One oracle's curve: the same seeded student stolen at every budget, and the oracle's ledger."""
    import torch

    from stealkit.extract.surrogate_data.baseline import BaselineConfig, extract_baseline
    from stealkit.models import build_model
    from stealkit.oracle import LocalOracle

    oracle = LocalOracle(victim.model, victim.spec.input_shape, mode=mode, budget=max(budgets), device=device)

    def make_student() -> Any:
        torch.manual_seed(seed)
        return build_model(arch, input_shape=victim.spec.input_shape, num_classes=victim.spec.num_classes)

    curve: list[dict[str, Any]] = []
    result = extract_baseline(oracle, pool, make_student=make_student, evaluator=evaluator,
                              config=BaselineConfig(checkpoints=budgets, train=student_cfg, seed=seed),
                              on_point=curve.append, device=device)
    return curve, dict(result.queries)


def demo_sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    from stealkit.report.plots import line_plot

    series = {}
    for key, name in (("extraction", "probabilities"), ("extraction_label", "labels only")):
        pts = summary.get(key, [])
        series[f"accuracy, {name}"] = ([p["queries"] for p in pts], [p["accuracy"] for p in pts])
        series[f"fidelity, {name}"] = ([p["queries"] for p in pts], [p["fidelity"] for p in pts])
    uri = line_plot(series, xlabel="victim queries (from the oracle's ledger)", ylabel="accuracy (solid), fidelity (dashed)",
                    logx=True, hlines={"victim accuracy": summary.get("victim_accuracy", 0)}, ylim=(0, 1.02))
    rows = []
    for key, name in (("extraction", "probs"), ("extraction_label", "label")):
        rows.extend({"oracle": name, **p} for p in summary.get(key, []))
    intro = markup("A <code>{}</code> victim trained on the digits victim-train split (test accuracy {}) answers "
                   "queries from the attacker pool; a fresh student is trained on the answers at each budget. "
                   "Queries are read from the oracle's ledger.", config["config"]["victim_arch"],
                   f"{summary.get('victim_accuracy', 0):.3f}")
    return [Section("Extraction against budget", paragraphs=[intro], tables=[("", rows)],
                    figures=[Figure(uri, "Student accuracy and fidelity against victim queries")])]
