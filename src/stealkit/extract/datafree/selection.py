"""Choosing the reported student without labelled data: agreement with the victim on held-out paid queries.

The attacker has no test set. What it does have are the victim's answers to its own queries, so a slice of
every round's answers (``holdout``) is set aside, never trained on and never replayed, and kept in a bounded
store of ``capacity`` rows: the most recent ones (``keep="recent"``: DFME and MAZE), or a uniform sample of every
round so far (``keep="all"``: CoDFe; reservoir sampling, Vitter's Algorithm R, so older generator distributions
stay represented and a student that only fits the latest rounds is not favoured). After every round each
candidate (each clone, their EMA) is scored by its top-1 agreement with the victim on the whole store, and so
is the student currently reported, whose weights are a snapshot; a candidate replaces the snapshot when it is
at least as good (``margin=0``) or, with ``margin > 0``, when it beats the snapshot by more than ``margin``
standard errors of the snapshot's agreement on the store (``sqrt(a (1 - a) / n)``), so that the reported
student does not follow the store's noise (a recent store with no margin let the reported CoDFe student fall 1.6
points at a 5k step, the reservoir with margin 2 none: docs/archive.md, "Data-free extraction"). Test accuracy is never read
here; the loop measures it for the report only (and the gap between the selected and the best-in-hindsight
student).

Another selector (another store, another rule) plugs in from the caller's code through the attacks'
``make_selector`` parameter: anything that satisfies :class:`Selector`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, Literal, Protocol

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


class HeldOutStore(ReplayBuffer):
    """The held-out rows: a ring buffer (``keep="recent"``) or a reservoir sample of every row ever added
    (``keep="all"``). The reservoir's draws come from a generator seeded by ``(seed, rows seen)``, so its
    checkpoint state is just the rows and two counters, and a resumed run draws what the uninterrupted one did."""

    def __init__(self, capacity: int, input_shape: tuple[int, ...], num_classes: int,
                 keep: Literal["recent", "all"] = "recent", seed: int = 0) -> None:
        if keep not in ("recent", "all"):
            from stealkit.errors import InputError

            raise InputError(f"held-out store: keep must be 'recent' or 'all', got {keep!r}")
        super().__init__(capacity, input_shape, num_classes)
        self.keep, self.seed, self.seen = keep, int(seed), 0

    def add(self, x: torch.Tensor, p: torch.Tensor) -> None:
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


class Selector(Protocol):
    """What an attack needs of a student selector (the hook for other selection rules): it is fed the
    held-out answered rows, asked after every round to choose among the candidates, and reports the chosen
    student's weights in ``snapshot`` (``source``: the chosen candidate's name, ``""`` before any choice;
    ``score``: its held-out agreement). ``tensors``/``scalars``/``load`` carry its state through checkpoints."""

    snapshot: nn.Module
    source: str
    score: float

    def add(self, x: torch.Tensor, soft: torch.Tensor) -> None: ...

    def consider(self, candidates: dict[str, nn.Module]) -> str: ...

    def tensors(self) -> dict[str, torch.Tensor]: ...

    def scalars(self) -> dict[str, Any]: ...

    def load(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None: ...


#: builds a :class:`Selector` around ``snapshot`` (a fresh student whose weights will hold the reported one)
MakeSelector = Callable[[nn.Module], Selector]


class StudentSelector:
    """Held-out answers and the snapshot of the student currently reported (see the module docstring)."""

    def __init__(self, snapshot: nn.Module, capacity: int, input_shape: tuple[int, ...], num_classes: int,
                 device: str, keep: Literal["recent", "all"] = "recent", margin: float = 0.0, seed: int = 0) -> None:
        self.store = HeldOutStore(capacity, input_shape, num_classes, keep, seed)
        self.margin = float(margin)
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
        if self.beats(scores[best], current, n):
            self.snapshot.load_state_dict(candidates[best].state_dict())
            self.source, current = best, scores[best]
        self.score = current
        return self.source

    def beats(self, score: float, current: float, n: int) -> bool:
        """Whether a candidate scoring ``score`` replaces a snapshot scoring ``current`` on ``n`` rows."""
        if current < 0 or self.margin == 0:
            return score >= current
        return score > current + self.margin * math.sqrt(current * (1 - current) / n)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"holdout_{k}": v for k, v in self.store.tensors().items()}

    def scalars(self) -> dict[str, Any]:
        return {"holdout": self.store.scalars(), "source": self.source, "score": self.score}

    def load(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        if "holdout" in scalars and "holdout_buffer_x" in tensors:
            self.store.load({k[len("holdout_"):]: v for k, v in tensors.items() if k.startswith("holdout_")},
                            scalars["holdout"])
        self.source, self.score = str(scalars.get("source", "")), float(scalars.get("score", -1.0))
