"""The Python API (:mod:`stealkit.api`) resolves every default as the CLI does, and README's example runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from stealkit.api import steal
from stealkit.cli import main
from stealkit.errors import InputError
from tests import test_surrogate_cli

README = Path(__file__).resolve().parents[1] / "README.md"


victim_dir = test_surrogate_cli.victim_dir  # module-scoped fixture: a digits mlp2 victim (hidden 32)


@pytest.mark.parametrize("mode", [pytest.param("probs", marks=pytest.mark.slow), "label"])  # probs: 3,000 steps
def test_api_and_cli_resolve_the_same_defaults_and_spend_the_same_ledger(victim_dir, tmp_path, mode):
    """Only the size is given; every other option is each side's default: the runs must agree."""
    run = steal(victim_dir, budget=30, mode=mode, epochs=1, student="mlp2", student_args={"hidden": 8},
                         out=tmp_path / "api")
    assert main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--budget", "30", "--mode", mode,
                 "--epochs", "1", "--student", "mlp2", "--student-arg", "hidden=8", "--out",
                 str(tmp_path / "cli")]) == 0
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())["config"]
    assert run.config["preset_resolved"] == cli["preset_resolved"]
    assert run.config["surrogate"] == cli["surrogate"]
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert run.queries == summary["queries"] == {"predict": 30, "explain": 0}
    assert run.accuracy == summary["accuracy"] and isinstance(run.student, torch.nn.Module)


def test_a_module_victim_is_stolen_through_its_ledger(victim_dir, tmp_path):
    from stealkit.models import load_model

    module = load_model(victim_dir)[0]
    run = steal(module, input_shape=(1, 8, 8), dataset="digits", budget=40, mode="label", epochs=1,
                         student="mlp2", out=tmp_path / "r")
    assert run.queries == {"predict": 40, "explain": 0} and run.report.exists()
    assert run.config["surrogate"]["epochs"] == 1


def test_api_errors_are_the_cli_errors(tmp_path):
    with pytest.raises(InputError, match="positive integer"):
        steal("standard:digits-conv2", budget=0)
    with pytest.raises(InputError, match="input_shape"):
        steal(torch.nn.Linear(64, 10), budget=10)


@pytest.mark.slow
def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    """README's "Python API" example, at a tiny budget (the same lines, the size shrunk)."""
    text = README.read_text().split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "steal(" in code and len([x for x in code.splitlines() if x.strip()]) <= 5
    code = code.replace("budget=1000", "budget=60, epochs=1, student='mlp2'")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.match(r"accuracy 0\.\d{3}, fidelity 0\.\d{3}, queries 60 predict / 0 explain; report: \S+report\.html", out)


class _ThroughNumpy(torch.nn.Module):
    """A victim whose forward leaves torch (as a wrapped foreign model's may): no trace could follow it."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import numpy as np

        return torch.from_numpy(np.asarray(self.inner(x).detach().numpy()))


def test_a_module_whose_forward_goes_through_numpy_is_stolen_as_its_torch_twin(victim_dir, tmp_path):
    """The module is called as it is (no trace, no file): the numpy detour and its pure-torch twin give the same
    ledger and the same figures at the same seed."""
    from stealkit.models import load_model

    inner = load_model(victim_dir)[0]
    runs = [steal(m, input_shape=(1, 8, 8), dataset="digits", budget=40, mode="label", epochs=1, student="mlp2",
                  student_args={"hidden": 8}, seed=3, out=tmp_path / name)
            for name, m in (("numpy", _ThroughNumpy(inner)), ("torch", inner))]
    assert runs[0].queries == runs[1].queries == {"predict": 40, "explain": 0}
    assert (runs[0].accuracy, runs[0].fidelity) == (runs[1].accuracy, runs[1].fidelity)
    assert runs[0].accuracy is not None and runs[0].config["victim"] == "<module _ThroughNumpy>"


def test_an_unknown_keyword_is_one_line_naming_the_known_ones():
    with pytest.raises(InputError, match="unknown keyword 'epoch'.*epochs"):
        steal("standard:digits-conv2", budget=10, epoch=1)


def test_audit_from_python_takes_a_module_victim_and_gives_the_figures(tmp_path):
    """``stealkit.api.audit``: the audit's defaults, an nn.Module victim called as it is, the figures and the gate."""
    from stealkit.api import audit
    from stealkit.victims import standard_victim

    module = standard_victim("digits-conv2").model
    result = audit(module, input_shape=(1, 8, 8), dataset="digits", out=tmp_path / "a", answers="label",
                   budgets=(20,), settings={"student": "mlp2", "epochs": 1, "min_steps": 0}, transfer_images=0,
                   decision_images=0, datafree_budget=0, gradmatch=(), exact_budget=0, seeds=1, defences=["none"],
                   fail_if=["q90<10"])
    assert result.summary["queries"] == 40 and result.report.exists()
    assert [g.status for g in result.gates] == ["pass"] and result.exit_code == 0
    assert result.summary["headline"][0]["fidelity @20"] is not None
    with pytest.raises(InputError, match="no option"):
        audit(module, input_shape=(1, 8, 8), budget=10)
