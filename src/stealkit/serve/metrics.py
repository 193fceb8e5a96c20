"""Prometheus metrics for ``GET /metrics`` through ``prometheus_client``.

With ``--workers N`` the supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` before the workers start, so every
worker writes its counters there and a scrape answered by any worker aggregates all of them into one series
per metric (no per-pid series). Served queries, budget left and PRADA flags are read from the database at
scrape time (shared by every worker). Labels are key ids (the keys file's ``name``), never key material.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from stealkit.serve.store import Usage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def multiprocess() -> bool:
    """Whether this process writes its metrics to a directory shared with its sibling workers."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class _UsageCollector:
    """Per-key served queries, budget left and PRADA flags, read from the store at each scrape."""

    def __init__(self, usage: Callable[[], dict[str, Usage]]) -> None:
        self._usage = usage

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        usage = sorted(self._usage().items())
        served = GaugeMetricFamily("stealkit_queries_served_total", "Images answered, by key and kind (all workers).",
                                   labels=["key", "kind"])
        left = GaugeMetricFamily("stealkit_queries_left", "Budget left per key (-1: unlimited).", labels=["key"])
        flagged = GaugeMetricFamily("stealkit_prada_flagged", "1 if PRADA flagged the key as an extraction attack.",
                                    labels=["key"])
        for key, u in usage:
            served.add_metric([key, "predict"], u.predict)
            served.add_metric([key, "explain"], u.explain)
            left.add_metric([key], -1 if u.left is None else u.left)
            flagged.add_metric([key], int(u.flagged))
        return [served, left, flagged]


class Metrics:
    """Request counts and latency by endpoint and status, refusals by key and reason, PRADA statistics."""

    def __init__(self) -> None:
        self._registry = None if multiprocess() else CollectorRegistry()
        reg = self._registry
        self.requests = Counter("stealkit_requests", "Responses by endpoint and status (every response once).",
                                ["endpoint", "status"], registry=reg)
        self.refused = Counter("stealkit_requests_refused", "Requests refused, by key and reason.",
                               ["key", "reason"], registry=reg)
        self.latency = Histogram("stealkit_request_latency_seconds", "Request latency by endpoint.", ["endpoint"],
                                 buckets=BUCKETS, registry=reg)
        self.prada = Gauge("stealkit_prada_statistic", "Shapiro-Wilk W of the key's query distances.", ["key"],
                           registry=reg, multiprocess_mode="max")

    def refuse(self, key: str, reason: str) -> None:
        self.refused.labels(key=key, reason=reason).inc()

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.latency.labels(endpoint=endpoint).observe(seconds)

    def prada_statistic(self, key: str, value: float) -> None:
        self.prada.labels(key=key).set(value)

    def render(self, usage: Callable[[], dict[str, Usage]]) -> bytes:
        """The exposition text: this process's (or all workers') metrics plus the store's per-key gauges."""
        registry = CollectorRegistry()
        if self._registry is None:
            MultiProcessCollector(registry)
        else:
            registry.register(_Forward(self._registry))
        registry.register(_UsageCollector(usage))
        return generate_latest(registry)


class _Forward:
    """Expose another registry's metrics inside a scrape registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        return self._registry.collect()
