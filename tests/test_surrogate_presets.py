"""The presets of ``stealkit extract surrogate`` and the budget rule of the default (seventh pass)."""

from __future__ import annotations

import pytest

from stealkit.extract.surrogate_data.surrogate_presets import (
    ACTIVE_BUDGET_PER_CLASS,
    DEFAULT_PRESET,
    PRESETS,
    SMALL_BUDGET_PER_CLASS,
    STUDENT_MIN_STEPS,
    resolve_preset,
)

SIXTH_PASS_DEFAULT = {"select": "random", "ssl": "none", "pretrain": "none", "cold_start": "random",
                      "label_smoothing": 0.1, "label_smoothing_min_per_class": 10}


@pytest.mark.parametrize("mode", ["label", "topk", "logits"])
def test_from_ten_answers_per_class_the_default_is_the_sixth_pass_one_with_equal_batches(mode):
    """From 10 to 19 answers per class (Fashion-MNIST 100-199 queries) the default is the sixth pass's with equal-sized
    batches (ninth pass) for every answer kind but probabilities (from 20 per class it also selects by margin); ``plain`` itself, and so ``--set batching=ragged``
    on the default, is the old one."""
    assert DEFAULT_PRESET == "auto" and SMALL_BUDGET_PER_CLASS == 10
    for budget in (100, 199):
        assert resolve_preset(DEFAULT_PRESET, budget, 10, mode=mode) == ("plain+batching=equal",
                                                                         {**SIXTH_PASS_DEFAULT, "batching": "equal"})
    assert PRESETS["plain"] == SIXTH_PASS_DEFAULT and all("batching" not in p for p in PRESETS.values())


@pytest.mark.parametrize("budget,classes", [(100, 10), (199, 10), (10, 1), (19, 1), (200, 20), (399, 20)])
def test_with_probabilities_from_ten_per_class_the_default_adds_tau_lr_the_clip_and_the_step_floor(budget, classes):
    """Tenth pass: probability answers from 10 per class train at tau 2, peak lr 0.05, gradients clipped at 5;
    eleventh pass: for at least 3,000 steps; the name says so; everything else is the ninth pass's default."""
    assert STUDENT_MIN_STEPS == 3000
    name, settings = resolve_preset(DEFAULT_PRESET, budget, classes, mode="probs")
    assert name == "plain+batching=equal+tau=2+lr=0.05+grad_clip=5+min_steps=3000"
    assert settings == {**SIXTH_PASS_DEFAULT, "batching": "equal", "tau": 2.0, "lr": 0.05, "grad_clip": 5.0,
                        "min_steps": 3000}
    settings["tau"] = 9.0  # a fresh dict: the next resolution is untouched
    assert resolve_preset(DEFAULT_PRESET, budget, classes, mode="probs")[1]["tau"] == 2.0


@pytest.mark.parametrize("mode", ["label", "topk", "probs", "logits"])
@pytest.mark.parametrize("budget,classes", [(200, 10), (1000, 10), (10_000, 10), (20, 1), (400, 20)])
def test_from_a_hundred_answers_per_class_the_default_also_selects_by_margin(budget, classes, mode):
    """Tenth pass: from 20 answers per class the default queries half its budget at random and the rest by the
    round substitute's smallest margins, on top of what it is for the answer kind; one answer fewer and it does not."""
    assert ACTIVE_BUDGET_PER_CLASS == 20
    name, settings = resolve_preset(DEFAULT_PRESET, budget, classes, mode=mode)
    below_name, below = resolve_preset(DEFAULT_PRESET, ACTIVE_BUDGET_PER_CLASS * classes - 1, classes, mode=mode)
    assert name == below_name + "+select=margin+active.initial=0.5"
    assert settings == {**below, "select": "margin", "active.initial": 0.5}
    assert below["select"] == "random" and "active.initial" not in below


@pytest.mark.parametrize("budget,classes", [(50, 10), (99, 10), (9, 1), (1, 1), (199, 20)])
def test_with_probabilities_below_ten_per_class_the_default_is_the_same_recipe_without_margin(budget, classes):
    """Eleventh pass: probability answers train as from 10 per class (tau 2, lr 0.05, clip 5, the step floor) at
    every budget; FixMatch is no longer the default for them."""
    assert resolve_preset(DEFAULT_PRESET, budget, classes, mode="probs") == (
        "plain+batching=equal+tau=2+lr=0.05+grad_clip=5+min_steps=3000",
        {**SIXTH_PASS_DEFAULT, "batching": "equal", "tau": 2.0, "lr": 0.05, "grad_clip": 5.0, "min_steps": 3000})


@pytest.mark.parametrize("mode", ["label", "topk", "logits"])
@pytest.mark.parametrize("budget,classes", [(50, 10), (99, 10), (9, 1), (199, 20)])
def test_below_ten_answers_per_class_the_default_is_semi_with_smoothing(budget, classes, mode):
    name, settings = resolve_preset(DEFAULT_PRESET, budget, classes, mode=mode)
    assert name == "semi+label_smoothing=0.1"
    assert settings == {**PRESETS["semi"], "label_smoothing": 0.1}
    assert "label_smoothing_min_per_class" not in settings  # smooths at every budget it applies to
    assert "batching" not in settings  # the ragged last batch, as before (equal was not adopted below 10 per class)
    assert "min_steps" not in settings  # FixMatch's epochs run over the pool (no floor below 10 per class)


@pytest.mark.parametrize("mode", ["label", "probs"])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_named_presets_keep_their_meaning_at_every_budget(name, mode):
    for budget in (10, 50, 100, 10_000):
        assert resolve_preset(name, budget, 10, mode=mode) == (name, PRESETS[name])
    assert all(key not in PRESETS[name] for key in ("tau", "lr", "grad_clip", "min_steps"))
    settings = resolve_preset(name, 50, 10, mode=mode)[1]
    settings["ssl"] = "changed"  # a fresh dict: the table itself is untouched
    assert PRESETS[name]["ssl"] != "changed"
