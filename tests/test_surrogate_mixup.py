"""MixUp of the answered images in surrogate extraction (``mixup=alpha``, Zhang et al. ICLR 2018 Sec. 2)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.mixup import mix_weight, mixup_loss
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate, make_student_loss
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class Recorder(nn.Module):
    """Returns fixed logits and keeps the batch it was given."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits, self.seen = logits, torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = x
        return self.logits


def _expected(seed: int, alpha: float, n: int) -> tuple[float, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lam = mix_weight(alpha, gen)
    return lam, torch.randperm(n, generator=gen)


def test_labels_train_on_the_mixed_smoothed_one_hot_target():
    s = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    x = torch.rand(6, 1, 2, 2, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 3, 1, 2, 0, 1])
    model = Recorder(s)
    got = mixup_loss(model, x, y, make_student_loss("auto", "label", label_smoothing=0.1), 0.4,
                     torch.Generator().manual_seed(7), mix_answers=False)
    lam, perm = _expected(7, 0.4, 6)
    assert 0.0 < lam < 1.0 and not torch.equal(perm, torch.arange(6))
    assert torch.allclose(model.seen, lam * x + (1 - lam) * x[perm])
    smooth = [0.9 * F.one_hot(t, 4).float() + 0.1 / 4 for t in (y, y[perm])]
    target = lam * smooth[0] + (1 - lam) * smooth[1]
    assert torch.allclose(got, -(target * F.log_softmax(s, 1)).sum(1).mean(), atol=1e-6)


def test_probabilities_train_on_the_mixed_probability_vectors():
    s = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    x = torch.rand(5, 1, 2, 2, generator=torch.Generator().manual_seed(1))
    p = torch.softmax(torch.randn(5, 3, generator=torch.Generator().manual_seed(2)), 1)
    loss = make_student_loss("auto", "probs")
    got = mixup_loss(Recorder(s), x, p, loss, 0.2, torch.Generator().manual_seed(3), mix_answers=True)
    lam, perm = _expected(3, 0.2, 5)
    assert torch.allclose(got, loss(s, lam * p + (1 - lam) * p[perm]), atol=1e-6)


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_mixup_spends_exactly_the_budget_and_changes_only_training(tiny_model, mode):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    runs = {}
    for alpha in (0.0, 0.2, 0.2):
        oracle = LocalOracle(tiny_model, (1, 4, 4), mode=mode, budget=37)
        config = SurrogateConfig(max_distinct=40, epochs=3, batch_size=8, seed=1, mixup=alpha)
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
        assert r.queries["predict"] == 37 == oracle.ledger.total == r.extra["n_distinct"] == r.extra["queries_spent"]
        assert r.extra["mixup"] == alpha
        runs.setdefault(alpha, []).append((torch.cat([p.flatten() for p in r.student.parameters()]),
                                           r.extra["cache_hits"]))
    (plain, hits_plain), = runs[0.0]
    (mixed, hits_mixed), (again, _) = runs[0.2]
    assert not torch.allclose(plain, mixed) and torch.equal(mixed, again)  # changes the student, seeded
    assert hits_plain == hits_mixed  # the same images looked up as often: no extra answer asked for


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_alpha_is_one_input_error(bad):
    with pytest.raises(InputError, match="mixup"):
        SurrogateConfig(mixup=bad)


def test_cli_refuses_a_bad_alpha_in_one_line_before_opening_the_victim(tmp_path, capsys):
    from stealkit.cli import main

    rc = main(["-q", "extract", "surrogate", "--victim", str(tmp_path / "no-such-victim"), "--budget", "50",
               "--set", "mixup=-1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "mixup" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()
