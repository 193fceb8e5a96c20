"""Equal-sized batches (``batching=equal``) against the ragged last batch (``ragged``, the loop as it was)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import stealkit.train as train_mod
from stealkit.errors import InputError
from stealkit.extract.surrogate_data.active import ActiveConfig
from stealkit.extract.surrogate_data.semi_supervised import FixMatchConfig
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.oracle import LocalOracle
from stealkit.train import TrainConfig, epoch_batches, fit, make_optimizer, make_scheduler
from tests.conftest import TinyNet


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize("n,b", [(200, 64), (100, 64), (1000, 64), (70, 64), (64, 64), (10000, 64), (8000, 64),
                                 (5, 8), (1, 3)])
def test_equal_batches_differ_by_at_most_one_and_use_every_index_once(n, b):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    equal, ragged = epoch_batches(perm, b, "equal"), epoch_batches(perm, b, "ragged")
    sizes = [t.numel() for t in equal]
    assert len(equal) == len(ragged) == math.ceil(n / b)  # the same steps per epoch
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= b and sizes == sorted(sizes, reverse=True)
    assert torch.equal(torch.cat(equal), perm) and torch.equal(torch.cat(ragged), perm)
    assert [t.numel() for t in ragged] == [b] * (n // b) + ([n % b] if n % b else [])
    if n % b == 0:  # no small last batch: equal is ragged, batch for batch
        assert all(torch.equal(e, r) for e, r in zip(equal, ragged, strict=True))
    if (n, b) == (200, 64):
        assert sizes == [50] * 4
    if (n, b) == (1000, 64):
        assert sizes == [63] * 8 + [62] * 8


def _old_fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TrainConfig) -> None:
    """The loop of ``fit`` before the option (ragged slices of the permutation), written out here."""
    gen = torch.Generator().manual_seed(config.seed)
    model.train()
    opt = make_optimizer(model.parameters(), config)
    n = x.shape[0]
    sched = make_scheduler(opt, config.schedule, math.ceil(n / config.batch_size) * config.epochs)
    for _ in range(config.epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, config.batch_size):
            idx = perm[i : i + config.batch_size]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            assert sched is not None
            sched.step()


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_ragged_is_the_old_loop_bitwise_and_equal_sees_each_image_once_per_epoch():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(45, 1, 4, 4, generator=gen), torch.randint(0, 3, (45,), generator=gen)
    config = TrainConfig(epochs=3, batch_size=16, optimizer="sgd", schedule="onecycle", seed=4)
    assert config.batching == "ragged"
    ref, got = TinyNet(seed=2), TinyNet(seed=2)
    _old_fit(ref, x, y, config)
    hist_ragged = fit(got, x, y, config)
    assert torch.equal(_params(ref), _params(got))

    seen: list[torch.Tensor] = []

    def spy(model: nn.Module, xb: torch.Tensor, ib: torch.Tensor, _: torch.Generator) -> torch.Tensor:
        seen.append(ib.clone())  # the targets passed are the images' indices
        return nn.functional.cross_entropy(model(xb), y[ib])

    ids = torch.arange(45)
    eq = TinyNet(seed=2)
    hist_equal = fit(eq, x, ids, TrainConfig(**{**config.to_dict(), "batching": "equal"}), batch_loss=spy)
    assert [t.numel() for t in seen] == [15, 15, 15] * 3  # 45 at 16: three batches of 15, not 16 + 16 + 13
    for e in range(3):
        assert torch.equal(torch.sort(torch.cat(seen[3 * e : 3 * e + 3])).values, ids)
    # the same steps, so the same learning-rate schedule; a different student
    assert [h["lr"] for h in hist_equal] == [h["lr"] for h in hist_ragged]
    assert not torch.allclose(_params(eq), _params(got))


def test_bad_batching_is_one_input_error():
    with pytest.raises(InputError, match="unknown batching 'even'"):
        SurrogateConfig(batching="even")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="unknown batching"):
        TrainConfig(batching="Equal")  # type: ignore[arg-type]


class _Recorder:
    """Wraps ``epoch_batches`` to record the batching and the batch sizes of every epoch cut."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.inner = train_mod.epoch_batches

    def __call__(self, perm: torch.Tensor, batch_size: int, batching: str = "ragged") -> list[torch.Tensor]:
        out = self.inner(perm, batch_size, batching)  # type: ignore[arg-type]
        self.calls.append((batching, [t.numel() for t in out]))
        return out


