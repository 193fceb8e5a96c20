"""Adaptive Misinformation (Kariyappa & Qureshi 2020): the switch a(x), the misinformation network, tau's
validation share, the input hook through LocalOracle (ledger unchanged), keys files refusing it, and the audit's
serving table with its adaptive attackers and honest-user cost (tiny sizes, digits)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from stealkit.errors import BudgetExhausted, InputError
from stealkit.oracle import LocalOracle
from stealkit.serve.misinformation import (
    AdaptiveMisinformation,
    MisinformationSettings,
    fit_adaptive_misinformation,
    misinformation_loss,
    parse_am,
    pick_threshold,
)

ROOT = Path(__file__).resolve().parents[1]


class Fixed(nn.Module):
    """Logits that do not depend on the image: always class ``k`` (the misinformation network's stand-in)."""

    def __init__(self, k: int, classes: int = 4) -> None:
        super().__init__()
        self.k = k
        self.classes = classes
        self.scale = nn.Parameter(torch.tensor(20.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], self.classes)
        out[:, self.k] = self.scale
        return out


class Confidence(nn.Module):
    """Class 0 with a confidence set by the image's first pixel: bright images are confident (in distribution)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top = x[:, 0, 0, 0] * 10.0
        return torch.stack([top, torch.zeros_like(top), torch.zeros_like(top), torch.zeros_like(top)], dim=1)


def test_alpha_serves_f_in_distribution_and_f_hat_out_of_it() -> None:
    am = AdaptiveMisinformation(Fixed(3), tau=0.8, nu=1000.0)
    confident = torch.tensor([[0.97, 0.01, 0.01, 0.01]])
    unsure = torch.tensor([[0.40, 0.30, 0.20, 0.10]])
    x = torch.rand(1, 1, 2, 2)
    assert torch.allclose(am(confident, confident.log(), x=x), confident, atol=1e-6)  # ~unchanged
    served = am(unsure, unsure.log(), x=x)
    assert served.argmax(1).item() == 3 and served[0, 3] > 0.99  # the misinformation network's answer
    assert am.alpha(torch.tensor([[0.8, 0.2, 0.0, 0.0]])).item() == pytest.approx(0.5, abs=1e-4)  # the switch at tau
    assert torch.allclose(served.sum(1), torch.ones(1))


def test_misinformation_loss_is_minus_log_of_one_minus_the_true_probability() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    y = torch.tensor([0, 2])
    p = torch.softmax(logits, 1)
    expected = -torch.log(1 - p[torch.arange(2), y]).mean()
    assert misinformation_loss(logits, y).item() == pytest.approx(expected.item(), rel=1e-5)
    # stable where 1 - p_y underflows in float32
    assert torch.isfinite(misinformation_loss(torch.tensor([[200.0, 0.0]]), torch.tensor([0])))


def test_tau_keeps_the_asked_share_of_validation_inputs() -> None:
    scores = torch.rand(1000, generator=torch.Generator().manual_seed(0))
    for keep in (0.9, 0.95, 0.99):
        tau = pick_threshold(scores, keep)
        assert float((scores > tau).double().mean()) == pytest.approx(keep, abs=1e-3)


def test_specs_are_checked_and_keys_files_refuse_am() -> None:
    from stealkit.serve.defences import parse_defence
    from stealkit.serve.keys import parse_keys

    assert parse_am("am:keep=0.9").keep == 0.9 and parse_am("am").nu == 1000.0
    for bad in ("am:keep=1.5", "am:nu=0", "am:tau=0.3", "am:keep"):
        with pytest.raises(InputError):
            parse_am(bad)
    with pytest.raises(InputError, match="audit/Python-only"):
        parse_defence("am:keep=0.9")
    with pytest.raises(InputError, match="audit/Python-only"):
        parse_keys({"key": [{"key": secrets.token_urlsafe(24), "name": "a", "mode": "probs", "defences": ["am"]}]})


def test_the_hook_passes_the_images_through_local_oracle_and_the_ledger_is_unchanged() -> None:
    seen: list[torch.Tensor] = []

    class Spy(AdaptiveMisinformation):
        def __call__(self, probs: torch.Tensor, logits: torch.Tensor, *, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.clone())
            return super().__call__(probs, logits, x=x)

    model = Confidence()
    am = Spy(Fixed(3), tau=0.8)
    x = torch.zeros(6, 1, 2, 2)
    x[:3, 0, 0, 0] = 1.0  # confident: served f (class 0); the other three: served f_hat (class 3)
    plain = LocalOracle(model, (1, 2, 2), budget=6, mode="label")
    defended = LocalOracle(model, (1, 2, 2), budget=6, mode="label", defences=[am])
    assert plain.query(x).tolist() == [0] * 6
    assert defended.query(x).tolist() == [0, 0, 0, 3, 3, 3]  # the argmax changes out of distribution
    assert torch.equal(seen[0], x)
    assert defended.ledger.total == plain.ledger.total == 6
    with pytest.raises(InputError, match="needs the queried images"):
        defended.answer_from_logits(model(x))
    with pytest.raises(BudgetExhausted):  # the budget is spent: nothing answered, nothing charged
        defended.query(x[:1])
    assert defended.ledger.total == 6


@pytest.mark.slow
def test_fitted_on_digits_misinforms_and_keeps_its_validation_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from stealkit.data import load_splits
    from stealkit.victims import standard_victim

    monkeypatch.chdir(ROOT)
    victim = standard_victim("digits-conv2")
    train = load_splits("digits", seed=0).victim_train
    am = fit_adaptive_misinformation(victim.model, train.x, train.y, train.x, MisinformationSettings(keep=0.9,
                                     epochs=3), seed=0)
    with torch.no_grad():
        wrong = torch.softmax(am.misinformation(train.x), 1)
        probs = torch.softmax(victim.model(train.x), 1)
    assert float(wrong.gather(1, train.y.view(-1, 1)).mean()) < 0.05  # low probability on the true class
    assert float((am.alpha(probs) < 0.5).double().mean()) == pytest.approx(0.9, abs=0.01)
    noise = torch.rand(200, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # uniform noise scores low: most of it is misinformed
        assert float((am.alpha(torch.softmax(victim.model(noise), 1)) > 0.5).double().mean()) > 0.5
    again = fit_adaptive_misinformation(victim.model, train.x, train.y, train.x, MisinformationSettings(keep=0.9,
                                        epochs=3), seed=0)
    assert again.tau == am.tau  # seeded: the same defence


def _audit(tmp_path: Path, victim: Any, **kw: Any) -> dict[str, Any]:
    from tests.audit_kit import run_audit_command

    out = tmp_path / "audit"
    run_audit_command(victim=victim, out=str(out), answers="label,probs", budgets="20", transfer_images=0,
                      decision_images=0, datafree_budget=0, gradmatch_budgets="0", exact_budget=0, seeds=1,
                      settings={"student": "mlp2", "student.hidden": 8, "epochs": 1, "min_steps": 0},
                      dataset="digits", **kw)
    return json.loads((out / "audit.json").read_text())


@pytest.mark.slow
def test_the_audit_serves_am_to_the_adaptive_attackers_with_its_cost(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    audit = _audit(tmp_path, "standard:digits-conv2", defences=["am:keep=0.9,epochs=2"])
    ids = [p["id"] for p in audit["parts"]]
    assert "extract-probs+am_keep_0.9_epochs_2-like-20" in ids
    assert "extract-label+am_keep_0.9_epochs_2-like-20" in ids  # the label recipe on its argmax
    row = next(r for r in audit["serving"] if "through am" in r["serving"])
    assert row["attacker Q90"] is not None and row["best attacker"]
    assert 0 < row["served accuracy"] <= 1 and row["ECE"] is not None
    assert any("Adaptive misinformation (am:keep=0.9,epochs=2" in s for s in audit["sentences"])


@pytest.mark.slow
def test_an_owner_model_without_training_data_is_not_measured(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    from stealkit.oracle.victim import Target

    audit = _audit(tmp_path, Target(module, input_shape=(1, 8, 8)), defences=["am"])
    assert not any("am" in (p["part"].get("defence") or "") for p in audit["parts"])
    assert any("not measured: adaptive misinformation needs the owner's training data" in n for n in audit["notes"])
