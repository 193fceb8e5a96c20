"""PRADA: detecting model extraction from the distribution of distances between a client's queries.

Juuti, Szyller, Marchal, Asokan, "PRADA: Protecting against DNN Model Stealing Attacks" (EuroS&P 2019),
Sec. IV-B and Algorithm 1. Benign clients query natural samples whose minimum L2 distances to earlier queries
are roughly normally distributed; extraction attacks that synthesise queries by small perturbations of a few
seeds (Papernot et al.'s JbDA, Tramer et al.) produce a far-from-normal distribution. For each query ``x``
with predicted class ``c`` (the model's own top-1):

1. if the class's growing set ``G_c`` is empty, ``x`` joins it (no distance is recorded);
2. otherwise ``d_min`` = min L2 distance from ``x`` to ``G_c`` is appended to ``D``; if ``d_min`` exceeds the
   class threshold ``T_c``, ``x`` joins ``G_c``, ``d_min`` joins ``D_Gc`` and
   ``T_c = max(T_c, mean(D_Gc) - std(D_Gc))``;
3. once ``|D| > min_samples``: drop the outliers of ``D`` outside mean +- 3 std, compute the Shapiro-Wilk
   statistic ``W``; ``W < delta`` flags the client as an attacker.

Distances are on pixels in [0, 1], flattened. Bounded memory (our choice, not the paper's): ``G_c`` stops
growing at ``max_growing`` samples and ``W`` is computed on the most recent 5,000 distances (the range where
SciPy's Shapiro-Wilk is exact). Under ``stealkit serve --workers N`` each worker process keeps its own state
for the queries it serves; a flag, once raised, is stored in the database and seen by every worker.
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stealkit.errors import InputError
from stealkit.serve import keyfields as kf

SHAPIRO_MAX = 5000


@dataclass(frozen=True)
class PradaConfig:
    """PRADA settings: ``delta`` is the Shapiro-Wilk threshold, ``min_samples`` the distances needed first."""

    delta: float = 0.9
    min_samples: int = 100
    block: bool = False
    max_growing: int = 20000

    @classmethod
    def parse(cls, value: Any, where: str) -> PradaConfig | None:
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise InputError(f"{where}: prada must be true/false or a table like {{delta = 0.9, block = false}}")
        unknown = set(value) - {"delta", "min_samples", "block", "max_growing"}
        if unknown:
            raise InputError(f"{where}: unknown prada fields {sorted(unknown)}")
        d = cls()
        return cls(delta=kf.number(value.get("delta", d.delta), f"{where}: 'prada.delta'", 0.0, 1.0, lo_open=True),
                   min_samples=kf.integer(value.get("min_samples", d.min_samples), f"{where}: 'prada.min_samples'",
                                          3, 10**7),
                   block=kf.boolean(value.get("block", d.block), f"{where}: 'prada.block'"),
                   max_growing=kf.integer(value.get("max_growing", d.max_growing), f"{where}: 'prada.max_growing'",
                                          1, 10**8))



@dataclass(frozen=True)
class PradaState:
    """What the detector says about one client now."""

    n_distances: int
    statistic: float | None
    flagged: bool


class Prada:
    """The detector for one client (thread-safe). Feed it every answered batch with :meth:`update`."""

    def __init__(self, config: PradaConfig | None = None) -> None:
        self.config = config or PradaConfig()
        self._growing: dict[int, torch.Tensor] = {}  # class -> [n, d] buffer (first _sizes[c] rows valid)
        self._sizes: dict[int, int] = {}
        self._gdist: dict[int, list[float]] = {}
        self._thresholds: dict[int, float] = {}
        self._distances: deque[float] = deque(maxlen=SHAPIRO_MAX)
        self._n_distances = 0
        self.statistic: float | None = None
        self.flagged = False
        self._lock = threading.Lock()

    def update(self, x: torch.Tensor, labels: torch.Tensor) -> PradaState:
        """Process a batch of queries ``[B, ...]`` (in order) with the model's predicted classes ``[B]``."""
        flat = x.detach().reshape(x.shape[0], -1).float().cpu()
        labels = labels.detach().reshape(-1).long().cpu()
        with self._lock:
            for c in labels.unique().tolist():
                idx = (labels == c).nonzero().flatten()
                self._update_class(int(c), flat[idx])
            self._test()
            return PradaState(self._n_distances, self.statistic, self.flagged)

    def _update_class(self, c: int, xs: torch.Tensor) -> None:
        """Algorithm 1 for the queries of one class, in order; distances to the existing set in one cdist."""
        size = self._sizes.get(c, 0)
        start = 0
        if size == 0:
            self._append(c, xs[0])
            size, start = 1, 1
        if start >= xs.shape[0]:
            return
        rest = xs[start:]
        d_old = torch.cdist(rest, self._growing[c][:size]).min(dim=1).values  # to G_c before this batch
        threshold = self._thresholds.get(c, 0.0)
        for i in range(rest.shape[0]):
            d = float(d_old[i])
            added = self._sizes[c] - size
            if added:
                new = self._growing[c][size : size + added]
                d = min(d, float(torch.linalg.vector_norm(new - rest[i], dim=1).min()))
            self._distances.append(d)
            self._n_distances += 1
            if d > threshold and self._sizes[c] < self.config.max_growing:
                self._append(c, rest[i])
                gd = self._gdist.setdefault(c, [])
                gd.append(d)
                arr = np.asarray(gd)
                threshold = max(threshold, float(arr.mean() - arr.std()))
        self._thresholds[c] = threshold

    def _append(self, c: int, x: torch.Tensor) -> None:
        buf = self._growing.get(c)
        n = self._sizes.get(c, 0)
        if buf is None or n == buf.shape[0]:
            new = torch.empty(max(16, 2 * n), x.numel())
            if buf is not None:
                new[:n] = buf[:n]
            buf = self._growing[c] = new
        buf[n] = x
        self._sizes[c] = n + 1

    def _test(self) -> None:
        if self._n_distances <= self.config.min_samples:
            return
        from scipy.stats import shapiro

        d = np.asarray(self._distances)
        mu, sd = d.mean(), d.std()
        kept = d[np.abs(d - mu) <= 3 * sd] if sd > 0 else d
        if kept.size < 3 or np.ptp(kept) == 0:
            self.statistic = 0.0  # identical distances: as far from a normal distribution as it gets
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.statistic = float(shapiro(kept).statistic)
        if self.statistic < self.config.delta:
            self.flagged = True

    @property
    def state(self) -> PradaState:
        with self._lock:
            return PradaState(self._n_distances, self.statistic, self.flagged)


