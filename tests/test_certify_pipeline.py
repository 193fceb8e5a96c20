"""Training methods, evaluation helpers, the soundness check, the study's bound lattice and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from stealkit.certify.evaluate import (
    certified_accuracy,
    empirical_robust_accuracy,
    soundness_check,
    summarize,
)
from stealkit.certify.smoothing import SmoothingConfig, certify
from stealkit.certify.training import METHODS, RobustTrainConfig, stability_loss, train_robust
from stealkit.errors import InputError
from stealkit.studies.stn_certify import bound_lattice
from stealkit.train import TrainConfig
from tests.test_certify_smoothing import Halfspace, images


def _blobs(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (n,), generator=g)
    x = (0.3 + 0.4 * y.float()).view(-1, 1, 1, 1) + 0.05 * torch.randn(n, 1, 4, 4, generator=g)
    return x.clamp(0, 1), y


@pytest.mark.parametrize("method", METHODS)
def test_every_training_method_learns_a_separable_task(method: str) -> None:
    x, y = _blobs()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    cfg = RobustTrainConfig(method=method, sigma=0.1, eps=0.05, step=0.02, steps=2,  # type: ignore[arg-type]
                            train=TrainConfig(epochs=15, batch_size=16, lr=0.05, schedule="none"))
    hist = train_robust(model, x, y, cfg)
    assert len(hist) == 15 and hist[-1]["loss"] < hist[0]["loss"]
    assert (model(x).argmax(1) == y).float().mean() > 0.9


def test_stability_loss_is_cross_entropy_of_softmaxes() -> None:
    a = torch.tensor([[2.0, 0.0]])
    assert stability_loss(a, a) == pytest.approx(float(-(a.softmax(1) * a.log_softmax(1)).sum()))
    assert stability_loss(a, torch.tensor([[0.0, 2.0]])) > stability_loss(a, a)


def test_training_config_validation() -> None:
    with pytest.raises(InputError):
        RobustTrainConfig(method="mixup")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        RobustTrainConfig(method="stability", sigma=0.0)


def test_summary_and_soundness_on_a_halfspace() -> None:
    model = Halfspace().eval()
    x = images([0.6, 0.75, 0.9, 0.3])
    y = torch.tensor([1, 1, 1, 0])
    certs = certify(model, x, SmoothingConfig(sigma=0.25, n0=50, n=1000))
    acc = certified_accuracy(certs, y, "cohen", [0.0, 0.1, 10.0])
    assert acc[0] >= acc[1] >= acc[2] == 0.0
    s = summarize(certs, y, [0.0, 0.25], ["cohen", "renyi"])
    assert s["num_images"] == 4 and set(s["certified_accuracy"]) == {"cohen", "renyi"}
    rows = soundness_check(model, x, certs, eot_samples=4, steps=10, n_predict=500, alpha=0.001)
    assert rows and not any(r["violation"] for r in rows)
    assert all(r["attack_norm"] <= r["radius"] + 1e-5 for r in rows)


def test_empirical_accuracy_decreases_with_eps() -> None:
    model = Halfspace().eval()
    x = images([0.6, 0.75, 0.9, 0.3, 0.2])
    y = torch.tensor([1, 1, 1, 0, 0])
    rows = empirical_robust_accuracy(model, x, y, sigma=0.25, attack="pgd-l2", eps=[0.0, 0.3, 2.0],
                                     eot_samples=2, n_predict=200, steps=10)
    accs = [r["accuracy"] for r in rows]
    assert accs[0] == 1.0 and accs[-1] == 0.0 and accs[0] >= accs[1] >= accs[2]


def test_bound_lattice_facts() -> None:
    lat = bound_lattice(0.05)
    assert lat["renyi_ge_reference_everywhere"] and lat["renyi_gt_pixeldp_in_region"]
    assert lat["cohen2_ge_renyi_everywhere"] and lat["cohen1_ge_renyi_when_two_class"]


@pytest.mark.slow
def test_cli_train_robust_then_certify(tmp_path: Path) -> None:
    from stealkit.cli import main

    model_dir = tmp_path / "m"
    assert main(["-q", "train-robust", "--dataset", "digits", "--arch", "logistic", "--method", "stability",
                 "--sigma", "0.25", "--epochs", "2", "--out", str(model_dir)]) == 0
    out = tmp_path / "c"
    assert main(["-q", "certify", "--model", str(model_dir), "--sigma", "0.25", "--n0", "10", "--n", "50",
                 "--num", "4", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 4 and set(recs[0]["radius"]) == {"cohen", "renyi", "pixeldp"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 50 and "certified_accuracy" in summary
    assert (out / "report.html").exists()
    assert main(["-q", "certify", "--model", str(model_dir), "--sigma", "0", "--out", str(tmp_path / "x")]) == 2
