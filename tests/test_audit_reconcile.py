"""The audit's reconciliation with a v2 (Open Inference Protocol) server's own count, against fake servers that
answer as ``stealkit serve --protocol v2``, Triton (statistics extension) and a server with no count do."""

from __future__ import annotations

from typing import Any

import httpx

from stealkit.audit.reconcile import V2_METADATA, V2_STATS, reconcile_audit, reconciliation_line, v2_usage

VICTIM = "v2+http://127.0.0.1:9/v2/models/digits"


def fake(routes: dict[str, dict[str, Any]]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in routes:
            return httpx.Response(200, json=routes[request.url.path])
        return httpx.Response(404, json={"error": "not found"})

    return httpx.MockTransport(handler)


def test_stealkit_v2_metadata_gives_this_keys_count() -> None:
    server = fake({"/v2/models/digits": {"name": "digits", "parameters": {"queries_used": {"predict": 7,
                                                                                           "explain": 2}}}})
    assert v2_usage(VICTIM, "k", transport=server) == {"source": V2_METADATA, "counts": {"predict": 7, "explain": 2}}


def test_triton_statistics_extension_gives_the_models_inference_count() -> None:
    # the response of Triton's GET /v2/models/NAME/stats (one row per version; inference_count counts images)
    server = fake({"/v2/models/digits": {"name": "digits", "platform": "onnxruntime_onnx"},
                   "/v2/models/digits/stats": {"model_stats": [
                       {"name": "digits", "version": "1", "inference_count": 40, "execution_count": 3},
                       {"name": "digits", "version": "2", "inference_count": 2, "execution_count": 1}]}})
    assert v2_usage(VICTIM, None, transport=server) == {"source": V2_STATS, "counts": {"predict": 42}}


def test_a_server_without_a_count_is_not_reconcilable() -> None:
    server = fake({"/v2/models/digits": {"name": "digits", "platform": "kserve"}})
    before = v2_usage(VICTIM, None, transport=server)
    assert before == {"source": None, "counts": None}
    rec = reconcile_audit(before, before, [{"queries": {"predict": 30, "explain": 0}}])
    assert rec["equal"] is None and rec["server"] is None and rec["audit"] == {"predict": 30, "explain": 0}
    assert reconciliation_line(rec).startswith("queries not reconcilable: the server exposes no count")


def test_counts_over_the_audit_are_compared_kind_by_kind() -> None:
    before = {"source": V2_STATS, "counts": {"predict": 100}}
    results = [{"queries": {"predict": 30, "explain": 0}}, {"queries": {"predict": 12, "explain": 0}}]
    rec = reconcile_audit(before, {"source": V2_STATS, "counts": {"predict": 142}}, results)
    assert rec["equal"] is True and rec["server"] == {"predict": 42} and "equal" in reconciliation_line(rec)
    rec = reconcile_audit(before, {"source": V2_STATS, "counts": {"predict": 150}}, results)
    assert rec["equal"] is False and "NOT EQUAL (another client may share the key or the model)" in \
        reconciliation_line(rec)


def test_a_column_only_a_later_row_has_goes_where_that_row_puts_it() -> None:
    from stealkit.audit.report import format_table

    rows = [{"answers": "label", "attacker": "like", "fidelity @50": 0.8, "Q90": 50},
            {"answers": "label", "attacker": "data-free", "fidelity @2000": 0.7, "Q90": "not reached within 2,000"}]
    assert format_table(rows).splitlines()[0].split() == ["answers", "attacker", "fidelity", "@50", "fidelity",
                                                          "@2000", "Q90"]
