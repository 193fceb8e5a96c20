"""Noise-trained base classifiers for certification studies and benchmarks, trained once and cached.

Like :func:`stealkit.experiments.victims.standard_victim`: a model is cached in ``runs/victims/<name>`` (or
``$STEALKIT_CACHE/victims``) and reused only when its recipe (data set, architecture, training config)
matches exactly. ``robust_victim("fmnist-conv2-gaussian0.5")`` is the benchmark's model: the anchors'
2-conv + 2-dense CNN trained with sigma = 0.5 Gaussian augmentation on Fashion-MNIST train[:50k].
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stealkit import __version__
from stealkit.certify.training import RobustTrainConfig, train_robust
from stealkit.errors import InputError
from stealkit.experiments.victims import cache_root
from stealkit.fsutil import atomic_write_json, atomic_write_text
from stealkit.train import TrainConfig

log = logging.getLogger(__name__)

_SHORT = {"fashion-mnist": "fmnist", "digits": "digits", "mnist": "mnist"}
#: epochs per data set for the cached models (digits is tiny, Fashion-MNIST is 50k images on 2 cores)
DEFAULT_EPOCHS = {"digits": 40, "fashion-mnist": 4, "mnist": 4}


@dataclass(frozen=True)
class RobustRecipe:
    dataset: str
    arch: str
    config: RobustTrainConfig
    split_seed: int = 0

    @property
    def name(self) -> str:
        c = self.config
        tag = c.method if c.method in ("none",) else (
            f"{c.method}{c.sigma:g}" if c.method in ("gaussian", "stability") else f"{c.method}{c.eps:g}")
        if c.train.epochs != DEFAULT_EPOCHS.get(self.dataset):
            tag += f"-e{c.train.epochs}"
        if c.train.seed:
            tag += f"-s{c.train.seed}"
        return f"{_SHORT.get(self.dataset, self.dataset)}-{self.arch}-{tag}"

    def stamp(self) -> str:
        return json.dumps({"dataset": self.dataset, "arch": self.arch, "config": self.config.to_dict(),
                           "split_seed": self.split_seed}, sort_keys=True)


def recipe(dataset: str, arch: str = "conv2", method: str = "gaussian", sigma: float = 0.5, *,
           epochs: int | None = None, eps: float | None = None, seed: int = 0, **kw: Any) -> RobustRecipe:
    """The standard recipe: Adam 1e-3, cosine schedule, batch 128 (64 on digits), ``DEFAULT_EPOCHS``."""
    if dataset not in DEFAULT_EPOCHS:
        raise InputError(f"no robust-victim recipe for data set {dataset!r}; expected one of {sorted(DEFAULT_EPOCHS)}")
    train = TrainConfig(epochs=epochs or DEFAULT_EPOCHS[dataset], batch_size=64 if dataset == "digits" else 128,
                        seed=seed)
    if eps is None:
        eps = 0.3 if dataset in ("mnist", "fashion-mnist") else 0.1
    cfg = RobustTrainConfig(method=method, sigma=sigma if method in ("gaussian", "stability") else 0.0,  # type: ignore[arg-type]
                            eps=eps, train=train, **kw)
    return RobustRecipe(dataset, arch, cfg)


BENCHMARK_RECIPE = recipe("fashion-mnist", "conv2", "gaussian", 0.5)


def robust_victim(r: RobustRecipe, *, cache_dir: str | Path | None = None, data_dir: str | Path | None = None,
                  device: str = "cpu") -> Any:
    """Load the model of recipe ``r`` from the cache, training (and saving) it first if needed.

    Returns a :class:`stealkit.victims.TrainedModel` whose metrics hold the clean test accuracy.
    """
    from stealkit.data import load_splits
    from stealkit.metrics import accuracy
    from stealkit.models import ModelSpec, build_model, load_model, save_model
    from stealkit.victims import TrainedModel

    path = Path(cache_dir) if cache_dir is not None else cache_root() / r.name
    stamp = r.stamp()
    if (path / "model.json").exists() and (path / "recipe.json").exists() \
            and (path / "recipe.json").read_text() == stamp:
        model, spec = load_model(path, device=device)
        return TrainedModel(model=model, spec=spec, metrics=dict(spec.metrics), path=path)
    splits = load_splits(r.dataset, data_dir=data_dir, seed=r.split_seed)
    train, test = splits.victim_train, splits.test
    torch.manual_seed(r.config.train.seed)
    model = build_model(r.arch, input_shape=train.input_shape, num_classes=train.num_classes)
    t0 = time.perf_counter()
    history = train_robust(model, train.x, train.y, r.config, desc=r.name, device=device)
    metrics = {"test_accuracy": accuracy(model, test.x, test.y, device=device), "dataset": r.dataset,
               "n_train": len(train), "n_test": len(test), "train_seconds": round(time.perf_counter() - t0, 2),
               "final_loss": history[-1]["loss"], "method": r.config.method, "sigma": r.config.sigma}
    model = model.cpu().eval()
    spec = ModelSpec.from_model(model, class_names=list(train.classes), metrics=metrics,
                                extra={"dataset": r.dataset, "split_seed": r.split_seed,
                                       "robust_train": r.config.to_dict(), "stealkit_version": __version__})
    save_model(model, spec, path)
    atomic_write_json(path / "metrics.json", metrics | {"history": history})
    atomic_write_text(path / "recipe.json", stamp)
    log.info("%s: clean test accuracy %.4f", r.name, metrics["test_accuracy"])
    return TrainedModel(model=model.to(device), spec=spec, metrics=metrics, path=path)
