"""The STN study at CPU scale: Li et al. (NeurIPS 2019) Sec. 6 and Appendices A and D on digits / Fashion-MNIST.

Parts (each a section of the report, each row a record in ``records.jsonl``):

- ``bounds``: Appendix A / Figure 4, the Renyi, Cohen and PixelDP radii over a (p1, p2) lattice, where each
  dominates and where the ordering flips; the reference code's fixed alpha grid against our supremum.
- ``certify``: Figure 1, certified accuracy against L2 radius for several sigmas (STN models), with PixelDP's
  and Cohen's bound and the model without stability training beside it.
- ``ablation``: certified accuracy of stability training, Gaussian augmentation only, and no noise training.
- ``table1``: Table 1 analogue, certified radius with its accuracy, and natural accuracy, per model; TRADES
  and PGD-trained models (not certifiable) get their empirical EOT-PGD L2 accuracy at the same radius.
- ``empirical``: Figures 2-3, accuracy under EOT-PGD Linf and L2, C&W L2 with EOT and the Boundary attack
  (App. D.2) for STN at several sigmas (sigma = 0 is the base model without noise) and the TRADES baseline.
- ``soundness``: every certified test point attacked inside its certified radius (EOT-PGD L2); the smoothed
  prediction re-estimated with fresh noise must not change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from stealkit.certify.bounds import cohen_radius, pixeldp_radius, renyi_radius, renyi_radius_reference
from stealkit.certify.evaluate import (
    certified_accuracy,
    empirical_robust_accuracy,
    soundness_check,
    summarize,
)
from stealkit.certify.smoothing import Certificate, SmoothingConfig, certify
from stealkit.errors import InputError
from stealkit.report.html import Figure, Section
from stealkit.report.plots import line_plot
from stealkit.rundir import RunDir
from stealkit.victims import robust_recipe as recipe
from stealkit.victims import robust_victim

log = logging.getLogger(__name__)

Record = Callable[[dict[str, Any]], None]


NAME = "stn-certify"
KIND = "certify-study"
SOURCE = "Li et al. (NeurIPS 2019), Section 6 and appendices A, D"
#: the paper's numbers the study sets ours beside (Table 1, MNIST, STN with the Renyi bound)
PAPER = {"table1_mnist_certified_accuracy": {"radius": 1.58, "accuracy": 0.69}}
PARTS = ("bounds", "certify", "ablation", "table1", "empirical", "soundness")


@dataclass(frozen=True)
class StudyConfig:
    """What the study runs. ``for_dataset`` gives the CPU-scale defaults per data set."""

    dataset: str = "digits"
    arch: str = "conv2"
    sigmas: tuple[float, ...] = (0.25, 0.5, 1.0)
    main_sigma: float = 0.5
    baselines: tuple[str, ...] = ("trades", "pgd")
    adv_eps: float = 0.1
    epochs: int | None = None
    num_certify: int = 200
    n0: int = 100
    n: int = 1000
    alpha: float = 0.001
    num_attack: int = 100
    eot_samples: int = 10
    n_predict: int = 100
    pgd_steps: int = 20
    l2_eps: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
    linf_eps: tuple[float, ...] = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
    radii: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
    table_radius: float = 0.5
    cw_steps: int = 100
    boundary_steps: int = 200
    soundness_num: int = 60
    lattice_step: float = 0.01
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    parts: tuple[str, ...] = PARTS
    device: str = "cpu"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        if not self.parts or any(p not in PARTS for p in self.parts):
            raise InputError(f"parts must name some of {', '.join(PARTS)}, got {self.parts}")

    @classmethod
    def for_dataset(cls, dataset: str, *, quick: bool = False, full: bool = False) -> StudyConfig:
        """CPU-scale defaults per data set; ``full``: the paper's sample sizes (Sec. 6: n = 100k noise samples
        as in Cohen et al.'s CERTIFY, 500 test points, sigma in {0.25, 0.5, 0.7, 1.0} with 0.7 the paper's MNIST
        choice), meant for a GPU."""
        if quick and full:
            raise InputError("--quick and --scale full exclude each other")
        if dataset == "digits":
            cfg = cls(dataset="digits")
        elif dataset == "fashion-mnist":
            cfg = cls(dataset="fashion-mnist", sigmas=(0.5,), baselines=(), adv_eps=0.1, num_certify=200,
                      num_attack=100, l2_eps=(0.0, 0.5, 1.0, 1.5, 2.0, 3.0), radii=(0.0, 0.25, 0.5, 0.75, 1.0, 1.5),
                      table_radius=0.5, soundness_num=40)
        else:
            raise InputError(f"no study defaults for {dataset!r}; use digits or fashion-mnist")
        if full:
            cfg = StudyConfig(**{**asdict(cfg), "sigmas": (0.25, 0.5, 0.7, 1.0), "main_sigma": 0.7, "n": 100_000,
                                 "num_certify": 500, "num_attack": 500, "soundness_num": 100})
        if quick:
            cfg = StudyConfig(**{**asdict(cfg), "sigmas": cfg.sigmas[:2], "num_certify": 20, "n": 200, "n0": 20,
                                 "num_attack": 10, "eot_samples": 2, "n_predict": 20, "pgd_steps": 3, "cw_steps": 5,
                                 "boundary_steps": 10, "soundness_num": 5, "lattice_step": 0.05, "epochs": 2})
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- Appendix A ------------------------------------------------------------------------------------------


def bound_lattice(step: float = 0.01, sigma: float = 1.0) -> dict[str, Any]:
    """Compare the three radii over the lattice ``p1 > p2 >= 0, p1 + p2 <= 1`` with spacing ``step``."""
    g = np.round(np.arange(step, 1.0, step), 10)
    p1, p2 = np.meshgrid(g, np.concatenate([[0.0], g]), indexing="ij")
    keep = (p1 > p2) & (p1 + p2 <= 1 + 1e-12)
    p1, p2 = p1[keep], np.minimum(p2[keep], 1 - p1[keep])
    r, ref = renyi_radius(p1, p2, sigma), renyi_radius_reference(p1, p2, sigma)
    d, c1, c2 = pixeldp_radius(p1, p2, sigma), cohen_radius(p1, sigma), cohen_radius(p1, sigma, p2)
    region = p1 + p2 >= 0.2 - 1e-9
    pos = region & (d > 0)
    flips = ~region & (d > r)
    cohen_below = (r > c1) & (p1 > 0.5)
    gain = r - ref
    return {
        "points": int(len(p1)), "step": step, "sigma": sigma,
        "renyi_ge_reference_everywhere": bool(np.all(r >= ref - 1e-12)),
        "renyi_gain_over_reference_max": float(gain.max()),
        "renyi_gain_at": [float(p1[gain.argmax()]), float(p2[gain.argmax()])],
        "renyi_gt_pixeldp_in_region": bool(np.all(r[region] > d[region])),
        "renyi_over_pixeldp_min_ratio_in_region": float(np.min(r[pos] / d[pos])) if pos.any() else None,
        "renyi_over_pixeldp_median_ratio": float(np.median(r[pos] / d[pos])) if pos.any() else None,
        "pixeldp_gt_renyi_points": int(flips.sum()),
        "pixeldp_gt_renyi_max_p1_plus_p2": float((p1 + p2)[flips].max()) if flips.any() else None,
        "cohen2_ge_renyi_everywhere": bool(np.all(c2 >= r - 1e-9)),
        "cohen1_lt_renyi_points_with_p1_gt_half": int(cohen_below.sum()),
        "cohen1_ge_renyi_when_two_class": bool(np.all((c1 >= r - 1e-9)[np.isclose(p1 + p2, 1.0)])),
        "cohen1_lt_renyi_examples": [[float(a), float(b)] for a, b in zip(p1[cohen_below][::97][:5],
                                                                            p2[cohen_below][::97][:5], strict=True)],
    }


def bound_curves(sigma: float = 1.0, points: int = 60) -> dict[str, dict[str, list[float]]]:
    """Radius against p1 with p2 = 1 - p1 (two classes) and p2 = (1 - p1) / 9 (rest spread over 9 classes)."""
    p1 = np.linspace(0.5, 0.995, points)
    out: dict[str, dict[str, list[float]]] = {}
    for tag, p2 in (("two-class", 1 - p1), ("ten-class", (1 - p1) / 9)):
        out[tag] = {"p1": p1.tolist(), "renyi": np.asarray(renyi_radius(p1, p2, sigma)).tolist(),
                    "renyi (reference grid)": np.asarray(renyi_radius_reference(p1, p2, sigma)).tolist(),
                    "pixeldp": np.asarray(pixeldp_radius(p1, p2, sigma)).tolist(),
                    "cohen": np.asarray(cohen_radius(p1, sigma)).tolist(),
                    "cohen (two-class form)": np.asarray(cohen_radius(p1, sigma, p2)).tolist()}
    return out


# -- models ----------------------------------------------------------------------------------------------


def _model(cfg: StudyConfig, method: str, sigma: float, data_dir: str | None, device: str) -> tuple[Any, str]:
    if method in ("trades", "pgd"):
        r = recipe(cfg.dataset, cfg.arch, method, 0.0, epochs=cfg.epochs, eps=cfg.adv_eps, steps=10,
                   step=cfg.adv_eps / 4, seed=cfg.seed)
    else:
        r = recipe(cfg.dataset, cfg.arch, method, sigma, epochs=cfg.epochs, seed=cfg.seed)
    trained = robust_victim(r, data_dir=data_dir, device=device)
    return trained, r.name


def _certify(cfg: StudyConfig, model: Any, x: torch.Tensor, sigma: float, device: str) -> list[Certificate]:
    sc = SmoothingConfig(sigma=sigma, n0=cfg.n0, n=cfg.n, alpha=cfg.alpha, seed=cfg.seed)
    return certify(model, x, sc, device=device, desc=f"certify sigma={sigma}")


def run_study(cfg: StudyConfig, *, record: Record, data_dir: str | None = None, device: str = "cpu",
              parts: tuple[str, ...] = ("bounds", "certify", "ablation", "table1", "empirical", "soundness")
              ) -> dict[str, Any]:
    """Run the study's ``parts``; every row goes to ``record``; returns the summary."""
    from stealkit.data import load_splits

    t0 = time.perf_counter()
    summary: dict[str, Any] = {"method": "certify-study", "dataset": cfg.dataset, "seed": cfg.seed}
    if "bounds" in parts:
        lat = bound_lattice(cfg.lattice_step)
        record({"part": "bounds", **lat})
        record({"part": "bound_curves", "curves": bound_curves()})
        summary["bounds"] = lat
    test = load_splits(cfg.dataset, data_dir=data_dir).test
    xc, yc = test.x[: cfg.num_certify], test.y[: cfg.num_certify]
    xa, ya = test.x[: cfg.num_attack], test.y[: cfg.num_attack]
    certs: dict[str, list[Certificate]] = {}
    natural: dict[str, float] = {}

    def certify_model(method: str, sigma: float) -> list[Certificate]:
        key = f"{method}-{sigma:g}"
        if key not in certs:
            trained, name = _model(cfg, method, sigma, data_dir, device)
            natural[key] = float(trained.metrics["test_accuracy"])
            certs[key] = _certify(cfg, trained.model, xc, sigma, device)
            s = summarize(certs[key], yc, cfg.radii, ("cohen", "renyi", "pixeldp"))
            record({"part": "certify", "model": name, "method": method, "sigma": sigma,
                    "natural_accuracy": natural[key], **s,
                    "radii_per_image": {b: [c.radius[b] if c.label == int(t) else None
                                            for c, t in zip(certs[key], yc, strict=True)]
                                        for b in ("cohen", "renyi", "pixeldp")}})
        return certs[key]

    if "certify" in parts:
        summary["certified_accuracy"] = {}
        for s in cfg.sigmas:
            c = certify_model("stability", s)
            summary["certified_accuracy"][f"stability sigma={s:g}"] = {
                b: dict(zip([f"{r:g}" for r in cfg.radii], certified_accuracy(c, yc, b, cfg.radii), strict=True))
                for b in ("renyi", "cohen", "pixeldp")}
    if "ablation" in parts:
        s = cfg.main_sigma
        summary["ablation"] = {}
        for method in ("stability", "gaussian", "none"):
            c = certify_model(method, s)
            summary["ablation"][method] = {
                b: dict(zip([f"{r:g}" for r in cfg.radii], certified_accuracy(c, yc, b, cfg.radii), strict=True))
                for b in ("renyi", "cohen")}
            record({"part": "ablation", "method": method, "sigma": s, "natural_accuracy": natural[f"{method}-{s:g}"],
                    **summary["ablation"][method]})
    if "table1" in parts:
        rows = []
        r0 = cfg.table_radius
        for key, c in certs.items():
            method, sigma = key.rsplit("-", 1)
            for b in ("renyi", "cohen", "pixeldp"):
                rows.append({"model": f"{method} sigma={sigma}", "bound": b, "radius": r0,
                             "certified_accuracy": certified_accuracy(c, yc, b, [r0])[0],
                             "natural_accuracy": natural[key], "kind": "certified"})
        for method in cfg.baselines:
            trained, name = _model(cfg, method, 0.0, data_dir, device)
            acc = empirical_robust_accuracy(trained.model, xa, ya, sigma=0.0, attack="pgd-l2", eps=[r0],
                                            steps=cfg.pgd_steps, seed=cfg.seed)[0]["accuracy"]
            rows.append({"model": name, "bound": "EOT-PGD L2 (empirical)", "radius": r0,
                         "certified_accuracy": None, "empirical_accuracy": acc,
                         "natural_accuracy": float(trained.metrics["test_accuracy"]), "kind": "empirical"})
        for row in rows:
            record({"part": "table1", **row})
        summary["table1"] = rows
    if "empirical" in parts:
        summary["empirical"] = {}
        models: list[tuple[str, str, float, float]] = [("stability", f"STN sigma={s:g}", s, s) for s in cfg.sigmas]
        models.append(("stability", "STN model, no noise (sigma=0)", cfg.main_sigma, 0.0))
        models += [(m, m.upper(), 0.0, 0.0) for m in cfg.baselines]
        for method, label, train_sigma, sigma in models:
            trained, name = _model(cfg, method, train_sigma, data_dir, device)
            for attack, eps in (("pgd-l2", cfg.l2_eps), ("pgd-linf", cfg.linf_eps), ("cw-l2", cfg.l2_eps),
                                ("boundary", cfg.l2_eps)):
                t1 = time.perf_counter()
                rows = empirical_robust_accuracy(trained.model, xa, ya, sigma=sigma, attack=attack, eps=eps,  # type: ignore[arg-type]
                                                 eot_samples=cfg.eot_samples, n_predict=cfg.n_predict,
                                                 steps=cfg.pgd_steps, seed=cfg.seed, cw_steps=cfg.cw_steps,
                                                 boundary_steps=cfg.boundary_steps)
                record({"part": "empirical", "model": label, "sigma": sigma, "attack": attack, "rows": rows,
                        "seconds": round(time.perf_counter() - t1, 1)})
                summary["empirical"].setdefault(label, {})[attack] = {f"{r['eps']:g}": r["accuracy"] for r in rows}
    if "soundness" in parts:
        s = cfg.main_sigma
        trained, name = _model(cfg, "stability", s, data_dir, device)
        c = certify_model("stability", s)[: cfg.soundness_num]
        rows = soundness_check(trained.model, xc[: len(c)], c, eot_samples=cfg.eot_samples, steps=cfg.pgd_steps,
                               n_predict=cfg.n, alpha=cfg.alpha, seed=cfg.seed)
        for row in rows:
            record({"part": "soundness", "model": name, **row})
        summary["soundness"] = {"attacked": len(rows), "violations": sum(r["violation"] for r in rows),
                                "argmax_changed": sum(r["argmax_changed"] for r in rows),
                                "abstained": sum(r["abstain"] for r in rows), "alpha": cfg.alpha}
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    return summary