class _OrderOracle(LocalOracle):
    """Remembers the images it was asked, in order."""

    asked: list[torch.Tensor]

    def query(self, x: torch.Tensor, **kw):  # type: ignore[no-untyped-def]
        self.asked = [*getattr(self, "asked", []), x.clone()]
        return super().query(x, **kw)


SETTINGS = [
    {},  # the plain student
    {"select": "entropy", "active": ActiveConfig(rounds=2, round_epochs=2)},  # round substitutes
    {"ssl": "fixmatch", "fixmatch": FixMatchConfig(mu=1)},  # the labelled side of FixMatch
]


@pytest.mark.parametrize("mode", ["label", "probs"])
@pytest.mark.parametrize("settings", SETTINGS, ids=["plain", "active", "fixmatch"])
def test_equal_batching_reaches_every_training_and_spends_exactly_the_budget(tiny_model, monkeypatch, mode,
                                                                              settings):
    pool = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    students, asked = [], []
    for batching in ("ragged", "equal"):
        rec = _Recorder()
        monkeypatch.setattr(train_mod, "epoch_batches", rec)
        oracle = _OrderOracle(tiny_model, (1, 4, 4), mode=mode, budget=37)
        config = SurrogateConfig(max_distinct=40, epochs=3, batch_size=8, seed=1, batching=batching,  # type: ignore[arg-type]
                                 **settings)
        r = extract_surrogate(oracle, pool, make_student=lambda: TinyNet(seed=5), config=config)
        assert r.queries["predict"] == 37 == oracle.ledger.total == r.extra["n_distinct"] == r.extra["queries_spent"]
        assert r.extra["batching"] == batching
        assert rec.calls and all(b == batching for b, _ in rec.calls)  # every training cut its epochs this way
        for _, sizes in rec.calls:
            if batching == "equal":
                assert max(sizes) - min(sizes) <= 1 and max(sizes) <= 8
            else:
                assert all(s == 8 for s in sizes[:-1])
        if batching == "equal":  # 37 answers at batch 8: five batches of 8 or 7, never 8 x 4 + 5; FixMatch's
            # epoch cycles them to the pool's 60 (mu 1): eight batches of 8 or 7, never 8 x 7 + 4
            want = [8, 8, 8, 8, 7, 7, 7, 7] if "ssl" in settings else [8, 8, 7, 7, 7]
            assert any(cut == want for _, cut in rec.calls)
        students.append(torch.cat([p.detach().flatten() for p in r.student.parameters()]))
        images = torch.cat(oracle.asked).flatten(1)
        which = torch.cdist(images, pool.flatten(1)).argmin(dim=1)  # each asked image's place in the pool
        assert which.unique().numel() == 37  # each image asked once
        asked.append(torch.sort(which).values)
    if "select" not in settings:  # random queries: the same 37 images (active rounds choose by the student)
        assert torch.equal(asked[0], asked[1])
    assert not torch.allclose(students[0], students[1])


def test_cli_refuses_a_bad_batching_in_one_line_before_the_victim_is_opened(tmp_path, capsys):
    from stealkit.cli import main

    out = tmp_path / "run"
    (tmp_path / "absent").mkdir(exist_ok=True)  # exists, not a model: the options are checked first
    rc = main(["-q", "extract", "surrogate", "--victim", str(tmp_path / "absent"), "--budget", "10",
               "--set", "batching=even", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "batching" in err and "ragged, equal" in err and "absent" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
