"""One table: which section builder each kind of run gets.

A run's kind is the ``command`` its ``config.json`` records (``"extract dfme"``, ``"study codfe"``, ...). The
builders are named as ``"module:function"`` and imported only when a page is built, so this layer depends on no
layer above it and nothing registers itself as an import side effect: ``stealkit report RUN_DIR`` renders every
kind exactly as the run itself did. A kind that is neither listed nor of a listed family (its first word) gets
:func:`~stealkit.report.builders.generic_sections` and a one-line note.
"""

from __future__ import annotations

import importlib
from typing import Any

GENERIC = "stealkit.report.builders:generic_sections"

#: run kind -> its section builder
BUILDERS: dict[str, str] = {
    "demo": "stealkit.demo:demo_sections",
    "train": "stealkit.report.builders:train_sections",
    "train-robust": "stealkit.report.builders:train_sections",
    "extract baseline": "stealkit.extract.report:extraction_sections",
    "extract gradient-matching": "stealkit.extract.report:extraction_sections",
    "extract surrogate": "stealkit.extract.report:surrogate_sections",
    "extract dfme": "stealkit.extract.report:datafree_sections",
    "extract maze": "stealkit.extract.report:datafree_sections",
    "extract dast": "stealkit.extract.report:datafree_sections",
    "extract codfe": "stealkit.extract.report:datafree_sections",
    "extract exact": "stealkit.extract.report:exact_sections",
    "attack study": "stealkit.studies.codfe_transfer:sections",
    "certify": "stealkit.certify.report:certify_sections",
    "certify-study": "stealkit.studies.stn_certify:sections",
    "defences": "stealkit.studies.defences:sections",
    "audit": "stealkit.audit.report:sections",
    "study dfme-table4": "stealkit.studies.dfme_table4:sections",
    "study dfme-logits": "stealkit.studies.dfme_logits:sections",
    "study dfme-hypothesis1": "stealkit.studies.dfme_hypothesis1:sections",
    "study codfe": "stealkit.studies.codfe_figure2:sections",
    "study explanations": "stealkit.studies.explanations:sections",
}

#: families whose members share one builder (the first word of the kind): every attack method's run
FAMILIES: dict[str, str] = {
    "attack": "stealkit.evade.report:attack_sections",
    "extract": "stealkit.extract.report:extraction_sections",
}


def builder_name(kind: str) -> tuple[str, bool]:
    """``("module:function", known)`` for a run kind; unknown kinds get the generic builder."""
    if kind in BUILDERS:
        return BUILDERS[kind], True
    family = kind.split(" ", 1)[0]
    if " " in kind and family in FAMILIES:
        return FAMILIES[family], True
    return GENERIC, False


def builder_for(kind: str) -> tuple[Any, bool]:
    """The section builder of a run kind (imported now) and whether the kind is known."""
    name, known = builder_name(kind)
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function), known
