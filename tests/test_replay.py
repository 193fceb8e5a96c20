"""The experience-replay ring buffer shared by MAZE and CoDFe's replay option."""

from __future__ import annotations

import torch

from stealkit.extract.datafree.replay import ReplayBuffer


def rows(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(start, start + n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    p = torch.nn.functional.one_hot(torch.arange(start, start + n) % 3, 3).float()
    return x, p


def test_keeps_the_newest_capacity_rows_and_drops_the_oldest() -> None:
    buf = ReplayBuffer(5, (1, 2, 2), 3)
    for start in (0, 3, 6):
        buf.add(*rows(start, 3))
    assert len(buf) == 5
    kept = sorted(int(v) for v in buf.tensors()["buffer_x"][:, 0, 0, 0])
    assert kept == [4, 5, 6, 7, 8]
    for x, p in zip(buf.tensors()["buffer_x"], buf.tensors()["buffer_p"], strict=True):
        assert int(p.argmax()) == int(x[0, 0, 0]) % 3, "inputs and targets stay paired"


def test_a_batch_larger_than_the_capacity_keeps_its_last_rows() -> None:
    buf = ReplayBuffer(4, (1, 2, 2), 3)
    buf.add(*rows(0, 10))
    assert sorted(int(v) for v in buf.tensors()["buffer_x"][:, 0, 0, 0]) == [6, 7, 8, 9]


def test_zero_capacity_stores_nothing() -> None:
    buf = ReplayBuffer(0, (1, 2, 2), 3)
    buf.add(*rows(0, 3))
    assert len(buf) == 0


def test_state_round_trip_continues_identically() -> None:
    a = ReplayBuffer(7, (1, 2, 2), 3)
    a.add(*rows(0, 5))
    b = ReplayBuffer(7, (1, 2, 2), 3)
    b.load(a.tensors(), a.scalars())
    for buf in (a, b):
        buf.add(*rows(5, 4))
    assert torch.equal(a.tensors()["buffer_x"], b.tensors()["buffer_x"])
    ga, gb = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    xa, pa = a.sample(6, ga, "cpu")
    xb, pb = b.sample(6, gb, "cpu")
    assert torch.equal(xa, xb) and torch.equal(pa, pb) and xa.dtype == torch.float32
