"""The presets of ``stealkit extract surrogate`` and the budget rule of the default (seventh pass)."""

from __future__ import annotations

import pytest

from stealkit.extract.surrogate_presets import DEFAULT_PRESET, PRESETS, SMALL_BUDGET_PER_CLASS, resolve_preset

SIXTH_PASS_DEFAULT = {"select": "random", "ssl": "none", "pretrain": "none", "cold_start": "random",
                      "label_smoothing": 0.1, "label_smoothing_min_per_class": 10}


def test_from_ten_answers_per_class_the_default_is_the_sixth_pass_one_with_equal_batches():
    """Fashion-MNIST at 100 queries (10 per class) and above resolve to the sixth pass's default with equal-sized
    batches (ninth pass); ``plain`` itself, and so ``--set batching=ragged`` on the default, is the old one."""
    assert DEFAULT_PRESET == "auto" and SMALL_BUDGET_PER_CLASS == 10
    for budget in (100, 1000, 10_000):
        assert resolve_preset(DEFAULT_PRESET, budget, 10) == ("plain+batching=equal",
                                                              {**SIXTH_PASS_DEFAULT, "batching": "equal"})
    assert PRESETS["plain"] == SIXTH_PASS_DEFAULT and all("batching" not in p for p in PRESETS.values())


@pytest.mark.parametrize("budget,classes", [(50, 10), (99, 10), (9, 1), (199, 20)])
def test_below_ten_answers_per_class_the_default_is_semi_with_smoothing(budget, classes):
    name, settings = resolve_preset(DEFAULT_PRESET, budget, classes)
    assert name == "semi+label_smoothing=0.1"
    assert settings == {**PRESETS["semi"], "label_smoothing": 0.1}
    assert "label_smoothing_min_per_class" not in settings  # smooths at every budget it applies to
    assert "batching" not in settings  # the ragged last batch, as before (equal was not adopted below 10 per class)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_named_presets_keep_their_meaning_at_every_budget(name):
    for budget in (10, 50, 100, 10_000):
        assert resolve_preset(name, budget, 10) == (name, PRESETS[name])
    settings = resolve_preset(name, 50, 10)[1]
    settings["ssl"] = "changed"  # a fresh dict: the table itself is untouched
    assert PRESETS[name]["ssl"] != "changed"
