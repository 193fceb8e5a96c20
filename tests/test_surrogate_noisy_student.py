"""Noisy Student / born-again self-training on the unqueried pool (``noisy_student.*``; Xie et al. CVPR 2020 Sec. 2,
Furlanello et al. ICML 2018 Sec. 3)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.noisy_student import NoisyStudentConfig, PoolDistillLoss, teacher_targets
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.metrics import Evaluator
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class Recording(nn.Module):
    """A victim that keeps every image it is asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.model, self.seen = TinyNet().eval(), []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.clone())
        return self.model(x)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _run(mode: str, ns: NoisyStudentConfig, *, pool_size: int = 60, evaluator: Evaluator | None = None):
    pool = torch.rand(pool_size, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    victim = Recording()
    oracle = LocalOracle(victim, (1, 4, 4), mode=mode, budget=37)
    config = SurrogateConfig(max_distinct=40, epochs=3, batch_size=8, seed=1, noisy_student=ns)
    r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config, evaluator=evaluator)
    return r, oracle, torch.cat(victim.seen)


def test_teacher_targets_are_the_clean_eval_predictions_filtered_by_confidence():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Flatten(), nn.Dropout(0.9), nn.Linear(16, 3))  # dropout: noise if not in eval mode
    x = torch.rand(20, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    probs = torch.softmax(teacher.eval()(x), 1).detach()
    teacher.train()
    cut = float(probs.max(1).values.median())
    soft, keep = teacher_targets(teacher, x, NoisyStudentConfig(rounds=1, threshold=cut), batch=7)
    expected = torch.nonzero(probs.max(1).values >= cut).flatten()
    assert 0 < keep.numel() < 20 and torch.equal(keep, expected)
    assert torch.allclose(soft, probs[expected], atol=1e-6)
    hard, keep_all = teacher_targets(teacher, x, NoisyStudentConfig(rounds=1, targets="hard"))
    assert keep_all.numel() == 20 and torch.equal(hard, probs.argmax(1))


@pytest.mark.parametrize("targets", ["soft", "hard"])
def test_pool_term_is_the_teacher_target_loss_on_the_drawn_images_with_its_weight(targets):
    model = TinyNet(seed=3)
    images = torch.rand(10, 1, 4, 4, generator=torch.Generator().manual_seed(4))
    probs = torch.softmax(torch.randn(10, 3, generator=torch.Generator().manual_seed(5)), 1)
    t = probs if targets == "soft" else probs.argmax(1)
    config = NoisyStudentConfig(rounds=1, targets=targets, weight=0.5, mu=2, noise="none")

    def labelled(m, idx, target, gen):
        return torch.tensor(1.25)

    got = PoolDistillLoss(labelled, images, t, config, FixMatchConfig())(model, torch.arange(4), torch.zeros(4),
                                                                        torch.Generator().manual_seed(6))
    pick = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(6))
    out = model(images[pick])
    pool = (-(probs[pick] * F.log_softmax(out, 1)).sum(1).mean() if targets == "soft"
            else F.cross_entropy(out, probs.argmax(1)[pick]))
    assert torch.allclose(got, 1.25 + 0.5 * pool, atol=1e-6)


