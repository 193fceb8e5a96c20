"""Standard victims shared by studies and benchmarks: trained once with a fixed recipe, cached on disk.

``standard_victim("fmnist-conv2")`` is the anchors' victim: the 2-conv + 2-dense CNN (Milli et al.'s conv net)
trained on Fashion-MNIST train[:50k], about 0.90 test accuracy. The cache lives in ``runs/victims`` (or
``$STEALKIT_CACHE``); a cached victim is reused only if its recipe matches exactly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stealkit.errors import InputError
from stealkit.train import TrainConfig


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


def cache_root() -> Path:
    return Path(os.environ.get("STEALKIT_CACHE", "runs")) / "victims"


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


def standard_victim(name: str, *, cache_dir: str | Path | None = None, data_dir: str | Path | None = None,
                    device: str = "cpu") -> Any:
    """Load the named standard victim from the cache, training it first if needed. Returns a TrainedModel."""
    from stealkit.models import load_model
    from stealkit.victims import TrainedModel, train_victim

    if name not in RECIPES:
        raise InputError(f"unknown standard victim {name!r}; expected one of {sorted(RECIPES)}")
    recipe = RECIPES[name]
    path = Path(cache_dir) if cache_dir is not None else cache_root() / name
    stamp = json.dumps({"dataset": recipe.dataset, "arch": recipe.arch, "train": recipe.train.to_dict(),
                        "kwargs": dict(recipe.arch_kwargs), "split_seed": recipe.split_seed,
                        "data": data_fingerprint(recipe.dataset, recipe.split_seed, data_dir)}, sort_keys=True)
    if (path / "model.json").exists() and (path / "recipe.json").exists() \
            and (path / "recipe.json").read_text() == stamp:
        model, spec = load_model(path, device=device)
        return TrainedModel(model=model, spec=spec, metrics=dict(spec.metrics), path=path)
    trained = train_victim(recipe.dataset, recipe.arch, recipe.train, out=path, arch_kwargs=dict(recipe.arch_kwargs),
                           data_dir=data_dir, split_seed=recipe.split_seed, device=device)
    from stealkit.fsutil import atomic_write_text

    atomic_write_text(path / "recipe.json", stamp)
    return trained
