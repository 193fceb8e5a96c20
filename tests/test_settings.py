"""``--set KEY=VALUE``: names and values checked against a config dataclass, nested configs by dotted names."""

from __future__ import annotations

import pytest

from stealkit.errors import InputError
from stealkit.evade.gradient_based.transfer import TransferConfig
from stealkit.extract.surrogate_data.baseline import BaselineConfig
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig
from stealkit.settings import apply_settings, parse_value


def _kv(*pairs: str) -> dict[str, object]:
    return {k: parse_value(v) for k, v in (p.split("=", 1) for p in pairs)}


def test_values_take_the_fields_types() -> None:
    cfg = apply_settings(SurrogateConfig(), _kv("tau=2", "schedule=step", "max_distinct=500", "knockoff.alpha=1",
                                                "knockoff.rewards=cert/div"), who="surrogate")
    assert cfg.tau == 2.0 and isinstance(cfg.tau, float) and cfg.schedule == "step" and cfg.max_distinct == 500
    assert cfg.knockoff.alpha == 1.0 and cfg.knockoff.rewards == ("cert", "div")
    assert apply_settings(cfg, _kv("max_distinct=none"), who="surrogate").max_distinct is None
    base = apply_settings(BaselineConfig(checkpoints=(10,)), _kv("checkpoints=5/10", "train.lr=0.01"), who="baseline")
    assert base.checkpoints == (5, 10) and base.train.lr == 0.01 and base.train.epochs == 30
    t = apply_settings(TransferConfig(method="pgd", eps=0.1), _kv("norm=l2", "query_batch=64"), who="pgd")
    assert t.norm.value == "l2" and t.query_batch == 64


@pytest.mark.parametrize(("pairs", "expect"), [
    (("bogus=1",), "surrogate has no setting bogus; valid settings: .*tau"),
    (("epochs=1.5",), "surrogate setting epochs takes a whole number, got 1.5"),
    (("tau=hot",), "setting tau takes a number"),
    (("schedule=linear",), "setting schedule takes one of cyclic, step, constant, got 'linear'"),
    (("batching=true",), "setting batching takes one of ragged, equal"),
    (("knockoff=1",), "knockoff is a group of settings: write knockoff.NAME=VALUE"),
    (("tau.x=1",), "no group of settings 'tau'"),
    (("knockoff.bogus=1",), "surrogate knockoff has no setting bogus"),
    (("knockoff.step_batch=x",), "surrogate knockoff setting step_batch takes a whole number"),
])
def test_wrong_names_and_values_say_what_the_setting_takes(pairs: tuple[str, ...], expect: str) -> None:
    with pytest.raises(InputError, match=expect):
        apply_settings(SurrogateConfig(), _kv(*pairs), who="surrogate")


def test_cli_set_errors_are_one_line(tmp_path, capsys) -> None:  # noqa: ANN001
    from stealkit.cli import main

    assert main(["train", "--dataset", "digits", "--set", "epoch=3", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "train has no setting epoch; valid settings:" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


def test_a_name_given_with_the_methods_prefix_gets_a_hint() -> None:
    from stealkit.settings import typed_settings

    with pytest.raises(InputError, match=r"write --set tau=\.\.\., without the 'surrogate\.' prefix"):
        typed_settings(SurrogateConfig, {"surrogate.tau": 2.0}, who="surrogate")
    with pytest.raises(InputError) as plain:
        typed_settings(SurrogateConfig, {"bogus": 1}, who="surrogate")
    assert "prefix" not in str(plain.value)
