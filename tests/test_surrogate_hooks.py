"""The hooks of ``extract_surrogate`` that stand in for removed options: ``loss_wrapper`` and ``first_round``,
each exercised by a tiny plug-in (a MixUp-like wrapper, a weight average with ``finish``, a brightest-first cold
start). Query accounting is the ledger's whatever the plug-in does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.surrogate_data.surrogate import BatchLoss, SurrogateConfig, extract_surrogate
from stealkit.oracle import LocalOracle
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class Seen(nn.Module):
    """The victim, keeping every image it was really asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.asked = TinyNet(seed=3), []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.asked.append(x.clone())
        return self.net(x)


POOL = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))


def _run(mode: str = "probs", budget: int = 24, **kwargs: object) -> tuple[object, Seen, LocalOracle]:
    victim = Seen().eval()
    oracle = LocalOracle(victim, (1, 4, 4), mode=mode, budget=budget)
    victim.asked.clear()  # the oracle may probe the model once when built
    config = kwargs.pop("config", SurrogateConfig(epochs=3, batch_size=8, seed=1))
    r = extract_surrogate(oracle, POOL, make_student=lambda: TinyNet(seed=5), config=config,  # type: ignore[arg-type]
                          **kwargs)  # type: ignore[arg-type]
    return r, victim, oracle


def _weights(r: object) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in r.student.parameters()])  # type: ignore[attr-defined]


def _asked(victim: Seen) -> list[int]:
    """The pool indices of the images the victim was asked about, in order."""
    images = torch.cat(victim.asked).flatten(1)
    return torch.cdist(images, POOL.flatten(1)).argmin(dim=1).tolist()


def mix_pairs(inner: BatchLoss) -> BatchLoss:
    """A MixUp-like plug-in (Zhang et al. ICLR 2018 Sec. 2, at a fixed lambda 0.7): each answered batch is mixed
    with itself reversed, the loss weighted between both answers."""
    def loss(model: nn.Module, x: torch.Tensor, answers: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        mixed = 0.7 * x + 0.3 * x.flip(0)
        return 0.7 * inner(model, mixed, answers, gen) + 0.3 * inner(model, mixed, answers.flip(0), gen)
    return loss


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_an_identity_wrapper_is_bitwise_no_wrapper(mode):
    plain, _, _ = _run(mode)
    same, _, _ = _run(mode, loss_wrapper=lambda inner: inner)
    assert torch.equal(_weights(plain), _weights(same))
    assert same.extra["hooks"] == ["loss_wrapper"] and plain.extra["hooks"] == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["label", "probs"])
def test_a_mixup_plug_in_changes_the_student_not_the_queries(mode):
    plain, seen_plain, _ = _run(mode)
    mixed, seen_mixed, oracle = _run(mode, loss_wrapper=mix_pairs)
    assert not torch.allclose(_weights(plain), _weights(mixed))
    assert _asked(seen_plain) == _asked(seen_mixed)  # the same images asked once each, in the same order
    assert mixed.queries["predict"] == 24 == oracle.ledger.total == len(_asked(seen_mixed))  # type: ignore[attr-defined]


class Average:
    """A weight-average plug-in (Polyak averaging, the removed ``ema`` at decay 0.5): it passes the loss through,
    averages the weights seen at each step and copies the average into the student in ``finish``."""

    made: list[Average] = []

    def __init__(self, inner: BatchLoss) -> None:
        self.inner, self.avg, self.finished = inner, None, 0
        Average.made.append(self)

    def __call__(self, model: nn.Module, x: torch.Tensor, answers: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        with torch.no_grad():
            now = [p.detach().clone() for p in model.parameters()]
            self.avg = now if self.avg is None else [0.5 * a + 0.5 * w for a, w in zip(self.avg, now, strict=True)]
        return self.inner(model, x, answers, gen)

    def finish(self, model: nn.Module) -> None:
        self.finished += 1
        with torch.no_grad():
            for p, a in zip(model.parameters(), self.avg, strict=True):
                p.copy_(a)


def test_a_wrapper_with_finish_makes_the_result_and_reaches_every_training():
    Average.made.clear()
    from stealkit.extract.surrogate_data.active import ActiveConfig

    config = SurrogateConfig(epochs=2, batch_size=8, seed=1, select="margin",
                             active=ActiveConfig(rounds=2, round_epochs=1))
    r, _, oracle = _run(config=config, loss_wrapper=Average)
    assert len(Average.made) == 3  # two round substitutes and the student: each training wraps its own loss
    assert all(a.finished == 1 for a in Average.made)
    final = Average.made[-1]
    assert all(torch.equal(p, a) for p, a in zip(r.student.parameters(), final.avg, strict=True))  # type: ignore[attr-defined]
    assert r.queries["predict"] == 24 == oracle.ledger.total == r.extra["n_distinct"]  # type: ignore[attr-defined]


def brightest(pool: torch.Tensor, m: int) -> torch.Tensor:
    """A cold-start plug-in: the ``m`` brightest images of the pool, brightest first."""
    return pool.flatten(1).sum(1).argsort(descending=True)[:m]


def test_first_round_chooses_the_queries_of_a_random_run():
    r, victim, oracle = _run(first_round=brightest)
    want = POOL.flatten(1).sum(1).argsort(descending=True)[:24]
    assert sorted(_asked(victim)) == sorted(want.tolist())
    assert r.queries["predict"] == 24 == oracle.ledger.total == r.extra["n_distinct"]  # type: ignore[attr-defined]
    assert r.extra["active"]["sizes"] == [24]  # type: ignore[attr-defined]  # one round: the whole budget


def test_first_round_chooses_the_seed_set_of_active_rounds():
    from stealkit.extract.surrogate_data.active import ActiveConfig

    config = SurrogateConfig(epochs=1, batch_size=8, seed=1, select="margin",
                             active=ActiveConfig(initial=0.5, rounds=2, round_epochs=1))
    r, victim, oracle = _run(config=config, first_round=brightest)
    sizes = r.extra["active"]["sizes"]  # type: ignore[attr-defined]
    assert sizes == [12, 6, 6]
    want = POOL.flatten(1).sum(1).argsort(descending=True)[:12]
    assert sorted(_asked(victim)[:12]) == sorted(want.tolist())  # the first round is the plug-in's
    assert r.queries["predict"] == 24 == oracle.ledger.total == len(set(_asked(victim)))  # type: ignore[attr-defined]


def test_a_bad_first_round_or_one_with_knockoff_is_refused():
    with pytest.raises(InputError, match="distinct indices"):
        _run(first_round=lambda pool, m: torch.zeros(m, dtype=torch.long))
    with pytest.raises(InputError, match="distinct indices"):
        _run(first_round=lambda pool, m: torch.arange(m - 1))
    with pytest.raises(InputError, match="knockoff"):
        _run(config=SurrogateConfig(epochs=1, batch_size=8, strategy="knockoff"), first_round=brightest)
