"""Guarantees of the label-free student selection (issue 38, mutation testing; report: docs/mutation.md).

The exponential average is ``a <- d a + (1 - d) w`` with buffers copied; agreement is the exact top-1 agreement,
scored in eval mode and chunked without changing it; the held-out store keeps the last ``capacity`` rows or a
uniform sample of every row seen (Vitter's Algorithm R: each row kept with probability ``capacity / seen``) and
resumes drawing what the uninterrupted run draws; the selector keeps a snapshot of the best candidate, replaces it
only by one at least as good (``margin = 0``) or better by more than ``margin`` standard errors, and carries its
state through checkpoints.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.datafree.selection import ExponentialAverage, HeldOutStore, StudentSelector, agreement


class Fixed(nn.Module):
    """A classifier whose answers are given: row ``i`` of ``x`` (a 1-pixel image holding ``i``) gets ``answers[i]``."""

    def __init__(self, answers: list[int], classes: int = 3) -> None:
        super().__init__()
        self.register_buffer("answers", torch.tensor(answers))
        self.classes = classes
        self.modes: list[bool] = []
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        idx = x.flatten(1)[:, 0].round().long()
        return torch.nn.functional.one_hot(self.answers[idx], self.classes).float() + 0 * self.w


def rows_of(n: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float32).view(n, 1, 1, 1)


def onehot(labels: list[int], classes: int = 3) -> torch.Tensor:
    return torch.eye(classes)[torch.tensor(labels)]


# -- the exponential average ------------------------------------------------------------------------------


def test_exponential_average_is_exact_and_copies_buffers() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    avg = ExponentialAverage(m, 0.75)
    assert not avg.module.training and all(not p.requires_grad for p in avg.module.parameters())
    start = [p.detach().clone() for p in avg.module.parameters()]
    with torch.no_grad():
        for p in m.parameters():
            p.add_(4.0)
    m.train()
    m(torch.randn(8, 3))  # moves the running statistics
    avg.update(m)
    for a, s, w in zip(avg.module.parameters(), start, m.parameters(), strict=True):
        assert torch.allclose(a, 0.75 * s + 0.25 * w)
    for a, w in zip(avg.module.buffers(), m.buffers(), strict=True):
        assert torch.equal(a, w)
    with torch.no_grad():
        m[0].weight.add_(1.0)
    assert not torch.allclose(avg.module[0].weight, m[0].weight)  # a copy, not the module itself
    with pytest.raises(ValueError):
        avg.update(nn.Linear(3, 2))  # another architecture is refused, not averaged in part
    with pytest.raises(ValueError):
        ExponentialAverage(nn.Linear(2, 2), 0.5).update(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    with pytest.raises(ValueError):
        ExponentialAverage(nn.BatchNorm1d(2), 0.5).update(nn.LayerNorm(2))  # buffers must match too


# -- agreement ------------------------------------------------------------------------------------------


def test_agreement_is_exact_in_eval_mode_and_restores_the_mode() -> None:
    answers = [0, 1, 2, 0, 1, 2, 0]
    labels = torch.tensor([0, 1, 1, 0, 2, 2, 1])  # 4 of 7 agree
    model = Fixed(answers).train()
    x = rows_of(7)
    for batch in (1, 2, 3, 7, 1024):
        assert agreement(model, x, labels, batch=batch) == pytest.approx(4 / 7)
    assert model.training and not any(model.modes)
    model.eval()
    agreement(model, x, labels)
    assert not model.training
    assert agreement(Fixed([2]), rows_of(1), torch.tensor([2])) == 1.0
    assert agreement(Fixed([2]), rows_of(0), torch.tensor([], dtype=torch.long)) == 0.0
    wide = torch.zeros(2, 5, 1, 1)  # more channels than rows
    wide[1, 0] = 1.0
    assert agreement(Fixed([0, 1]), wide, torch.tensor([0, 0])) == 0.5


# -- the held-out store ---------------------------------------------------------------------------------


def test_store_keep_is_checked() -> None:
    with pytest.raises(InputError, match="keep must be"):
        HeldOutStore(4, (1,), 2, keep="first")  # type: ignore[arg-type]
    for keep in ("recent", "all"):
        assert HeldOutStore(4, (1,), 2, keep=keep).seen == 0  # type: ignore[arg-type]


def test_recent_store_keeps_the_last_rows_and_counts_every_row() -> None:
    store = HeldOutStore(5, (2, 1, 1), 3, keep="recent")
    for start in (0, 3, 6):
        store.add(rows_of(3, start).expand(3, 2, 1, 1), onehot([0, 1, 2]))
    assert store.seen == 9 and len(store) == 5
    assert sorted(store.x[:, 0, 0, 0].float().tolist()) == [4.0, 5.0, 6.0, 7.0, 8.0]


def test_reservoir_fills_in_order_then_counts_every_row() -> None:
    store = HeldOutStore(5, (2, 1, 1), 3, keep="all", seed=1)
    store.add(rows_of(4).expand(4, 2, 1, 1), onehot([0, 1, 2, 0]))
    assert store.seen == 4 and sorted(store.x[:4, 0, 0, 0].float().tolist()) == [0.0, 1.0, 2.0, 3.0]
    store.add(rows_of(3, 4).expand(3, 2, 1, 1), onehot([1, 2, 0]))  # one row of room, then two draws
    assert store.seen == 7 and len(store) == 5
    assert 4.0 in store.x[:, 0, 0, 0].float().tolist()  # the row that fitted was kept (before any draw)
    assert set(store.x[:, 0, 0, 0].float().tolist()) <= {float(i) for i in range(7)}
    store.add(rows_of(1, 7).expand(1, 2, 1, 1), onehot([1]))
    assert store.seen == 8 and len(store) == 5
    for r in range(5):  # each kept row keeps its answer
        assert int(store.p[r].argmax()) == [0, 1, 2, 0, 1, 2, 0, 1][int(store.x[r, 0, 0, 0])]


def _inclusion(capacity: int, batches: list[int], seeds: int) -> torch.Tensor:
    total = sum(batches)
    counts = torch.zeros(total)
    for seed in range(seeds):
        store = HeldOutStore(capacity, (1,), 2, keep="all", seed=seed)
        start = 0
        for b in batches:
            store.add(torch.arange(start, start + b, dtype=torch.float32).view(b, 1), onehot([0] * b, 2))
            start += b
        assert store.seen == total and len(store) == capacity
        kept = store.x[:capacity, 0].float().long()
        assert len(set(kept.tolist())) == capacity  # no row twice
        counts[kept] += 1
    return counts / seeds


@pytest.mark.parametrize(("capacity", "batches"), [(1, [1, 1, 1]), (2, [1, 2, 3]), (3, [2, 5, 1])])
def test_reservoir_keeps_every_row_with_equal_probability(capacity: int, batches: list[int]) -> None:
    """Algorithm R: after ``N`` rows each is kept with probability ``capacity / N``, whatever the batching."""
    freq = _inclusion(capacity, batches, seeds=1500)
    want = capacity / sum(batches)
    sd = (want * (1 - want) / 1500) ** 0.5
    assert torch.all((freq - want).abs() < 4.5 * sd), (freq, want)


def test_store_state_resumes_the_same_draws() -> None:
    a = HeldOutStore(4, (1,), 2, keep="all", seed=5)
    a.add(torch.arange(6, dtype=torch.float32).view(6, 1), onehot([0, 1, 0, 1, 0, 1], 2))
    scalars = a.scalars()
    assert scalars == {"filled": 4, "pos": 0, "seen": 6}
    b = HeldOutStore(4, (1,), 2, keep="all", seed=5)
    b.load(a.tensors(), scalars)
    assert b.seen == 6 and torch.equal(b.x, a.x) and torch.equal(b.p, a.p)
    for s in (a, b):
        s.add(torch.arange(6, 30, dtype=torch.float32).view(24, 1), onehot([1] * 24, 2))
    assert torch.equal(a.x, b.x) and a.seen == b.seen == 30
    old = HeldOutStore(4, (1,), 2, keep="all", seed=5)  # a checkpoint from before "seen" was kept
    old.load(a.tensors(), {"filled": 4, "pos": 0})
    assert old.seen == 4


# -- the selector -----------------------------------------------------------------------------------------


def selector(margin: float = 0.0, capacity: int = 100) -> StudentSelector:
    return StudentSelector(Fixed([0] * 8), capacity, (1, 1, 1), 3, "cpu", keep="recent", margin=margin)


def test_selector_starts_empty_and_scores_nothing_without_rows() -> None:
    sel = selector()
    assert sel.source == "" and sel.score == -1.0 and sel.margin == 0.0 and sel.device == "cpu"
    assert all(not p.requires_grad for p in sel.snapshot.parameters()) and not sel.snapshot.training
    assert sel.consider({"a": Fixed([1] * 8)}) == ""
    assert sel.source == "" and sel.score == -1.0
    assert torch.equal(sel.snapshot.answers, torch.zeros(8, dtype=torch.long))


def test_selector_keeps_the_best_candidate_in_its_snapshot() -> None:
    sel = selector()
    sel.add(rows_of(1), onehot([2]))  # one row is enough to choose
    assert sel.consider({"a": Fixed([1] * 8), "b": Fixed([2] * 8)}) == "b" and sel.score == 1.0
    sel = selector()
    sel.add(rows_of(4), onehot([0, 1, 1, 2]))
    a, b = Fixed([0, 1, 0, 0, 0, 0, 0, 0]), Fixed([0, 1, 1, 0, 0, 0, 0, 0])
    assert sel.consider({"a": a, "b": b}) == "b" and sel.source == "b" and sel.score == 0.75
    assert torch.equal(sel.snapshot.answers, b.answers) and sel.snapshot is not b
    worse = Fixed([2] * 8)
    assert sel.consider({"worse": worse}) == "b" and sel.score == 0.75
    assert torch.equal(sel.snapshot.answers, b.answers)
    tie = Fixed([0, 1, 0, 2, 0, 0, 0, 0])
    assert sel.consider({"tie": tie}) == "tie" and sel.score == 0.75  # margin 0: at least as good replaces
    assert torch.equal(sel.snapshot.answers, tie.answers)


def test_beats_without_and_with_a_margin() -> None:
    plain = selector()
    assert plain.beats(0.5, 0.5, 10) and not plain.beats(0.49, 0.5, 10) and plain.beats(0.0, -1.0, 10)
    one = selector(margin=1.0)
    assert one.beats(0.0, -1.0, 4)  # nothing chosen yet: any candidate
    assert not one.beats(0.75, 0.5, 4)  # 0.5 + 1 * sqrt(0.25 / 4) = 0.75 exactly: not more than one error
    assert one.beats(0.76, 0.5, 4) and not one.beats(0.74, 0.5, 4)
    assert not one.beats(0.0, 0.0, 4) and one.beats(0.01, 0.0, 4)  # a snapshot at 0 has no noise
    two = selector(margin=2.0)
    assert not two.beats(0.69, 0.5, 25) and two.beats(0.71, 0.5, 25)  # threshold 0.5 + 2 * 0.1
    assert not two.beats(0.5, 0.5, 25)


def test_selector_state_round_trip() -> None:
    sel = selector(capacity=3)
    sel.add(rows_of(5), onehot([0, 1, 2, 0, 1]))
    sel.consider({"a": Fixed([0, 1, 2, 0, 1, 0, 0, 0])})
    tensors, scalars = sel.tensors(), sel.scalars()
    assert set(tensors) == {"holdout_buffer_x", "holdout_buffer_p"}
    assert scalars == {"holdout": {"filled": 3, "pos": 0, "seen": 5}, "source": "a", "score": 1.0}
    other = selector(capacity=3)
    other.load(tensors, scalars)
    assert other.source == "a" and other.score == 1.0 and other.store.seen == 5
    assert torch.equal(other.store.x, sel.store.x) and torch.equal(other.store.p, sel.store.p)
    bare = selector(capacity=3)
    bare.load({}, {"holdout": {"filled": 0, "pos": 0}, "source": "ema"})  # no held-out tensors: store untouched
    assert bare.source == "ema" and bare.score == -1.0 and len(bare.store) == 0
    bare.load(tensors, {"source": "x"})  # no held-out scalars: store untouched
    assert len(bare.store) == 0 and bare.source == "x"
