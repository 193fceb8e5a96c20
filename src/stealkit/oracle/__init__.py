"""Oracles: the metered interface between a victim and every attack (local or over HTTP)."""

from stealkit.oracle.base import (
    ExplainArgs,
    ExplanationOracle,
    Oracle,
    OutputMode,
    answer_from_logits,
    check_explain_args,
    explain_price,
    keep_top_k,
    labels_from_answer,
    validate_images,
)
from stealkit.oracle.ledger import QueryKind, QueryLedger, QueryRecord
from stealkit.oracle.local import Defence, InputAwareDefence, LocalExplanationOracle, LocalOracle

__all__ = [
    "Defence",
    "ExplainArgs",
    "ExplanationOracle",
    "InputAwareDefence",
    "LocalExplanationOracle",
    "LocalOracle",
    "Oracle",
    "OutputMode",
    "QueryKind",
    "QueryLedger",
    "QueryRecord",
    "answer_from_logits",
    "check_explain_args",
    "explain_price",
    "keep_top_k",
    "labels_from_answer",
    "validate_images",
]
