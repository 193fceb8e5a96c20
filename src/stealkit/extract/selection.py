"""Choosing the reported student without labelled data: agreement with the victim on held-out paid queries.

The attacker has no test set. What it does have are the victim's answers to its own queries, so a slice of
every round's answers (``holdout``) is set aside, never trained on and never replayed, and kept in a bounded
store (the most recent ``capacity`` rows). After every round each candidate (each clone, their EMA) is scored
by its top-1 agreement with the victim on the whole store, and so is the student currently reported, whose
weights are a snapshot; a candidate at least as good replaces the snapshot. The reported student therefore
only changes to one the attacker's own evidence ranks at least as high, on the same held-out rows. Test
accuracy is never read here; the loop measures it for the report only (and the gap between the selected and
the best-in-hindsight student).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from stealkit.extract.replay import ReplayBuffer


class ExponentialAverage:
    """An exponential moving average of a module's parameters (buffers copied): ``a <- d a + (1 - d) w``."""

    def __init__(self, module: nn.Module, decay: float) -> None:
        self.decay = float(decay)
        self.module = copy.deepcopy(module).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        for a, w in zip(self.module.parameters(), module.parameters(), strict=True):
            a.mul_(self.decay).add_(w.detach(), alpha=1 - self.decay)
        for a, w in zip(self.module.buffers(), module.buffers(), strict=True):
            a.copy_(w)


@torch.no_grad()
def agreement(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, batch: int = 1024) -> float:
    """Top-1 agreement of ``model`` with ``labels`` on ``x`` (the model is scored in eval mode, then restored)."""
    was = model.training
    model.eval()
    try:
        hits = sum(int((model(x[i : i + batch]).argmax(1) == labels[i : i + batch]).sum())
                   for i in range(0, x.shape[0], batch))
    finally:
        model.train(was)
    return hits / max(1, x.shape[0])


class StudentSelector:
    """Held-out answers and the snapshot of the student currently reported (see the module docstring)."""

    def __init__(self, snapshot: nn.Module, capacity: int, input_shape: tuple[int, ...], num_classes: int,
                 device: str) -> None:
        self.store = ReplayBuffer(capacity, input_shape, num_classes)
        self.snapshot = snapshot.to(device).eval()
        for p in self.snapshot.parameters():
            p.requires_grad_(False)
        self.device = device
        self.source = ""
        self.score = -1.0

    def add(self, x: torch.Tensor, soft: torch.Tensor) -> None:
        self.store.add(x, soft)

    def consider(self, candidates: dict[str, nn.Module]) -> str:
        """Score the candidates and the snapshot on the held-out store; keep the best. Returns its name."""
        n = len(self.store)
        if n == 0:
            return self.source
        x = self.store.x[:n].to(self.device).float()
        y = self.store.p[:n].argmax(1).to(self.device)
        current = agreement(self.snapshot, x, y) if self.source else -1.0
        scores = {name: agreement(m, x, y) for name, m in candidates.items()}
        best = max(scores, key=lambda k: scores[k])
        if scores[best] >= current:
            self.snapshot.load_state_dict(candidates[best].state_dict())
            self.source, current = best, scores[best]
        self.score = current
        return self.source

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"holdout_{k}": v for k, v in self.store.tensors().items()}

    def scalars(self) -> dict[str, Any]:
        return {"holdout": self.store.scalars(), "source": self.source, "score": self.score}

    def load(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        if "holdout" in scalars and "holdout_buffer_x" in tensors:
            self.store.load({k[len("holdout_"):]: v for k, v in tensors.items() if k.startswith("holdout_")},
                            scalars["holdout"])
        self.source, self.score = str(scalars.get("source", "")), float(scalars.get("score", -1.0))
