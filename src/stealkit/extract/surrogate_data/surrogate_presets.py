"""The presets of ``stealkit extract surrogate`` (no torch here: the command reads them at import time).

``paper`` is the attack of DFME appendix A (random queries, no semi-supervised learning); ``plain`` (the
default until the seventh pass) is the same with label smoothing 0.1 on label answers when the budget gives at least 10 queries per
class (Szegedy et al. CVPR 2016 Sec. 7; sixth pass, chosen on the validation split, docs/surrogate-active.md;
probability answers, and budgets below 10 per class, train exactly as ``paper``); ``semi``
adds FixMatch with its remedies against confirmation bias on the unqueried pool
(:mod:`stealkit.extract.surrogate_data.semi_supervised`), still with random queries; ``active`` queries by k-center coverage
(:mod:`stealkit.extract.surrogate_data.active`) and adds FixMatch; ``typiclust`` (fourth pass, made budget-aware in the fifth)
pretrains the student on the pool by rotation prediction and chooses the first 10 queries per class by
TypiClust in its features (``cold_start_size``), the rest at random like ``plain``; up to 10 queries per class
every student starts from the pretrained weights and fine-tunes at ``pretraining.finetune_lr=0.05``, above it
students start fresh (``pretraining.warm_max_per_class=10``) (:mod:`stealkit.extract.surrogate_data.pretrain`,
:mod:`stealkit.extract.surrogate_data.typiclust`). Its fourth-pass meaning (TypiClust for the whole budget, pretrained
students at the attack's learning rate at every budget) is ``--set cold_start_size=BUDGET --set
pretraining.finetune_lr=none --set pretraining.warm_max_per_class=none``.
``DEFAULT_PRESET`` (``auto``, seventh pass) is the command's default, chosen on the validation split
(docs/surrogate-active.md): budget-aware, it is ``semi`` with label smoothing 0.1 when the budget gives fewer than
``SMALL_BUDGET_PER_CLASS`` (10) answers per class and ``plain`` from 10 per class (:func:`resolve_preset`); since the
ninth pass its ``plain`` cuts every epoch into equal-sized batches (``batching="equal"``: as many batches, sizes
within one of each other, instead of a small last one; :func:`stealkit.train.epoch_batches`), chosen on the
validation split; ``--set batching=ragged`` gives the eighth pass's default, and every named preset (``plain``,
``paper``, ...) keeps the ragged last batch. Since the tenth pass the default also depends on the answer kind: with
probability answers (oracle mode ``probs``) from 10 answers per class it distils at temperature 2 (DFME A.1's
``tau``; Hinton et al. 2015 Sec. 2) with peak learning rate 0.05 and every step's gradient clipped to norm 5
(Pascanu et al. ICML 2013 Sec. 3.2), chosen on the validation split and confirmed on fresh seeds; label, ``topk`` and
``logits`` answers, and budgets below 10 per class, are unchanged. From ``ACTIVE_BUDGET_PER_CLASS`` (20) answers per
class the default also chooses what it asks: half the budget at random, the rest in four rounds of the round
substitute's smallest top-2 margins (``select="margin"``, ``active.initial=0.5``; ActiveThief, Pal et al. AAAI 2020
Sec. 3, :mod:`stealkit.extract.surrogate_data.active`), chosen on the validation split at Fashion-MNIST 1k and confirmed on fresh
seeds, then its threshold lowered from 100 to 20 per class by a second screen and confirmation (digits 200,
Fashion-MNIST 300; at 10 per class it lost) (docs/surrogate-active.md, "Tenth pass: margin selection"). Since the
eleventh pass the student trained on probability answers from 10 per class takes at least ``STUDENT_MIN_STEPS``
optimiser steps (``min_steps``: its epochs raised at small budgets, where 30 epochs are a few dozen steps; the
round substitutes keep theirs; label answers, level or worse on Fashion-MNIST, keep 30 epochs), chosen on the
validation split and confirmed on fresh seeds (docs/surrogate-active.md, "Eleventh pass: a step floor"); the same recipe then replaced FixMatch for probability
answers below 10 per class too (validation screen and fresh seeds at digits 50 and Fashion-MNIST 50). A setting may name a field of a group
(``"active.initial"``): apply the whole dict with :func:`stealkit.settings.apply_settings`. A default must not be
worse on any validated setting than the attack it replaces.
"""

