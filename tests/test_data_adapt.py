"""Dataset adaptation: resizing, channel conversion, class skew and long-tail imbalance."""

from __future__ import annotations

import pytest
import torch

from stealkit.data import Dataset, adapt_dataset, adapt_images, imbalance, keep_classes, resize, to_channels
from stealkit.data.adapt import imbalance_counts
from stealkit.errors import InputError


def _ds(per_class: list[int], shape: tuple[int, int, int] = (1, 4, 4)) -> Dataset:
    y = torch.cat([torch.full((n,), k, dtype=torch.int64) for k, n in enumerate(per_class)])
    x = torch.rand((len(y), *shape), generator=torch.Generator().manual_seed(0))
    return Dataset(x, y, tuple(str(k) for k in range(len(per_class))), "toy")


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ((1, 8, 8), (3, 28, 28)),
        ((3, 32, 32), (1, 28, 28)),
        ((1, 28, 28), (1, 8, 8)),
        ((3, 32, 32), (3, 64, 48)),
        ((3, 10, 10), (3, 10, 10)),
    ],
)
def test_adapt_images_shapes_and_range(src, dst) -> None:
    x = torch.rand((5, *src), generator=torch.Generator().manual_seed(1))
    out = adapt_images(x, dst)
    assert out.shape == (5, *dst) and out.dtype == torch.float32
    assert out.min() >= 0 and out.max() <= 1


def test_resize_clamps_bilinear_overshoot_and_keeps_constants() -> None:
    checker = (torch.arange(64).reshape(8, 8) % 2 == torch.arange(8)[:, None] % 2).float()[None, None]
    for size in (3, 17, (5, 11)):
        out = resize(checker, size)
        assert out.min() >= 0 and out.max() <= 1
    flat = torch.full((2, 3, 9, 9), 0.3)
    assert torch.allclose(resize(flat, 4), torch.full((2, 3, 4, 4), 0.3))
    assert torch.allclose(resize(flat, 20), torch.full((2, 3, 20, 20), 0.3))


def test_resize_downsampling_is_antialiased() -> None:
    """A 1-pixel checkerboard shrunk 4x averages to mid-gray instead of aliasing to black/white."""
    checker = ((torch.arange(32)[:, None] + torch.arange(32)[None]) % 2).float()[None, None]
    out = resize(checker, 8)
    assert torch.allclose(out, torch.full_like(out, 0.5), atol=0.05)


def test_resize_round_trip_of_smooth_image() -> None:
    ramp = torch.linspace(0, 1, 16)[None, None, None].expand(1, 1, 16, 16)
    back = resize(resize(ramp, 32), 16)
    assert back.shape == ramp.shape and (back - ramp).abs().max() < 0.05


def test_resize_same_size_and_empty() -> None:
    x = torch.rand(2, 1, 5, 5)
    assert resize(x, 5) is x
    assert resize(torch.zeros(0, 3, 8, 8), 4).shape == (0, 3, 4, 4)


def test_to_channels_round_trip_is_identity() -> None:
    gray = torch.rand((4, 1, 7, 7), generator=torch.Generator().manual_seed(2))
    rgb = to_channels(gray, 3)
    assert rgb.shape == (4, 3, 7, 7) and torch.equal(rgb[:, 0], rgb[:, 2])
    assert torch.equal(to_channels(rgb, 1), gray)
    assert torch.equal(adapt_images(adapt_images(gray, (3, 7, 7)), (1, 7, 7)), gray)


def test_rgb_to_gray_averages() -> None:
    x = torch.zeros(1, 3, 2, 2)
    x[:, 0], x[:, 1], x[:, 2] = 0.3, 0.6, 0.9
    assert torch.allclose(to_channels(x, 1), torch.full((1, 1, 2, 2), 0.6))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: to_channels(torch.rand(1, 3, 2, 2), 4), "3-channel images to 4"),
        (lambda: to_channels(torch.rand(1, 3, 2, 2), 0), "positive"),
        (lambda: resize(torch.rand(3, 4, 4), 2), "unsqueeze"),
        (lambda: resize(torch.zeros(1, 1, 4, 4, dtype=torch.uint8), 2), "255"),
        (lambda: resize(torch.rand(1, 1, 4, 4), (2, 0)), "size"),
        (lambda: adapt_images(torch.rand(1, 1, 4, 4), (28, 28)), "\\(C, H, W\\)"),
    ],
)
def test_adapt_errors(call, message: str) -> None:
    with pytest.raises(InputError, match=message):
        call()


def test_adapt_dataset_keeps_labels() -> None:
    ds = _ds([3, 2])
    out = adapt_dataset(ds, (3, 9, 9))
    assert out.input_shape == (3, 9, 9) and torch.equal(out.y, ds.y) and out.classes == ds.classes
    assert adapt_dataset(ds, (1, 4, 4)) is ds


def test_keep_classes_counts_and_labels() -> None:
    ds = _ds([3, 4, 5, 6, 7, 8])
    out = keep_classes(ds, range(5))
    assert len(out) == 3 + 4 + 5 + 6 + 7
    assert set(out.y.tolist()) == {0, 1, 2, 3, 4} and out.num_classes == 6  # labels and label space kept
    assert keep_classes(ds, [2, "5"]).y.tolist() == [2] * 5 + [5] * 8
    with pytest.raises(InputError, match="not in"):
        keep_classes(ds, [6])
    with pytest.raises(InputError, match="no samples"):
        keep_classes(keep_classes(ds, [0]), [1])


def test_imbalance_counts_follow_long_tail_profile() -> None:
    ds = _ds([100] * 5)
    out = imbalance(ds, ratio=0.1, seed=0)
    counts = torch.bincount(out.y, minlength=5).tolist()
    expected = [round(100 * 0.1 ** (k / 4)) for k in range(5)]  # 100, 56, 32, 18, 10
    assert counts == expected == [100, 56, 32, 18, 10]
    assert imbalance_counts([100] * 5, 0.1) == expected
    assert imbalance_counts([3, 0, 1], 0.01) == [3, 0, 1]  # a class with samples keeps at least one
    assert len(imbalance(ds, ratio=1.0, seed=0)) == 500


def test_imbalance_is_seeded_and_keeps_order() -> None:
    ds = _ds([50] * 4)
    a, b, c = (imbalance(ds, ratio=0.2, seed=s) for s in (1, 1, 2))
    assert torch.equal(a.x, b.x) and not torch.equal(a.x, c.x)
    kept = [int(torch.nonzero((ds.x == row).all(dim=(1, 2, 3)))[0]) for row in a.x]
    assert kept == sorted(kept)


@pytest.mark.parametrize("ratio", [0, -0.5, 1.5, float("nan"), "0.1"])
def test_imbalance_bad_ratio(ratio) -> None:
    with pytest.raises(InputError, match="ratio"):
        imbalance(_ds([2, 2]), ratio=ratio, seed=0)
