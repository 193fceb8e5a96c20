"""What the decision-based attacks share: metered label access under a hard cap, start points, line search.

:class:`LabelAccess` is the only way :mod:`~stealkit.evade.decision_based.boundary` and :mod:`~stealkit.evade.decision_based.hopskipjump`
reach the victim: every image goes through ``oracle.query`` (so the oracle's ledger counts it), and a query
is sent only if it fits both the per-example ``max_queries`` and the ledger's remaining budget; otherwise the
attack stops and returns the best adversarial example it has verified. Reported query counts are the
ledger's; the per-example tallies kept here only decide who may still ask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from stealkit.errors import BudgetExhausted, InputError
from stealkit.evade.base import AttackResult, Norm, flat_norms
from stealkit.oracle import Oracle, labels_from_answer


class OutOfQueries(Exception):
    """Internal: the next query would pass a cap. Attacks catch it and return what they have."""


class LabelAccess:
    """Label queries to ``oracle`` on behalf of B examples, never past ``max_queries`` each or the ledger."""

    def __init__(self, oracle: Oracle, y: torch.Tensor, target: torch.Tensor | None, *,
                 max_queries: int | None, batch_size: int = 1024) -> None:
        if max_queries is not None and max_queries < 1:
            raise InputError(f"max_queries must be a positive integer or None, got {max_queries!r}")
        self.oracle = oracle
        self.y = y
        self.target = target
        self.max_queries = max_queries
        self.batch_size = batch_size
        self.used = torch.zeros(y.numel(), dtype=torch.long)
        self._start = oracle.ledger.as_dict()

    def room(self, idx: torch.Tensor, each: int) -> torch.Tensor:
        """Which of the examples ``idx`` can each pay ``each`` more queries (in order, for the ledger)."""
        ok = torch.ones(idx.numel(), dtype=torch.bool)
        if self.max_queries is not None:
            ok &= self.used[idx] + each <= self.max_queries
        left = self.oracle.ledger.remaining()
        if left is not None:
            ok &= torch.cumsum(ok.long() * each, 0) <= left
        return ok

    def left(self, idx: torch.Tensor) -> torch.Tensor:
        """Queries each example of ``idx`` may still spend under its own cap (a large number if uncapped)."""
        if self.max_queries is None:
            return torch.full((idx.numel(),), 2**62, dtype=torch.long)
        return (self.max_queries - self.used[idx]).clamp_min(0)

    def is_adv(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """Query labels of ``x`` (row ``j`` on behalf of example ``owners[j]``) and say which are adversarial.

        Raises :class:`OutOfQueries` (having sent nothing) if any owner's cap or the ledger cannot pay.
        """
        owners = owners.reshape(-1).long().cpu()
        counts = torch.bincount(owners, minlength=self.used.numel())
        if self.max_queries is not None and bool((self.used + counts > self.max_queries).any()):
            raise OutOfQueries
        left = self.oracle.ledger.remaining()
        if left is not None and x.shape[0] > left:
            raise OutOfQueries
        try:
            answers = [self.oracle.query(x[i : i + self.batch_size]) for i in range(0, x.shape[0], self.batch_size)]
        except BudgetExhausted:
            raise OutOfQueries from None
        self.used += counts
        labels = labels_from_answer(torch.cat(answers), self.oracle.mode).to(self.y.device)
        owners = owners.to(self.y.device)
        if self.target is not None:
            return labels == self.target[owners]
        return labels != self.y[owners]

    def spent(self) -> dict[str, int]:
        """Queries charged to the ledger since this access was opened, by kind."""
        now = self.oracle.ledger.as_dict()
        return {k: now.get(k, 0) - self._start.get(k, 0) for k in now}


def lockstep(access: LabelAccess, idx: torch.Tensor, steps: int,
             step: Callable[[torch.Tensor], None]) -> None:
    """Up to ``steps`` iterations of ``step(sel)`` over the rows ``sel`` whose images can still afford a query
    (one batch of oracle calls per stage of an iteration, every image in lock-step); stops early once no image
    has a query left."""
    rows = torch.arange(idx.shape[0])
    for _ in range(steps):
        sel = rows[access.room(idx, 1)]
        if sel.numel() == 0:
            return
        step(sel)


def blend(x: torch.Tensor, x_adv: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``(1 - alpha) x + alpha x_adv`` per example (alpha [B])."""
    a = alpha.view(-1, *([1] * (x.dim() - 1)))
    return (1 - a) * x + a * x_adv