class PradaWatch:
    """PRADA over one client's whole stream, tested after every query as Algorithm 1 does: :attr:`flagged_at` is
    the number of queries after which it first flags (1-based), ``None`` while it has not. (A server tests once
    per request, so it flags at the end of the request holding that query.) Once flagged, later queries are only
    counted: the flag stands. Feed it with :meth:`observe` in the order the queries were answered."""

    def __init__(self, config: PradaConfig | None = None) -> None:
        self.detector = Prada(config)
        self.queries = 0
        self.flagged_at: int | None = None
        self.statistic_at_flag: float | None = None

    def observe(self, x: torch.Tensor, labels: torch.Tensor) -> None:
        """Queries ``x [B, ...]`` in order, with the classes the answers carry ``[B]``."""
        b = int(x.shape[0])
        det = self.detector
        if self.flagged_at is not None:
            self.queries += b
            return
        if det.state.n_distances + b <= det.config.min_samples:
            # no test runs below min_samples distances, and each class's set grows in query order either way:
            # the batch in one update leaves the detector as query by query would
            det.update(x, labels)
            self.queries += b
            return
        for i in range(b):
            state = det.update(x[i : i + 1], labels[i : i + 1])
            self.queries += 1
            if state.flagged:
                self.flagged_at = self.queries
                self.statistic_at_flag = state.statistic
                self.queries += b - i - 1
                return

    def as_dict(self) -> dict[str, object]:
        """What the watch saw: queries, the flag (query count or ``None``), the statistic, the settings."""
        state = self.detector.state
        return {"queries": self.queries, "flagged_at": self.flagged_at,
                "statistic": self.statistic_at_flag if self.flagged_at is not None else state.statistic,
                "distances": state.n_distances, "delta": self.detector.config.delta,
                "min_samples": self.detector.config.min_samples}
