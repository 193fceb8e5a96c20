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
