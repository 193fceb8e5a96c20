"""Generators for data-free extraction: shapes, pixel range, pre-tanh consistency, DaST label routing."""

from __future__ import annotations

import pytest
import torch

from stealkit.errors import InputError
from stealkit.models import DaSTGenerator, UpsampleGenerator, to_pixels

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
ids = ["x".join(map(str, s)) for s in SHAPES]


@pytest.fixture(autouse=True)
def _single_thread():
    """These models are tiny: on a small, busy machine, intra-op thread syncs cost more than they save."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_upsample_generator_shapes_and_range(shape):
    torch.manual_seed(0)
    g = UpsampleGenerator(16, shape, ngf=8)
    for mode in (g.train, g.eval):
        mode()
        x = g(torch.randn(5, 16))
        assert x.shape == (5, *shape) and x.dtype == torch.float32
        assert x.min() >= 0 and x.max() <= 1
        assert x.std() > 0


def test_upsample_generator_follows_dfme_layout():
    g = UpsampleGenerator(100, (3, 32, 32), ngf=64)
    assert g.seed_size == (8, 8)
    assert (g.linear.in_features, g.linear.out_features) == (100, 128 * 8 * 8)
    t = g.trunk
    assert (t.block1[0].in_channels, t.block1[0].out_channels) == (128, 128)
    assert (t.block2[0].in_channels, t.block2[0].out_channels) == (128, 64)
    assert (t.out.in_channels, t.out.out_channels) == (64, 3)
    assert not t.out_bn.affine
    assert UpsampleGenerator(4, (1, 28, 28), ngf=4).seed_size == (7, 7)
    assert UpsampleGenerator(4, (1, 8, 8), ngf=4).seed_size == (2, 2)


@pytest.mark.parametrize("shape", [(1, 30, 30), (2, 10, 14), (1, 1, 5)])
def test_sizes_not_divisible_by_four_are_cropped(shape):
    g = UpsampleGenerator(4, shape, ngf=4)
    assert g(torch.randn(3, 4)).shape == (3, *shape)


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_pre_x_is_consistent_with_pixels(shape):
    torch.manual_seed(1)
    g = UpsampleGenerator(8, shape, ngf=4).eval()
    z = torch.randn(4, 8)
    pre = g(z, pre_x=True)
    assert pre.shape == (4, *shape)
    assert torch.equal(g(z), g.to_pixels(pre))
    assert torch.equal(to_pixels(pre), (torch.tanh(pre) + 1) / 2)


def test_pre_x_is_the_output_of_the_non_affine_batch_norm():
    g = UpsampleGenerator(8, (3, 32, 32), ngf=4).train()
    pre = g(torch.randn(6, 8), pre_x=True)
    mean = pre.mean(dim=(0, 2, 3))
    var = pre.var(dim=(0, 2, 3), unbiased=False)
    assert mean.abs().max() < 1e-4
    assert (var - 1).abs().max() < 1e-2


def test_generator_is_trainable_end_to_end():
    g = UpsampleGenerator(8, (1, 8, 8), ngf=4)
    g(torch.randn(4, 8)).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in g.parameters())
    assert g.linear.weight.grad.abs().sum() > 0


def test_bad_generator_inputs():
    with pytest.raises(InputError, match="nz"):
        UpsampleGenerator(0, (1, 8, 8))
    with pytest.raises(InputError, match="input_shape"):
        UpsampleGenerator(8, (8, 8))
    g = UpsampleGenerator(8, (1, 8, 8), ngf=4)
    with pytest.raises(InputError, match=r"\[B, 8\]"):
        g(torch.randn(4, 9))


# --- DaST ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_dast_generator_shapes_and_range(shape):
    torch.manual_seed(0)
    g = DaSTGenerator(8, 10, shape, ngf=4)
    labels = g.sample_labels(20)
    for mode in (g.train, g.eval):
        mode()
        x = g(torch.randn(20, 8), labels)
        assert x.shape == (20, *shape)
        assert x.min() >= 0 and x.max() <= 1
    pre = g(torch.ones(3, 8), labels[:3], pre_x=True)
    assert torch.equal(g(torch.ones(3, 8), labels[:3]), g.to_pixels(pre))


def test_dast_routes_each_sample_through_its_class_branch():
    torch.manual_seed(0)
    g = DaSTGenerator(8, 4, (1, 8, 8), ngf=4).eval()
    z = torch.randn(6, 8)
    labels = torch.tensor([2, 0, 2, 3, 1, 0])
    out = g(z, labels)
    # A sample's image depends on its own label only, not on the rest of the batch.
    for i in range(6):
        assert torch.allclose(g(z[i : i + 1], labels[i : i + 1]), out[i : i + 1], rtol=1e-5, atol=1e-6)
    # The same noise with another label gives another image.
    assert not torch.allclose(g(z[:1], torch.tensor([1])), out[:1])
    # Only the branches of the labels present receive gradients.
    g.zero_grad()
    g(z[:3], torch.tensor([2, 2, 0])).sum().backward()
    grads = [b["linear"].weight.grad for b in g.branches]
    assert grads[2].abs().sum() > 0 and grads[0].abs().sum() > 0
    assert grads[1] is None or grads[1].abs().sum() == 0
    assert grads[3] is None or grads[3].abs().sum() == 0


def test_dast_training_mode_with_one_sample_per_class():
    g = DaSTGenerator(8, 10, (1, 8, 8), ngf=4).train()
    labels = torch.arange(10)
    assert g(torch.randn(10, 8), labels).shape == (10, 1, 8, 8)
    tiny = DaSTGenerator(8, 3, (1, 4, 4), ngf=4).train()
    with pytest.raises(InputError, match="at least 2 samples"):
        tiny(torch.randn(3, 8), torch.arange(3))


@pytest.mark.parametrize("batch", [1, 7, 10, 23, 64])
def test_sample_labels_splits_evenly(batch):
    g = DaSTGenerator(4, 10, (1, 8, 8), ngf=2)
    labels = g.sample_labels(batch, torch.Generator().manual_seed(3))
    assert labels.shape == (batch,) and labels.dtype == torch.int64
    counts = torch.bincount(labels, minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == batch
    again = g.sample_labels(batch, torch.Generator().manual_seed(3))
    assert torch.equal(labels, again)


def test_bad_dast_inputs():
    g = DaSTGenerator(4, 3, (1, 8, 8), ngf=2).eval()
    z = torch.randn(2, 4)
    with pytest.raises(InputError, match=r"in \[0, 2\]"):
        g(z, torch.tensor([0, 3]))
    with pytest.raises(InputError, match="integer labels"):
        g(z, torch.tensor([0.0, 1.0]))
    with pytest.raises(InputError, match="integer labels"):
        g(z, torch.tensor([0]))
    with pytest.raises(InputError, match="num_classes"):
        DaSTGenerator(4, 1, (1, 8, 8))
    with pytest.raises(InputError, match="batch"):
        g.sample_labels(0)
