"""The two presets of ``stealkit extract surrogate`` (no torch here: the command reads them at import time).

``paper`` is the attack of DFME appendix A: random queries, no semi-supervised learning, the ragged last batch.
``auto`` (``DEFAULT_PRESET``, the command's default) was chosen on the validation split and confirmed on fresh
seeds (docs/guide/surrogate.md, "The default and why"; docs/results.md#surrogate-probs). :func:`resolve_preset` gives what it is for a budget
and an answer kind:

* label, top-k and logit answers below ``SMALL_BUDGET_PER_CLASS`` (10) answers per class: random queries and
  FixMatch on the unqueried pool (Sohn et al. NeurIPS 2020; Jagielski et al. 2020 Sec. 5.2;
  :mod:`stealkit.extract.surrogate_data.semi_supervised`) with label smoothing 0.1 (Szegedy et al. CVPR 2016 Sec. 7);
* from 10 per class: plain training with label smoothing 0.1 on label answers and equal-sized batches
  (:func:`stealkit.train.epoch_batches`);
* probability answers, at every budget: plain training with equal-sized batches at temperature 2 (DFME A.1's
  ``tau``), peak learning rate 0.05, gradients clipped to norm 5 (Pascanu et al. ICML 2013 Sec. 3.2) and at least
  ``STUDENT_MIN_STEPS`` optimiser steps;
* from ``ACTIVE_BUDGET_PER_CLASS`` (20) answers per class, on top: half the budget at random, the rest in four
  rounds of the round substitute's smallest top-2 margins (ActiveThief, Pal et al. AAAI 2020 Sec. 3;
  :mod:`stealkit.extract.surrogate_data.active`).

A setting may name a field of a group (``"active.initial"``): apply the dict with
:func:`stealkit.settings.apply_settings` (:func:`stealkit.extract.surrogate_data.surrogate.resolve_config` does).
"""

from __future__ import annotations

from typing import Any

#: the student's epochs and batch size of the command and of ``SurrogateConfig`` (64: the batch every
#: validation screen and every benchmark row of the default used)
DEFAULT_EPOCHS = 30
DEFAULT_BATCH_SIZE = 64

_PAPER: dict[str, Any] = {"select": "random", "ssl": "none"}
PRESETS: dict[str, dict[str, Any]] = {"paper": _PAPER}
DEFAULT_PRESET = "auto"
#: below this many answers per class the default is semi-supervised with label, top-k and logit answers
SMALL_BUDGET_PER_CLASS = 10
_SMALL_BUDGET: dict[str, Any] = {**_PAPER, "ssl": "fixmatch", "label_smoothing": 0.1}
#: from ``SMALL_BUDGET_PER_CLASS`` answers per class (and with probabilities at every budget): equal-sized batches,
#: label smoothing 0.1 on label answers from 10 per class
_LARGE_BUDGET: dict[str, Any] = {**_PAPER, "label_smoothing": 0.1, "label_smoothing_min_per_class": 10,
                                 "batching": "equal"}
#: with probability answers, also these
_PROBS_TRAINING: dict[str, Any] = {"tau": 2.0, "lr": 0.05, "grad_clip": 5.0}
#: with probability answers the student trains at least this many steps
STUDENT_MIN_STEPS = 3000
#: from this many answers per class the default selects by margin
ACTIVE_BUDGET_PER_CLASS = 20
_MARGIN_SELECTION: dict[str, Any] = {"select": "margin", "active.initial": 0.5}
PRESET_NAMES = (DEFAULT_PRESET, *PRESETS)


def resolve_preset(name: str, answers: int, num_classes: int, *, mode: str) -> tuple[str, dict[str, Any]]:
    """The preset ``name`` for a budget of ``answers`` distinct images of ``num_classes`` classes answered in oracle
    mode ``mode`` (``label``, ``topk``, ``probs``, ``logits``): ``paper`` is the same at every budget; ``auto`` is
    as the module docstring says. Returns the name of what it resolved to and its settings (a fresh dict)."""
    if name != DEFAULT_PRESET:
        return name, dict(PRESETS[name])
    if answers < SMALL_BUDGET_PER_CLASS * num_classes and mode != "probs":
        return "semi+label_smoothing=0.1", dict(_SMALL_BUDGET)
    resolved, chosen = "plain+batching=equal", dict(_LARGE_BUDGET)
    if mode == "probs":
        resolved = resolved + f"+tau=2+lr=0.05+grad_clip=5+min_steps={STUDENT_MIN_STEPS}"
        chosen = {**chosen, **_PROBS_TRAINING, "min_steps": STUDENT_MIN_STEPS}
    if answers >= ACTIVE_BUDGET_PER_CLASS * num_classes:
        resolved, chosen = resolved + "+select=margin+active.initial=0.5", {**chosen, **_MARGIN_SELECTION}
    return resolved, chosen