@pytest.mark.parametrize("noise", ["weak", "strong"])
def test_the_student_sees_the_pool_images_noised(noise):
    seen = []

    class Keep(TinyNet):
        def forward(self, x):
            seen.append(x)
            return super().forward(x)

    images = torch.rand(10, 1, 4, 4, generator=torch.Generator().manual_seed(4))
    config = NoisyStudentConfig(rounds=1, mu=1, noise=noise)
    loss = PoolDistillLoss(lambda *a: torch.tensor(0.0), images, torch.full((10, 3), 1 / 3), config, FixMatchConfig())
    loss(Keep(), torch.arange(10), torch.zeros(10), torch.Generator().manual_seed(0))
    pick = torch.randint(0, 10, (10,), generator=torch.Generator().manual_seed(0))
    assert seen[0].shape == images[pick].shape and not torch.allclose(seen[0], images[pick])


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_self_training_spends_exactly_the_budget_on_the_same_images_and_repeats(mode):
    plain, o_plain, seen_plain = _run(mode, NoisyStudentConfig())
    runs = [_run(mode, NoisyStudentConfig(rounds=r)) for r in (1, 1, 2)]
    for r, oracle, seen in [(plain, o_plain, seen_plain), *runs]:
        assert r.queries["predict"] == 37 == oracle.ledger.total == r.extra["n_distinct"] == r.extra["queries_spent"]
        assert torch.equal(seen, seen_plain)  # the victim was asked the same images, once each, in the same order
    (one, _, _), (again, _, _), (two, _, _) = runs
    assert one.extra["noisy_student"]["unqueried"] == 60 - 37 and one.extra["noisy_student"]["kept"] == [23]
    looked_up = plain.extra["cache_hits"] + 37  # lookups of one training: 3 epochs x 37 answers
    assert one.extra["cache_hits"] == 2 * looked_up - 37 and two.extra["cache_hits"] == 3 * looked_up - 37
    assert not torch.allclose(_flat(plain.student), _flat(one.student))  # the pool pass changes the student
    assert torch.equal(_flat(one.student), _flat(again.student))  # and repeats bitwise on a seed
    assert not torch.allclose(_flat(one.student), _flat(two.student))


def test_off_is_the_plain_attack_whatever_the_other_settings():
    plain, _, _ = _run("label", NoisyStudentConfig())
    off, _, _ = _run("label", NoisyStudentConfig(rounds=0, targets="hard", threshold=0.5, weight=3.0, noise="none"))
    assert torch.equal(_flat(plain.student), _flat(off.student)) and "noisy_student" not in off.extra


def test_with_the_whole_pool_answered_the_rounds_are_skipped_and_the_result_is_the_plain_student():
    x = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(9))
    ev = Evaluator(x, torch.zeros(8, dtype=torch.long), None)
    plain, _, _ = _run("label", NoisyStudentConfig(), pool_size=37, evaluator=ev)
    skipped, oracle, _ = _run("label", NoisyStudentConfig(rounds=1), pool_size=37, evaluator=ev)
    assert oracle.ledger.total == 37 and skipped.extra["noisy_student"]["skipped"] == "no unqueried image"
    assert torch.equal(_flat(plain.student), _flat(skipped.student))
    assert skipped.accuracy == plain.accuracy is not None and len(skipped.curve) == len(plain.curve) == 1


@pytest.mark.parametrize("bad", [{"rounds": -1}, {"targets": "medium"}, {"threshold": 1.0}, {"threshold": float("nan")},
                                 {"weight": -1.0}, {"weight": float("inf")}, {"mu": 0}, {"noise": "loud"}])
def test_bad_settings_are_one_input_error(bad):
    with pytest.raises(InputError, match="noisy_student"):
        NoisyStudentConfig(**bad)


def test_refused_with_ssl():
    with pytest.raises(InputError, match="noisy_student"):
        SurrogateConfig(ssl="fixmatch", noisy_student=NoisyStudentConfig(rounds=1))


def test_cli_refuses_a_bad_value_in_one_line_before_opening_the_victim(tmp_path, capsys):
    from stealkit.cli import main

    rc = main(["-q", "extract", "surrogate", "--victim", str(tmp_path / "no-such-victim"), "--budget", "50",
               "--set", "noisy_student.rounds=-1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "noisy_student" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_cli_self_trains_on_the_unqueried_pool_and_spends_exactly_the_budget(tmp_path):
    import json

    from stealkit.cli import main
    from stealkit.train import TrainConfig
    from stealkit.victims import train_victim

    victim = tmp_path / "victim"
    train_victim("digits", "mlp2", TrainConfig(epochs=2, batch_size=64, lr=0.01, seed=0), out=victim,
                 arch_kwargs={"hidden": 16})
    out = tmp_path / "run"
    rc = main(["-q", "extract", "surrogate", "--victim", str(victim), "--budget", "100", "--epochs", "1",
               "--mode", "label", "--student", "mlp2", "--student-arg", "hidden=8",
               "--set", "noisy_student.rounds=1", "--set", "noisy_student.mu=1", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["noisy_student"]["unqueried"] > 0 and summary["noisy_student"]["kept"] == [
        summary["noisy_student"]["unqueried"]]
    assert summary["queries"]["predict"] == 100 == summary["n_distinct"] == summary["queries_spent"]
