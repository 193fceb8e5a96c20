"""Victims: train one on a named data set (``stealkit train``), and the cached victims studies and benchmarks share.

- :func:`train_victim` trains an architecture on the victim-train split and saves it as safetensors + JSON.
- :func:`standard_victim` loads a standard victim (a fixed recipe in :data:`RECIPES`), training it first if
  needed. ``standard_victim("fmnist-conv2")`` is the anchors' victim: the 2-conv + 2-dense CNN (Milli et al.'s
  conv net) trained on Fashion-MNIST train[:50k], about 0.90 test accuracy.
- :func:`robust_victim` does the same for noise-trained base classifiers of the certification studies
  (:func:`robust_recipe`); :func:`benchmark_recipe` is the certification benchmark's model: the anchors' CNN
  trained with sigma = 0.5 Gaussian augmentation on Fashion-MNIST train[:50k].

The cache lives in ``runs/victims/<name>`` (or ``$STEALKIT_CACHE/victims``); a cached victim is reused only if
its recipe (data set, architecture, training config, split and, for standard victims, the data's digest)
matches exactly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from stealkit import __version__
from stealkit.errors import InputError
from stealkit.fsutil import atomic_write_json, atomic_write_text
from stealkit.metrics import accuracy
from stealkit.train import TrainConfig, fit

if TYPE_CHECKING:
    from stealkit.certify.training import RobustTrainConfig

log = logging.getLogger(__name__)


@dataclass
class TrainedModel:
    model: nn.Module
    spec: Any
    metrics: dict[str, Any]
    path: Path | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # per-epoch training log (freshly trained only)


def train_victim(
    dataset: str,
    arch: str,
    config: TrainConfig,
    *,
    out: str | Path | None = None,
    arch_kwargs: dict[str, Any] | None = None,
    data_dir: str | Path | None = None,
    split_seed: int = 0,
    device: str = "cpu",
) -> TrainedModel:
    """Train ``arch`` on the victim-train split of ``dataset``; score it on the test split; save to ``out``."""
    from stealkit.data import load_splits
    from stealkit.data.sources import canonical_dataset
    from stealkit.models import ModelSpec, build_model, save_model

    dataset = canonical_dataset(dataset)  # one stored name: model.json, ONNX metadata and reports
    splits = load_splits(dataset, data_dir=data_dir, seed=split_seed)
    train, test = splits.victim_train, splits.test
    torch.manual_seed(config.seed)
    model = build_model(arch, input_shape=train.input_shape, num_classes=train.num_classes, **(arch_kwargs or {}))
    t0 = time.perf_counter()
    history = fit(model, train.x, train.y, config, desc=f"{arch} on {dataset}", device=device)
    seconds = time.perf_counter() - t0
    metrics = {
        "test_accuracy": accuracy(model, test.x, test.y, device=device),
        "train_accuracy": accuracy(model, train.x, train.y, device=device),
        "dataset": dataset,
        "n_train": len(train),
        "n_test": len(test),
        "train_seconds": round(seconds, 2),
        "final_loss": history[-1]["loss"],
    }
    model = model.cpu().eval()
    norm = next(m for m in model.modules() if hasattr(m, "mean") and isinstance(m.mean, torch.Tensor))
    spec = ModelSpec(
        arch=arch,
        input_shape=tuple(train.input_shape),
        num_classes=train.num_classes,
        kwargs=dict(arch_kwargs or {}),
        mean=[float(v) for v in norm.mean.flatten()],
        std=[float(v) for v in norm.std.flatten()],
        class_names=list(train.classes),
        metrics=metrics,
        stealkit_version=__version__,
        extra={"dataset": dataset, "split_seed": split_seed, "train_config": config.to_dict()},
    )
    path = None
    if out is not None:
        path = save_model(model, spec, out)
        atomic_write_json(Path(out) / "metrics.json", metrics | {"history": history})
    log.info("%s on %s: test accuracy %.4f", arch, dataset, metrics["test_accuracy"])
    return TrainedModel(model=model, spec=spec, metrics=metrics, path=path, history=history)


# -- the cache ----------------------------------------------------------------------------------------------------
def cache_root() -> Path:
    return Path(os.environ.get("STEALKIT_CACHE", "runs")) / "victims"


def _cached(path: Path, stamp: str, device: str) -> TrainedModel | None:
    """The model cached in ``path`` if its ``recipe.json`` is exactly ``stamp``, else ``None``."""
    from stealkit.models import load_model

    if (path / "model.json").exists() and (path / "recipe.json").exists() \
            and (path / "recipe.json").read_text() == stamp:
        model, spec = load_model(path, device=device)
        return TrainedModel(model=model, spec=spec, metrics=dict(spec.metrics), path=path)
    return None


# -- standard victims ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    dataset: str
    arch: str
    train: TrainConfig
    arch_kwargs: tuple[tuple[str, Any], ...] = ()
    split_seed: int = 0


RECIPES: dict[str, Recipe] = {
    "digits-conv2": Recipe("digits", "conv2", TrainConfig(epochs=40, batch_size=64, seed=0)),
    "digits-mlp2": Recipe("digits", "mlp2", TrainConfig(epochs=60, batch_size=64, seed=0)),
    "digits-logistic": Recipe("digits", "logistic", TrainConfig(epochs=80, batch_size=64, seed=0)),
    "fmnist-conv2": Recipe("fashion-mnist", "conv2", TrainConfig(epochs=4, batch_size=128, seed=0)),
    "fmnist-cnn4": Recipe("fashion-mnist", "cnn4", TrainConfig(epochs=4, batch_size=128, seed=0)),
    "fmnist-mlp2": Recipe("fashion-mnist", "mlp2", TrainConfig(epochs=8, batch_size=128, seed=0)),
    "fmnist-logistic": Recipe("fashion-mnist", "logistic", TrainConfig(epochs=8, batch_size=128, seed=0)),
}


def data_fingerprint(dataset: str, split_seed: int, data_dir: str | Path | None = None) -> str:
    """A digest of the split's contents, so a victim is retrained if the data or its split ever change."""
    import hashlib

    from stealkit.data import load_splits

    splits = load_splits(dataset, data_dir=data_dir, seed=split_seed)
    h = hashlib.sha256()
    for part in (splits.victim_train, splits.attacker_pool, splits.test):
        h.update(part.y.numpy().tobytes())
        h.update(part.x[:64].numpy().tobytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on a cache entry, so parallel processes (``reproduce --jobs``) train it once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def standard_victim(name: str, *, cache_dir: str | Path | None = None, data_dir: str | Path | None = None,
                    device: str = "cpu") -> TrainedModel:
    """Load the named standard victim from the cache, training it first if needed."""
    if name not in RECIPES:
        raise InputError(f"unknown standard victim {name!r}; expected one of {sorted(RECIPES)}")
    recipe = RECIPES[name]
    path = Path(cache_dir) if cache_dir is not None else cache_root() / name
    stamp = json.dumps({"dataset": recipe.dataset, "arch": recipe.arch, "train": recipe.train.to_dict(),
                        "kwargs": dict(recipe.arch_kwargs), "split_seed": recipe.split_seed,
                        "data": data_fingerprint(recipe.dataset, recipe.split_seed, data_dir)}, sort_keys=True)
    with cache_lock(path):
        cached = _cached(path, stamp, device)
        if cached is not None:
            return cached
        trained = train_victim(recipe.dataset, recipe.arch, recipe.train, out=path,
                               arch_kwargs=dict(recipe.arch_kwargs), data_dir=data_dir, split_seed=recipe.split_seed,
                               device=device)
        atomic_write_text(path / "recipe.json", stamp)
        return trained


# -- robust victims (noise-trained base classifiers for certification) ----------------------------------------------
_SHORT = {"fashion-mnist": "fmnist", "digits": "digits", "mnist": "mnist"}
#: epochs per data set for the cached models (digits is tiny, Fashion-MNIST is 50k images on 2 cores)
ROBUST_EPOCHS = {"digits": 40, "fashion-mnist": 4, "mnist": 4}


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
        if c.train.epochs != ROBUST_EPOCHS.get(self.dataset):
            tag += f"-e{c.train.epochs}"
        if c.train.seed:
            tag += f"-s{c.train.seed}"
        return f"{_SHORT.get(self.dataset, self.dataset)}-{self.arch}-{tag}"

    def stamp(self) -> str:
        return json.dumps({"dataset": self.dataset, "arch": self.arch, "config": self.config.to_dict(),
                           "split_seed": self.split_seed}, sort_keys=True)


def robust_recipe(dataset: str, arch: str = "conv2", method: str = "gaussian", sigma: float = 0.5, *,
                  epochs: int | None = None, eps: float | None = None, seed: int = 0, **kw: Any) -> RobustRecipe:
    """The standard recipe: Adam 1e-3, cosine schedule, batch 128 (64 on digits), ``ROBUST_EPOCHS``."""
    from stealkit.certify.training import RobustTrainConfig

    if dataset not in ROBUST_EPOCHS:
        raise InputError(f"no robust-victim recipe for data set {dataset!r}; expected one of {sorted(ROBUST_EPOCHS)}")
    train = TrainConfig(epochs=epochs or ROBUST_EPOCHS[dataset], batch_size=64 if dataset == "digits" else 128,
                        seed=seed)
    if eps is None:
        eps = 0.3 if dataset in ("mnist", "fashion-mnist") else 0.1
    cfg = RobustTrainConfig(method=method, sigma=sigma if method in ("gaussian", "stability") else 0.0,  # type: ignore[arg-type]
                            eps=eps, train=train, **kw)
    return RobustRecipe(dataset, arch, cfg)


def benchmark_recipe() -> RobustRecipe:
    """The certification benchmark's model: conv2, sigma = 0.5 Gaussian augmentation, Fashion-MNIST."""
    return robust_recipe("fashion-mnist", "conv2", "gaussian", 0.5)


def robust_victim(r: RobustRecipe, *, cache_dir: str | Path | None = None, data_dir: str | Path | None = None,
                  device: str = "cpu") -> TrainedModel:
    """Load the model of recipe ``r`` from the cache, training (and saving) it first if needed.

    Its metrics hold the clean test accuracy.
    """
    from stealkit.certify.training import train_robust
    from stealkit.data import load_splits
    from stealkit.models import ModelSpec, build_model, save_model

    path = Path(cache_dir) if cache_dir is not None else cache_root() / r.name
    with cache_lock(path):
        stamp = r.stamp()
        cached = _cached(path, stamp, device)
        if cached is not None:
            return cached
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
