"""CaBaGE-style class-balanced selective filtering of queries and replay that favours hard samples (after
Rosenthal, Liang, Zhang & Tan, "CaBaGE: Data-Free Model Extraction using ClAss BAlanced Generator Ensemble",
ECCV 2024).

The paper's text and code are not in this project's references, so this file implements the two mechanisms as
the issue describes them, in stealkit's own form, and quotes no equation numbers. Algorithm box (one round):

1. Over-generate: ``c * M`` candidates ``x = G(z)`` (``c = candidates``; an ensemble of generators is not
   used here). The clones score each candidate: its predicted class ``yhat = argmax pbar(x)`` and its
   hardness ``h(x)`` = the clones' disagreement (:func:`stealkit.extract.datafree.disguide.sample_disagreement`).
2. Class-balanced selection (:func:`balanced_selection`): from the victim's answers so far, class ``k`` has
   ``n_k`` rows; the ``M`` queries are split over classes in proportion to the deficit
   ``max(0, (N + M) / K - n_k)`` (a class the victim has rarely answered gets more), and inside each class the
   hardest candidates are taken; rows still free go to the hardest candidates left. Only the ``M`` selected
   rows are queried, so a round costs ``M`` queries whatever ``c`` is.
3. Hard-sample replay (:class:`HardReplayBuffer`): every stored row keeps the student loss it had when last
   seen; a fraction ``hard`` of each replay batch is drawn with probability proportional to that loss, the
   rest uniformly, and the drawn rows' losses are refreshed after the step. Replay costs no queries.
"""

from __future__ import annotations

from typing import Any

import torch

from stealkit.extract.datafree.replay import ReplayBuffer


def balanced_selection(pred: torch.Tensor, hardness: torch.Tensor, class_counts: torch.Tensor, m: int) -> torch.Tensor:
    """Indices of ``m`` of the candidates (``pred`` their predicted classes, ``hardness`` their scores), chosen
    class by class in proportion to each class's deficit in ``class_counts`` (step 2 of the module box)."""
    n, k = pred.shape[0], class_counts.shape[0]
    if m >= n:
        return torch.arange(n)
    counts = class_counts.float().cpu()
    deficit = ((counts.sum() + m) / k - counts).clamp_min(0)
    if float(deficit.sum()) <= 0:
        deficit = torch.ones(k)
    quota = torch.floor(deficit / deficit.sum() * m).long()
    pred, hardness = pred.cpu(), hardness.detach().float().cpu()
    order = torch.argsort(hardness, descending=True, stable=True)
    taken = torch.zeros(n, dtype=torch.bool)
    for c in range(k):
        rows = order[pred[order] == c][: int(quota[c])]
        taken[rows] = True
    free = m - int(taken.sum())
    if free > 0:
        rest = order[~taken[order]][:free]
        taken[rest] = True
    return torch.nonzero(taken).flatten()


class HardReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` whose rows carry a hardness (the last student loss seen on them); ``hard`` of
    each sample is drawn in proportion to it (step 3 of the module box)."""

    def __init__(self, capacity: int, input_shape: tuple[int, ...], num_classes: int, hard: float) -> None:
        super().__init__(capacity, input_shape, num_classes)
        self.hard = float(hard)
        self.w = torch.ones(max(capacity, 0), dtype=torch.float32)
        self.last_idx = torch.empty(0, dtype=torch.long)

    def add(self, x: torch.Tensor, p: torch.Tensor) -> None:
        if self.capacity <= 0:
            return
        start, n = self.pos, min(x.shape[0], self.capacity)
        new = self.w[: self.filled].max() if self.filled else torch.tensor(1.0)
        super().add(x, p)
        self.w[(start + torch.arange(n)) % self.capacity] = new  # unseen rows: as hard as the hardest seen

    def sample(self, n: int, generator: torch.Generator, device: str | torch.device) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
        n_hard = int(round(self.hard * n))
        uniform = torch.randint(self.filled, (n - n_hard,), generator=generator)
        if n_hard > 0:
            hard = torch.multinomial(self.w[: self.filled].clamp_min(1e-6), n_hard, replacement=True,
                                     generator=generator)
            uniform = torch.cat([hard, uniform])
        self.last_idx = uniform
        return self.x[uniform].to(device).float(), self.p[uniform].to(device)

    def update_hardness(self, losses: torch.Tensor) -> None:
        """Per-row losses ``[n]`` of the rows the last :meth:`sample` returned, in its order."""
        self.w[self.last_idx] = losses.detach().float().cpu()

    def tensors(self) -> dict[str, torch.Tensor]:
        return {**super().tensors(), "buffer_w": self.w[: self.filled].clone()}

    def load(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        super().load(tensors, scalars)
        if "buffer_w" in tensors:
            self.w[: self.filled] = tensors["buffer_w"]