Config = StudyConfig


def run(config: StudyConfig, *, on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the study's ``parts``; every row goes to ``on_record``; returns the summary."""
    return run_study(config, record=on_record or (lambda _row: None), data_dir=config.data_dir,
                     device=config.device, parts=config.parts)


def _acc_plot(series: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str) -> str:
    return line_plot(series, xlabel=xlabel, ylabel=ylabel, ylim=(0, 1.02))


def _flat_row(record: dict[str, Any]) -> dict[str, Any]:
    """A record as one table row: nested dicts become columns (``certified r=0.5``), never dicts in cells."""
    row: dict[str, Any] = {}
    for k, v in record.items():
        if k == "part":
            continue
        if isinstance(v, dict):
            for kk, vv in v.items():
                if isinstance(vv, dict):
                    row.update({f"{k} {kk} {k3}": v3 for k3, v3 in vv.items()})
                else:
                    row[f"{k} {kk}"] = vv
        else:
            row[k] = v
    return row


def sections(run: RunDir, config: dict[str, Any], summary: dict[str, Any]) -> list[Section]:
    records = run.records()
    by_part: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_part.setdefault(rec.get("part", ""), []).append(rec)
    sections: list[Section] = []
    for rec in by_part.get("bounds", []):
        facts = {k: v for k, v in rec.items() if k != "part"}
        figs = []
        for curves in by_part.get("bound_curves", []):
            for tag, c in curves["curves"].items():
                series = {k: (c["p1"], v) for k, v in c.items() if k != "p1"}
                uri = line_plot(series, xlabel="p1", ylabel="certified radius (sigma = 1)",
                                title=f"p2 = {'1 - p1' if tag == 'two-class' else '(1 - p1) / 9'}")
                figs.append(Figure(uri, f"Appendix A / Figure 4 analogue, {tag}"))
        sections.append(Section("Bounds over (p1, p2) (Appendix A)", tables=[("lattice comparison", [facts])],
                                figures=figs))
    cert = by_part.get("certify", [])
    study = config.get("config", {}).get("study", {})
    if cert:
        series: dict[str, tuple[list[float], list[float]]] = {}
        rows = []
        top = max([r for rec in cert for b in ("renyi", "cohen", "pixeldp")
                   for r in rec["radii_per_image"][b] if r is not None] or [0.5])
        grid = np.linspace(0.0, top * 1.05, 60)  # the axis ends where the last certificate does
        for rec in cert:
            n = rec["num_images"]
            for b in ("renyi", "cohen", "pixeldp"):
                radii = [r for r in rec["radii_per_image"][b] if r is not None]
                main = rec["method"] == "stability" and rec["sigma"] == study.get("main_sigma")
                if b == "renyi" or main:
                    series[f"{b} {rec['method']} sigma={rec['sigma']:g}"] = (
                        grid.tolist(), [sum(r >= g for r in radii) / n for g in grid])
            rows.append({"model": rec["model"], "natural": rec["natural_accuracy"],
                         **{f"{b} r={r}": v for b in ("renyi", "cohen", "pixeldp")
                            for r, v in rec["certified_accuracy"][b].items()}})
        sections.append(Section("Certified accuracy against radius (Figure 1)", tables=[("", rows)],
                                figures=[Figure(_acc_plot(series, "L2 radius", "certified accuracy"),
                                                "certified accuracy (lower bound on accuracy under any L2 attack)")]))
    if by_part.get("ablation"):
        rows = [_flat_row(r) for r in by_part["ablation"]]
        sections.append(Section("Stability-training ablation", tables=[("certified accuracy by radius", rows)]))
    if by_part.get("table1"):
        rows = [_flat_row(r) for r in by_part["table1"]]
        sections.append(Section("Table 1 analogue", tables=[("", rows)]))
    emp = by_part.get("empirical", [])
    if emp:
        figs = []
        for attack in ("pgd-l2", "pgd-linf", "cw-l2", "boundary"):
            series = {r["model"]: ([row["eps"] for row in r["rows"]], [row["accuracy"] for row in r["rows"]])
                      for r in emp if r["attack"] == attack}
            if series:
                figs.append(Figure(_acc_plot(series, "attack size", "accuracy"), f"{attack} (EOT where noisy)"))
        rows = [{"model": r["model"], "attack": r["attack"], **{f"{row['eps']:g}": row["accuracy"] for row in r["rows"]}}
                for r in emp]
        sections.append(Section("Empirical robustness (Figures 2-3, Appendix D.2)", tables=[("", rows)],
                                figures=figs))
    if by_part.get("soundness"):
        s = summary.get("soundness", {})
        bad = [{k: v for k, v in r.items() if k != "part"} for r in by_part["soundness"] if r["violation"]]
        sections.append(Section("Soundness check", paragraphs=[
            f"{s.get('attacked')} (point, bound) pairs attacked inside their certified radius; "
            f"{s.get('violations')} violations, {s.get('argmax_changed')} arg-max changes, "
            f"{s.get('abstained')} abstentions."], tables=[("violations", bad)] if bad else []))
    return sections
