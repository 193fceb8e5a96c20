"""Every study in the registry holds what a newcomer looks for, in one place."""

from __future__ import annotations

import dataclasses

import pytest

from stealkit.errors import InputError
from stealkit.report.kinds import builder_name
from stealkit.studies.registry import STUDIES, execute, get


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_a_study_module_holds_its_config_run_sections_and_paper_numbers(name: str) -> None:
    study = STUDIES[name]
    assert name == study.NAME and study.KIND and study.SOURCE
    assert dataclasses.is_dataclass(study.Config) and study.Config.__dataclass_params__.frozen
    assert callable(study.run) and callable(study.sections)
    assert isinstance(study.PAPER, dict)
    assert builder_name(study.KIND) == (f"{study.__name__}:sections", True)  # the report table names it
    assert study.__doc__ and len(study.__doc__) > 80  # cites the paper section it reproduces


def test_unknown_study_and_wrong_config_are_clear_errors(tmp_path) -> None:
    with pytest.raises(InputError, match="known studies"):
        get("table-9")
    with pytest.raises(InputError, match="takes a"):
        execute("dfme-logits", object(), tmp_path / "x")


def test_table4_halves_are_disjoint_seeded_and_cover_the_test_split():
    from stealkit.studies.dfme_table4 import halves

    val, rep = halves(451, 0)
    assert len(val) == 225 and len(rep) == 226
    assert set(val.tolist()).isdisjoint(rep.tolist()) and set(val.tolist()) | set(rep.tolist()) == set(range(451))
    assert halves(451, 0)[0].tolist() == val.tolist() and halves(451, 1)[0].tolist() != val.tolist()


@pytest.mark.slow
def test_table4_cell_is_chosen_on_validation_and_scored_on_the_other_half(tmp_path):
    """Each cell's setting is the grid point best on the validation half; its accuracy is the reported half's;
    the paper's pick (best on the reported half) is kept beside it and can only be higher or equal."""
    from stealkit.studies.dfme_table4 import Table4Config, run_table4

    cfg = Table4Config(preset="cpu", victims=("digits-conv2",), columns=("own pool",), taus=(1.0, 10.0),
                       schedules=("cyclic",), max_distinct=60, epochs=2)
    out = run_table4(cfg)
    rows = out["rows"]
    cell = out["table"]["digits-conv2"]["own pool"]
    best_val = max(rows, key=lambda r: r["validation_accuracy"])
    assert (cell["tau"], cell["validation_accuracy"], cell["accuracy"]) == (
        best_val["tau"], best_val["validation_accuracy"], best_val["accuracy"])
    assert cell["best_in_hindsight"] == max(r["accuracy"] for r in rows) >= cell["accuracy"]
    victim = out["victims"]["digits-conv2"]
    assert victim["validation_images"] + victim["test_images"] == 450
