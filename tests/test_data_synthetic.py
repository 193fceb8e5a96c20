"""Data-free query sources: Gaussian and uniform noise, crops of the bundled photographs."""

from __future__ import annotations

import pytest
import torch

from stealkit.data import gaussian, natural_patches, uniform
from stealkit.errors import InputError

GENERATORS = [gaussian, uniform, natural_patches]


@pytest.mark.parametrize("make", GENERATORS)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (3, 8, 12)])
def test_shape_dtype_range(make, shape) -> None:
    x = make(6, shape, seed=0)
    assert x.shape == (6, *shape) and x.dtype == torch.float32
    assert x.min() >= 0 and x.max() <= 1


@pytest.mark.parametrize("make", GENERATORS)
def test_deterministic_per_seed_and_global_rng_untouched(make) -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = make(4, (3, 16, 16), seed=7), make(4, (3, 16, 16), seed=7), make(4, (3, 16, 16), seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("make", GENERATORS)
def test_zero_and_bad_arguments(make) -> None:
    assert make(0, (1, 4, 4), seed=0).shape == (0, 1, 4, 4)
    with pytest.raises(InputError, match="non-negative"):
        make(-1, (1, 4, 4), seed=0)
    with pytest.raises(InputError, match="shape"):
        make(2, (4, 4), seed=0)
    with pytest.raises(InputError, match="seed"):
        make(2, (1, 4, 4), seed=-3)


def test_gaussian_statistics_and_per_channel() -> None:
    x = gaussian(400, (1, 16, 16), seed=0, mean=0.5, std=0.1)
    assert abs(x.mean().item() - 0.5) < 0.01 and abs(x.std().item() - 0.1) < 0.01
    y = gaussian(200, (3, 8, 8), seed=0, mean=(0.2, 0.5, 0.8), std=[0.05, 0.05, 0.05])
    means = y.mean(dim=(0, 2, 3))
    assert torch.allclose(means, torch.tensor([0.2, 0.5, 0.8]), atol=0.01)
    z = gaussian(50, (1, 8, 8), seed=0)  # default std 0.5: clipping puts mass on 0 and 1
    assert (z == 0).any() and (z == 1).any()
    assert torch.equal(gaussian(3, (1, 4, 4), seed=0, std=0.0), torch.full((3, 1, 4, 4), 0.5))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mean": (0.1, 0.2)}, "1 or 3 values"),
        ({"std": -1.0}, "non-negative"),
        ({"mean": "a"}, "number"),
        ({"std": float("inf")}, "finite"),
    ],
)
def test_gaussian_bad_parameters(kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        gaussian(2, (3, 4, 4), seed=0, **kwargs)


def test_uniform_covers_the_range() -> None:
    x = uniform(100, (1, 8, 8), seed=0)
    assert x.min() < 0.01 and x.max() > 0.99 and abs(x.mean().item() - 0.5) < 0.02


def test_natural_patches_look_like_photos() -> None:
    """Crops of photographs are smooth: neighbouring pixels correlate, unlike noise."""
    x = natural_patches(64, (3, 32, 32), seed=0)
    neighbour_diff = (x[..., 1:] - x[..., :-1]).abs().mean()
    noise = uniform(64, (3, 32, 32), seed=0)
    assert neighbour_diff < 0.25 * (noise[..., 1:] - noise[..., :-1]).abs().mean()
    assert x.std(dim=(1, 2, 3)).mean() > 0.02  # not blank
    assert len({row.numpy().tobytes() for row in x.reshape(64, -1)}) == 64  # all different


def test_natural_patches_gray_is_mean_of_rgb_and_other_channel_counts_fail() -> None:
    rgb = natural_patches(5, (3, 16, 16), seed=3)
    gray = natural_patches(5, (1, 16, 16), seed=3)
    assert torch.allclose(gray, rgb.mean(dim=1, keepdim=True), atol=1e-6)
    with pytest.raises(InputError, match="1 or 3 channels"):
        natural_patches(2, (4, 8, 8), seed=0)


def test_natural_patches_flip_mirrors_the_crop() -> None:
    from stealkit.data.synthetic import _crops_into, _photo_pyramids

    draws = torch.tensor([[0.2, 0.6, 0.3, 0.7, 0.1], [0.2, 0.6, 0.3, 0.7, 0.9], [0.8, 0.6, 0.3, 0.7, 0.9]])
    out = torch.empty(3, 3, 12, 12)
    _crops_into(out, draws, _photo_pyramids())
    assert torch.equal(out[0], out[1].flip(-1))  # same crop, mirrored
    assert not torch.allclose(out[1], out[2])  # other photograph


def test_natural_patches_many_crops_span_chunks() -> None:
    from stealkit.data.synthetic import _CHUNK

    x = natural_patches(_CHUNK + 5, (1, 4, 4), seed=1)
    assert x.shape == (_CHUNK + 5, 1, 4, 4) and x.min() >= 0 and x.max() <= 1
    assert x[-5:].std() > 0
