"""The selection step's faster scoring forward and k-center update (always on) choose exactly what the plain path does."""

from __future__ import annotations

import pytest
import torch

from stealkit.extract.surrogate_data.active import (
    distances_to_row,
    kcenter_greedy,
    max_2x2,
    probs_and_features,
    select_batch,
    strided_max_pooling,
)
from stealkit.models.zoo import conv2


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _student(seed: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    return conv2((1, 28, 28), 10, c1=8, c2=16, hidden=32)


def _images(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # smooth blobs rather than white noise, so the student's features spread like an image pool's
    return torch.nn.functional.interpolate(torch.rand(n, 1, 7, 7, generator=g), size=28, mode="bilinear")


def test_strided_max_pooling_scores_bitwise_alike_and_is_undone():
    model, x = _student(), _images(150)
    plain = probs_and_features(model, x, batch=64)
    fast = probs_and_features(model, x, batch=64, fast=True)
    assert torch.equal(plain[0], fast[0]) and torch.equal(plain[1], fast[1])
    pools = [m for m in model.modules() if isinstance(m, torch.nn.MaxPool2d)]
    assert len(pools) == 2 and all("forward" not in vars(m) for m in pools)
    other = torch.nn.Sequential(torch.nn.MaxPool2d(3), torch.nn.MaxPool2d(2, ceil_mode=True), torch.nn.MaxPool2d(2))
    with strided_max_pooling(other) as swapped:
        assert swapped == 1 and "forward" in vars(other[2]) and "forward" not in vars(other[0])
    assert all("forward" not in vars(m) for m in other)


@pytest.mark.parametrize("shape", [(3, 5, 28, 28), (2, 4, 7, 9), (4, 6, 6)])
def test_max_2x2_is_max_pool2d(shape):
    y = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    y.view(-1)[0] = float("nan")
    ref = torch.nn.functional.max_pool2d(y, 2)
    assert torch.equal(max_2x2(y).isnan(), ref.isnan()) and ref.isnan().any()
    assert torch.equal(max_2x2(y).nan_to_num(), ref.nan_to_num())


@pytest.mark.parametrize("n,d", [(10, 3), (25, 4), (26, 4), (600, 32)])
def test_distances_to_row_are_bitwise_cdist(n, d):
    feats = torch.randn(n, d, generator=torch.Generator().manual_seed(n)) * 3
    dist = distances_to_row(feats)
    for j in range(0, n, max(1, n // 17)):
        assert torch.equal(dist(j), torch.cdist(feats, feats[j : j + 1]).flatten())


@pytest.mark.parametrize("n_centres", [0, 40])
def test_kcenter_picks_are_the_same(n_centres):
    g = torch.Generator().manual_seed(7)
    feats, centres = torch.randn(700, 24, generator=g), torch.randn(n_centres, 24, generator=g)
    plain = kcenter_greedy(feats, centres, 150)
    assert torch.equal(plain, kcenter_greedy(feats, centres, 150, fast=True))
    assert plain.unique().numel() == 150


@pytest.mark.parametrize("strategy", ["kcenter", "entropy", "margin"])
def test_selections_on_a_fixed_seed_are_the_same(strategy):
    model, x = _student(), _images(400, seed=1)
    answered, candidates = torch.arange(60), torch.arange(60, 400)
    picks = []
    for fast in (False, True):
        probs, feats = probs_and_features(model, x, batch=128, fast=fast)
        picks.append(select_batch(strategy, 50, candidates, probs, feats, answered,
                                  gen=torch.Generator().manual_seed(0), fast=fast))
    assert torch.equal(picks[0], picks[1]) and picks[0].unique().numel() == 50
