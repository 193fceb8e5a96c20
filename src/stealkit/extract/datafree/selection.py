"""Choosing the reported student without labelled data: agreement with the victim on held-out paid queries.

The attacker has no test set. What it does have are the victim's answers to its own queries, so a slice of
every round's answers (``holdout``) is set aside, never trained on and never replayed, and kept in a bounded
store of ``capacity`` rows: the most recent ones (``keep="recent"``), or a uniform sample of every round so far
(``keep="all"``: reservoir sampling, Vitter's Algorithm R, so older generator distributions stay represented
and a student that only fits the latest rounds is not favoured). After every round each candidate (each
clone, their EMA) is scored by its top-1 agreement with the victim on the whole store, and so is the student
currently reported, whose weights are a snapshot; a candidate replaces the snapshot when it is at least as
good (``margin=0``) or, with ``margin > 0``, when it beats the snapshot by more than ``margin`` standard
errors of the snapshot's agreement on the store (``sqrt(a (1 - a) / n)``), so that the reported student does
not follow the store's noise. Two more guards against a signal that drifts with the generator: a store that
keeps only the first ``capacity`` rows (``keep="first"``: a judge frozen once the early rounds have filled it,
so later generator images cannot flatter later students), several stores at once (``keep="first+all"``: a
candidate must beat the snapshot on every one of them), and a margin that grows linearly with the share of the
budget spent, from ``margin`` to ``margin_end``. The reported student therefore only changes to one the
attacker's own evidence ranks higher, on the same held-out rows. Test accuracy is never read here; the loop measures it for the
report only (and the gap between the selected and the best-in-hindsight student).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from stealkit.extract.datafree.replay import ReplayBuffer


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


KEEP = ("recent", "all", "first")


def keep_kinds(keep: str) -> list[str]:
    """The stores a ``keep`` setting names: one kind of :data:`KEEP`, or several joined by ``+``."""
    kinds = keep.split("+")
    if not kinds or any(k not in KEEP for k in kinds) or len(set(kinds)) != len(kinds):
        from stealkit.errors import InputError

        raise InputError(f"holdout_keep must be one of {', '.join(KEEP)} or several joined by '+', got {keep!r}")
    return kinds


class HeldOutStore(ReplayBuffer):
    """The held-out rows: a ring buffer (``keep="recent"``), a reservoir sample of every row ever added
    (``keep="all"``) or the first ``capacity`` rows only (``keep="first"``). The reservoir's draws come from a generator seeded by ``(seed, rows seen)``, so its
    checkpoint state is just the rows and two counters, and a resumed run draws what the uninterrupted one did."""

    def __init__(self, capacity: int, input_shape: tuple[int, ...], num_classes: int, keep: str = "recent",
                 seed: int = 0) -> None:
        super().__init__(capacity, input_shape, num_classes)
        self.keep, self.seed, self.seen = keep, int(seed), 0

    def add(self, x: torch.Tensor, p: torch.Tensor) -> None:
        if self.keep == "first":
            room = self.capacity - self.filled
            if room > 0:
                super().add(x[:room], p[:room])
            self.seen += x.shape[0]
            return
        if self.keep == "recent" or self.filled + x.shape[0] <= self.capacity:
            super().add(x, p)
            self.seen += x.shape[0]
            return
        room = self.capacity - self.filled
        if room > 0:
            super().add(x[:room], p[:room])
            self.seen += room
            x, p = x[room:], p[room:]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.seen)
        slots = [int(torch.randint(self.seen + i + 1, (1,), generator=g)) for i in range(x.shape[0])]
        for i, j in enumerate(slots):  # Algorithm R: row seen-th replaces slot j when j < capacity
            if j < self.capacity:
                self.x[j], self.p[j] = x[i].detach().cpu().half(), p[i].detach().cpu().float()
        self.seen += x.shape[0]

    def scalars(self) -> dict[str, Any]:
        return super().scalars() | {"seen": self.seen}

    def load(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        super().load(tensors, scalars)
        self.seen = int(scalars.get("seen", self.filled))


class StudentSelector:
    """Held-out answers and the snapshot of the student currently reported (see the module docstring)."""

    def __init__(self, snapshot: nn.Module, capacity: int, input_shape: tuple[int, ...], num_classes: int,
                 device: str, keep: str = "recent", margin: float = 0.0, seed: int = 0,
                 margin_end: float | None = None) -> None:
        self.stores = [HeldOutStore(capacity, input_shape, num_classes, k, seed) for k in keep_kinds(keep)]
        self.margin = float(margin)
        self.margin_end = self.margin if margin_end is None else float(margin_end)
        self.snapshot = snapshot.to(device).eval()
        for p in self.snapshot.parameters():
            p.requires_grad_(False)
        self.device = device
        self.source = ""
        self.score = -1.0

    @property
    def store(self) -> HeldOutStore:
        """The first store (the only one unless ``keep`` names several)."""
        return self.stores[0]

    def add(self, x: torch.Tensor, soft: torch.Tensor) -> None:
        for store in self.stores:
            store.add(x, soft)

    def margin_at(self, progress: float) -> float:
        """The margin, in standard errors, once ``progress`` (0..1) of the budget is spent."""
        return self.margin + (self.margin_end - self.margin) * min(max(float(progress), 0.0), 1.0)

    def consider(self, candidates: dict[str, nn.Module], progress: float = 0.0) -> str:
        """Score the candidates and the snapshot on every held-out store; keep the best. Returns its name.

        The best candidate is the one whose lowest agreement over the stores is highest; it replaces the
        snapshot only when it beats it on every store (by the margin at ``progress``)."""
        if len(self.stores[0]) == 0:
            return self.source
        margin = self.margin_at(progress)
        current: list[float] = []
        scores: dict[str, list[float]] = {name: [] for name in candidates}
        for store in self.stores:
            n = len(store)
            x = store.x[:n].to(self.device).float()
            y = store.p[:n].argmax(1).to(self.device)
            current.append(agreement(self.snapshot, x, y) if self.source else -1.0)
            for name, m in candidates.items():
                scores[name].append(agreement(m, x, y))
        best = max(scores, key=lambda k: min(scores[k]))
        if all(self.beats(s, c, len(store), margin)
               for s, c, store in zip(scores[best], current, self.stores, strict=True)):
            self.snapshot.load_state_dict(candidates[best].state_dict())
            self.source, current = best, scores[best]
        self.score = current[0]
        return self.source

    def beats(self, score: float, current: float, n: int, margin: float | None = None) -> bool:
        """Whether a candidate scoring ``score`` replaces a snapshot scoring ``current`` on ``n`` rows."""
        margin = self.margin if margin is None else margin
        if current < 0 or margin == 0:
            return score >= current
        return score > current + margin * math.sqrt(current * (1 - current) / n)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"{_prefix(i)}{k}": v for i, store in enumerate(self.stores) for k, v in store.tensors().items()}

    def scalars(self) -> dict[str, Any]:
        more = {f"holdout{i + 1}": store.scalars() for i, store in enumerate(self.stores) if i > 0}
        return {"holdout": self.stores[0].scalars(), **more, "source": self.source, "score": self.score}

    def load(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        for i, store in enumerate(self.stores):
            prefix, key = _prefix(i), "holdout" if i == 0 else f"holdout{i + 1}"
            if key in scalars and f"{prefix}buffer_x" in tensors:
                store.load({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}, scalars[key])
        self.source, self.score = str(scalars.get("source", "")), float(scalars.get("score", -1.0))


def _prefix(i: int) -> str:
    """The checkpoint-name prefix of store ``i`` (``holdout_`` for the first, as before several existed)."""
    return "holdout_" if i == 0 else f"holdout{i + 1}_"