from __future__ import annotations

from typing import Any

_PLAIN: dict[str, Any] = {"select": "random", "ssl": "none", "pretrain": "none", "cold_start": "random"}
PRESETS: dict[str, dict[str, Any]] = {
    "semi": {**_PLAIN, "ssl": "fixmatch"},
    "active": {**_PLAIN, "select": "kcenter", "ssl": "fixmatch"},
    "typiclust": {**_PLAIN, "pretrain": "rotation", "cold_start": "typiclust"},
    "plain": {**_PLAIN, "label_smoothing": 0.1, "label_smoothing_min_per_class": 10},
    "paper": _PLAIN,
}
DEFAULT_PRESET = "auto"
#: below this many answers per class the default is semi-supervised with label, top-k and logit answers (seventh
#: pass, validation split); with probability answers it is not since the eleventh pass
SMALL_BUDGET_PER_CLASS = 10
_SMALL_BUDGET: dict[str, Any] = {**PRESETS["semi"], "label_smoothing": 0.1}
#: from ``SMALL_BUDGET_PER_CLASS`` answers per class: ``plain`` with equal-sized batches (ninth pass, validation split)
_LARGE_BUDGET: dict[str, Any] = {**PRESETS["plain"], "batching": "equal"}
#: with probability answers, also these (tenth pass from 10 answers per class; eleventh pass at every budget)
_PROBS_TRAINING: dict[str, Any] = {"tau": 2.0, "lr": 0.05, "grad_clip": 5.0}
#: with probability answers the student trains at least this many steps (eleventh pass, validation split)
STUDENT_MIN_STEPS = 3000
#: from this many answers per class the default selects by margin (tenth pass, validation split)
ACTIVE_BUDGET_PER_CLASS = 20
_MARGIN_SELECTION: dict[str, Any] = {"select": "margin", "active.initial": 0.5}
PRESET_NAMES = (DEFAULT_PRESET, *PRESETS)


def resolve_preset(name: str, answers: int, num_classes: int, *, mode: str) -> tuple[str, dict[str, Any]]:
    """The preset ``name`` means for a budget of ``answers`` distinct images of ``num_classes`` classes answered in
    oracle mode ``mode`` (``label``, ``topk``, ``probs``, ``logits``): the preset itself, except ``auto`` (the
    default), which is ``semi`` with label smoothing 0.1 below ``SMALL_BUDGET_PER_CLASS`` answers per class and
    ``plain`` with equal-sized batches from there, except with probability answers (``mode`` ``probs``): ``plain``
    with equal-sized batches, ``tau=2``, ``lr=0.05``, ``grad_clip=5`` and ``min_steps=STUDENT_MIN_STEPS`` at every
    budget; and margin selection
    from ``ACTIVE_BUDGET_PER_CLASS`` answers per class. Returns the name of what it resolved to and its settings (a
    fresh dict; apply it with :func:`stealkit.settings.apply_settings`, which takes ``"active.initial"``-style keys)."""
    if name == DEFAULT_PRESET:
        if answers < SMALL_BUDGET_PER_CLASS * num_classes and mode != "probs":
            return "semi+label_smoothing=0.1", dict(_SMALL_BUDGET)
        resolved, chosen = "plain+batching=equal", dict(_LARGE_BUDGET)
        if mode == "probs":
            resolved = resolved + f"+tau=2+lr=0.05+grad_clip=5+min_steps={STUDENT_MIN_STEPS}"
            chosen = {**chosen, **_PROBS_TRAINING, "min_steps": STUDENT_MIN_STEPS}
        if answers >= ACTIVE_BUDGET_PER_CLASS * num_classes:
            resolved, chosen = resolved + "+select=margin+active.initial=0.5", {**chosen, **_MARGIN_SELECTION}
        return resolved, chosen
    return name, dict(PRESETS[name])
