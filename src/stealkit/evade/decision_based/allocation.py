"""GeoDA's allocation of a known query budget over the iterations of a boundary attack.

Rahmati, Moosavi-Dezfooli, Frossard and Dai, "GeoDA: a geometric framework for black-box adversarial attacks"
(CVPR 2020), Sec. 3.3: with a total budget ``N`` spent over ``T`` iterations of "estimate the normal at a
boundary point, then move", the bound on the final distance is smallest when iteration ``t`` (from 0) gets

    ``n_t = N eta^(-2t/3) / sum_s eta^(-2s/3)``

evaluations, ``eta < 1`` (their ``lambda``; 0.6 in the reference code): a geometric growth over the
iterations, the last ones the largest. ``T`` is the number of iterations that leaves the first one a useful
estimate (the reference code moves ``T`` until ``n_0`` is between 50 and 80; here: the most iterations with
``n_0 >= first``). Each iteration also pays its boundary search (``reserve`` queries, set aside first).

Used by :mod:`stealkit.evade.decision_based.hopskipjump` (``schedule="geoda"``): each example's plan is made from what is
left of its per-image budget after its start search, so it needs ``max_queries``.
"""

from __future__ import annotations

from stealkit.errors import InputError


def geoda_plan(budget: int, reserve: int, *, eta: float = 0.6, first: int = 50, max_rounds: int = 1000
               ) -> list[int]:
    """Evaluations per iteration for ``budget`` queries, each iteration also paying ``reserve``: the longest
    geometric plan (ratio ``eta^(-2/3)``) whose first iteration gets at least ``first``; ``[]`` if not even one
    iteration fits. The plan plus ``reserve`` per iteration never exceeds ``budget``."""
    if not 0 < eta < 1:
        raise InputError(f"eta must be in (0, 1), got {eta!r}")
    if first < 1 or reserve < 0:
        raise InputError("first must be positive and reserve non-negative")
    ratio = eta ** (-2 / 3)
    best: list[int] = []
    for rounds in range(1, max_rounds + 1):
        left = budget - rounds * reserve
        coefs = [ratio**t for t in range(rounds)]
        plan = [int(left * c / sum(coefs)) for c in coefs]
        if left <= 0 or plan[0] < first:
            break
        best = plan
    return best


__all__ = ["geoda_plan"]
