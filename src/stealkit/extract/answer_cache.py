"""The answer cache and the distinct-sample cap of surrogate-data extraction (Truong et al. 2021, appendix A.2).

At most ``max_distinct`` different images are ever queried; each is queried once, when first needed, and its
answer cached, so every later epoch re-uses it without spending a query.
"""

from __future__ import annotations

import torch

from stealkit.oracle import Oracle


class AnswerCache:
    """Answers of the oracle for the images ``x``, each queried at most once, when first asked for.

    ``get(idx)`` returns the answers of ``x[idx]``, sending only the not-yet-answered ones to the oracle (in
    one batch, charged to its ledger). ``n_answered`` is the number of distinct images answered.
    """

    def __init__(self, oracle: Oracle, x: torch.Tensor, *, query_batch: int = 256) -> None:
        self.oracle, self.x, self.query_batch = oracle, x, int(query_batch)
        self.answered = torch.zeros(x.shape[0], dtype=torch.bool)
        self.answers: torch.Tensor | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def n_answered(self) -> int:
        return int(self.answered.sum())

    def answered_indices(self) -> torch.Tensor:
        return self.answered.nonzero().flatten()

    def get(self, idx: torch.Tensor) -> torch.Tensor:
        idx = idx.long().cpu()
        todo = idx[~self.answered[idx]].unique()
        self.misses += int(todo.numel())
        self.hits += int(idx.numel() - todo.numel())
        for i in range(0, todo.numel(), self.query_batch):
            chunk = todo[i : i + self.query_batch]
            ans = self.oracle.query(self.x[chunk]).detach().cpu()
            if self.answers is None:
                self.answers = torch.zeros((self.x.shape[0], *ans.shape[1:]), dtype=ans.dtype)
            self.answers[chunk] = ans
            self.answered[chunk] = True
        assert self.answers is not None
        return self.answers[idx]


def distinct_cap(oracle: Oracle, pool_size: int, max_distinct: int | None) -> int:
    """How many distinct images may be queried: the pool, the cap and the remaining budget, whichever is least."""
    n = pool_size if max_distinct is None else min(pool_size, max_distinct)
    left = oracle.ledger.remaining()
    return n if left is None else min(n, left)