def binary_search(access: LabelAccess, x: torch.Tensor, x_adv: torch.Tensor, idx: torch.Tensor,
                  tol: float | torch.Tensor) -> torch.Tensor:
    """Move each adversarial ``x_adv`` along the line to ``x`` until within ``tol`` (in blend factor) of the
    boundary; returns points verified adversarial. Stops early (keeping the last verified point) when the
    caps are reached."""
    lo = torch.zeros(x.shape[0], device=x.device)
    hi = torch.ones(x.shape[0], device=x.device)
    tol_t = torch.as_tensor(tol, dtype=lo.dtype, device=x.device).expand_as(lo)
    live = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    while True:
        todo = live & ((hi - lo) > tol_t)
        if not bool(todo.any()):
            break
        sel = todo.nonzero().squeeze(1)
        room = access.room(idx[sel].cpu(), 1).to(sel.device)
        live[sel[~room]] = False  # out of queries: that example keeps its last verified point
        sel = sel[room]
        if sel.numel() == 0:
            break
        mid = (lo[sel] + hi[sel]) / 2
        adv = access.is_adv(blend(x[sel], x_adv[sel], mid), idx[sel])
        hi[sel] = torch.where(adv, mid, hi[sel])
        lo[sel] = torch.where(adv, lo[sel], mid)
    return blend(x, x_adv, hi)


def find_starts(access: LabelAccess, x: torch.Tensor, *, trials: int, gen: torch.Generator,
                owners: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform-noise start points that are adversarial: ``(starts, found)``; up to ``trials`` draws each.
    ``owners``: the examples of ``access`` the rows of ``x`` belong to (default: row ``i`` is example ``i``)."""
    starts = x.clone()
    found = torch.zeros(x.shape[0], dtype=torch.bool)
    idx_all = torch.arange(x.shape[0])
    own = owners.long().cpu() if owners is not None else idx_all
    for _ in range(trials):
        todo = idx_all[~found]
        if todo.numel() == 0:
            break
        todo = todo[access.room(own[todo], 1)]
        if todo.numel() == 0:
            break
        noise = torch.rand((todo.numel(), *x.shape[1:]), generator=gen).to(x.device)
        try:
            adv = access.is_adv(noise, own[todo]).cpu()
        except OutOfQueries:
            break
        starts[todo[adv].to(x.device)] = noise[adv.to(x.device)]
        found[todo[adv]] = True
    return starts, found


def check_starts(access: LabelAccess, x: torch.Tensor, starting_points: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Check user-given start points (one query each): ``(starts, found)``."""
    if tuple(starting_points.shape) != tuple(x.shape):
        raise InputError(f"starting_points must have the shape of x {list(x.shape)}, got "
                         f"{list(starting_points.shape)}")
    sp = starting_points.detach().float().to(x.device).clamp(0, 1)
    idx = torch.arange(x.shape[0])
    ok = access.room(idx, 1)
    found = torch.zeros(x.shape[0], dtype=torch.bool)
    if bool(ok.any()):
        found[idx[ok]] = access.is_adv(sp[ok.to(x.device)], idx[ok]).cpu()
    return sp, found


def decision_result(access: LabelAccess, x: torch.Tensor, y: torch.Tensor, tgt: torch.Tensor | None,
            best: torch.Tensor, found: torch.Tensor) -> AttackResult:
    """Package a decision-based attack's outcome without further queries: success = a verified adversarial
    point was found; ``labels`` is the target there (targeted) or -1, "not y" (untargeted: not queried)."""
    f = found.to(x.device)
    x_adv = torch.where(f.view(-1, *([1] * (x.dim() - 1))), best, x)
    labels = torch.where(f, torch.full_like(y, -1), y)
    if tgt is not None:
        labels = torch.where(f, tgt, labels)
    return AttackResult(x_adv=x_adv, success=f.clone(), norms=flat_norms(x_adv - x, Norm.L2), norm=Norm.L2,
                        labels=labels, target=tgt, queries=access.spent(),
                        extra={"queries_per_example": access.used.clone()})
