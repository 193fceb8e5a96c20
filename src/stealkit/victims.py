"""Train a victim on a named data set and save it as safetensors + JSON (``stealkit train``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit import __version__
from stealkit.fsutil import atomic_write_json
from stealkit.metrics import accuracy
from stealkit.train import TrainConfig, fit

log = logging.getLogger(__name__)


@dataclass
class TrainedModel:
    model: nn.Module
    spec: Any
    metrics: dict[str, Any]
    path: Path | None = None


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
    from stealkit.models import ModelSpec, build_model, save_model

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
    return TrainedModel(model=model, spec=spec, metrics=metrics, path=path)
