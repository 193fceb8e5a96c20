"""Fidelity of a remote victim's copies: the audit buys the victim's top-1 labels of the test split once.

A local victim's labels come from its model, without a query. A remote victim's cost queries: the audit asks for
them before any part (``evaluation`` queries on their own ledger, journalled so a resumed audit pays for none of
them twice), planned within ``--max-queries`` and shown apart from the attacks' queries in the plan, the summary and
the reconciliation with the server's count. Without a known data set there is no test split: fidelity is then
"not measured".
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stealkit.oracle.victim import Target

#: where the bought labels are kept (and their journal, while they are bought)
EVALUATION = "evaluation.json"
#: images per query batch
BATCH = 256


@dataclass(frozen=True)
class Evaluation:
    """The victim's top-1 labels of the test split (``labels``, in test order), what they cost (the ledger's)
    and the victim's accuracy on the split."""

    images: int
    queries: dict[str, int]
    labels: list[int]
    victim_accuracy: float
    replayed: int = 0

    def summary(self) -> dict[str, Any]:
        return {"images": self.images, "queries": self.queries, "victim_accuracy": self.victim_accuracy,
                "what": "the victim's top-1 labels of the test split, bought once: the reference of every fidelity"}


def needed(target: Target) -> tuple[int, str | None]:
    """How many evaluation queries the audit must spend (0 for a local victim), and why fidelity cannot be
    measured where it cannot (a remote victim whose data set is unknown)."""
    from stealkit.audit.parts import close
    from stealkit.errors import InputError
    from stealkit.oracle.victim import victim_test

    v = target.open(mode="label", budget=0)
    close(v)
    if v.model is not None:
        return 0, None
    try:
        return len(victim_test(v, target.data_dir).y), None
    except InputError as exc:
        return 0, f"fidelity not measured: {exc}"


def buy(target: Target, run_path: Path, images: int) -> Evaluation:
    """The victim's labels of the test split: read back from ``run_path`` when bought before, else queried
    through an oracle metered to ``images`` queries whose answers are journalled as they arrive."""
    import torch

    from stealkit.audit.parts import close
    from stealkit.extract.journal import JournalOracle
    from stealkit.fsutil import atomic_write_json
    from stealkit.metrics import agreement
    from stealkit.oracle import labels_from_answer
    from stealkit.oracle.victim import victim_test

    path = run_path / EVALUATION
    if path.exists():
        doc = json.loads(path.read_text(encoding="utf-8"))
        return Evaluation(**doc)
    v = target.open(mode="label", budget=images)
    test = victim_test(v, target.data_dir)
    oracle = JournalOracle(v.oracle)
    oracle.open(run_path / "evaluation.answers", replay=True)
    try:
        labels = torch.cat([labels_from_answer(oracle.query(test.x[i:i + BATCH]), v.oracle.mode).cpu()
                            for i in range(0, len(test.y), BATCH)])
    finally:
        oracle.close()
        close(v)
    ev = Evaluation(images=len(test.y), queries=v.oracle.ledger.as_dict(), labels=[int(t) for t in labels],
                    victim_accuracy=float(agreement(labels, test.y)), replayed=oracle.replayed)
    atomic_write_json(path, asdict(ev))
    return ev
