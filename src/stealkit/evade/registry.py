"""The attacks by public name: run function, config dataclass and family.

``transfer`` attacks are crafted on a substitute and sent to the victim
(``run(substitute, oracle, x, y, config)`` with ``config = TransferConfig(method=name, ...)``); ``decision``
attacks use the victim's labels only (``run(oracle, x, y, max_queries=..., config=...)``).

    from stealkit.evade.registry import ATTACKS
    attack = ATTACKS["hopskipjump"]
    result = attack.run(oracle, x, y, max_queries=1000, config=attack.config(iterations=40))
"""

from __future__ import annotations

from stealkit.registry import Entry, Registry

_E = "stealkit.evade"

ATTACKS = Registry("attack", [
    Entry("fgsm", f"{_E}.gradient_based.transfer", "transfer_attack", "TransferConfig", "transfer", "Goodfellow et al. 2015"),
    Entry("bim", f"{_E}.gradient_based.transfer", "transfer_attack", "TransferConfig", "transfer", "Kurakin et al. 2017"),
    Entry("pgd", f"{_E}.gradient_based.transfer", "transfer_attack", "TransferConfig", "transfer", "Madry et al. 2018"),
    Entry("mifgsm", f"{_E}.gradient_based.transfer", "transfer_attack", "TransferConfig", "transfer", "Dong et al. 2018"),
    Entry("cw", f"{_E}.gradient_based.transfer", "transfer_attack", "TransferConfig", "transfer", "Carlini & Wagner 2017"),
    Entry("boundary", f"{_E}.decision_based.boundary", "boundary_attack", "BoundaryConfig", "decision", "Brendel et al. 2018"),
    Entry("hopskipjump", f"{_E}.decision_based.hopskipjump", "hopskipjump", "HopSkipJumpConfig", "decision",
          "Chen et al. 2020"),
    Entry("triangle", f"{_E}.decision_based.triangle", "triangle", "TriangleConfig", "decision", "Wang et al. ECCV 2022"),
])

#: attacks crafted on a substitute and transferred to the victim
TRANSFER: tuple[str, ...] = ATTACKS.family("transfer")
#: decision-based attacks on the victim's labels
DECISION: tuple[str, ...] = ATTACKS.family("decision")
