"""Prometheus text exposition (format 0.0.4) for ``GET /metrics``, without a client library.

Served-query counters and PRADA flags are read from the database (shared by every worker); refusals and
latency histograms are per worker process and carry a ``pid`` label, so a scraper sums them.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Iterable

from stealkit.serve.store import Usage

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """In-process counters: refused requests by reason and request latency by endpoint."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refused: dict[tuple[str, str], int] = defaultdict(int)
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self._hist: dict[str, list[int]] = {}
        self._sum: dict[str, float] = defaultdict(float)
        self._count: dict[str, int] = defaultdict(int)
        self.prada_stat: dict[str, float] = {}

    def refuse(self, key: str, reason: str) -> None:
        with self._lock:
            self.refused[(key, reason)] += 1

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            h = self._hist.setdefault(endpoint, [0] * len(BUCKETS))
            for i, b in enumerate(BUCKETS):
                if seconds <= b:
                    h[i] += 1
            self._sum[endpoint] += seconds
            self._count[endpoint] += 1

    def render(self, usage: Iterable[tuple[str, Usage]]) -> str:
        pid = str(os.getpid())
        lines = [
            "# HELP stealkit_queries_served_total Images answered, by key and kind (all workers).",
            "# TYPE stealkit_queries_served_total counter",
        ]
        usage = list(usage)
        for name, u in usage:
            for kind, v in (("predict", u.predict), ("explain", u.explain)):
                lines.append(f'stealkit_queries_served_total{{key="{_label(name)}",kind="{kind}"}} {v}')
        lines += ["# HELP stealkit_queries_left Budget left per key (-1: unlimited).",
                  "# TYPE stealkit_queries_left gauge"]
        lines += [f'stealkit_queries_left{{key="{_label(n)}"}} {-1 if u.left is None else u.left}' for n, u in usage]
        lines += ["# HELP stealkit_prada_flagged 1 if PRADA flagged the key as an extraction attack.",
                  "# TYPE stealkit_prada_flagged gauge"]
        lines += [f'stealkit_prada_flagged{{key="{_label(n)}"}} {int(u.flagged)}' for n, u in usage]
        with self._lock:
            lines += ["# HELP stealkit_prada_statistic Shapiro-Wilk W of the key's query distances (this worker).",
                      "# TYPE stealkit_prada_statistic gauge"]
            lines += [f'stealkit_prada_statistic{{key="{_label(k)}",pid="{pid}"}} {w:.6f}'
                      for k, w in sorted(self.prada_stat.items())]
            lines += ["# HELP stealkit_requests_refused_total Requests refused, by key and reason (this worker).",
                      "# TYPE stealkit_requests_refused_total counter"]
            lines += [f'stealkit_requests_refused_total{{key="{_label(k)}",reason="{r}",pid="{pid}"}} {v}'
                      for (k, r), v in sorted(self.refused.items())]
            lines += ["# HELP stealkit_requests_total Requests by endpoint and status (this worker).",
                      "# TYPE stealkit_requests_total counter"]
            lines += [f'stealkit_requests_total{{endpoint="{e}",status="{s}",pid="{pid}"}} {v}'
                      for (e, s), v in sorted(self.requests.items())]
            lines += ["# HELP stealkit_request_latency_seconds Request latency by endpoint (this worker).",
                      "# TYPE stealkit_request_latency_seconds histogram"]
            for e, h in sorted(self._hist.items()):
                for b, c in zip(BUCKETS, h, strict=True):
                    lines.append(f'stealkit_request_latency_seconds_bucket{{endpoint="{e}",pid="{pid}",le="{b}"}} {c}')
                lines.append(f'stealkit_request_latency_seconds_bucket{{endpoint="{e}",pid="{pid}",le="+Inf"}} '
                             f"{self._count[e]}")
                lines.append(f'stealkit_request_latency_seconds_sum{{endpoint="{e}",pid="{pid}"}} {self._sum[e]:.6f}')
                lines.append(f'stealkit_request_latency_seconds_count{{endpoint="{e}",pid="{pid}"}} {self._count[e]}')
        return "\n".join(lines) + "\n"
