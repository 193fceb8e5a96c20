"""Architectures of the model zoo: shapes, first layer, options, errors, determinism."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from stealkit.errors import InputError
from stealkit.models import (
    ARCHITECTURES,
    BasicBlock,
    Classifier,
    Normalize,
    arch_defaults,
    build_model,
    count_parameters,
)

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
# CPU-sized options; every other option keeps its default.
SMALL = {"resnet": {"depth": 8, "width": 0.25}}


@pytest.fixture(autouse=True)
def _single_thread():
    """These models are tiny: on a small, busy machine, intra-op thread syncs cost more than they save."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small(arch: str, shape: tuple[int, int, int], num_classes: int = 10, **kw) -> Classifier:
    return build_model(arch, input_shape=shape, num_classes=num_classes, **{**SMALL.get(arch, {}), **kw})


def test_registry_lists_the_documented_architectures():
    assert set(ARCHITECTURES) == {"logistic", "mlp", "mlp2", "conv2", "cnn3", "cnn4", "lenet5", "resnet", "vgg11"}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_arch_builds_and_returns_logits(arch, shape):
    torch.manual_seed(0)
    model = small(arch, shape).eval()
    out = model(torch.rand(3, *shape))
    assert out.shape == (3, 10)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    first = next(iter(model.children()))
    assert isinstance(first, Normalize) and first is model.normalize
    assert first.channels == shape[0]


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_default_normalisation_maps_pixels_to_minus_one_one(arch):
    model = small(arch, (3, 32, 32)).eval()
    assert model.normalize.mean.flatten().tolist() == [0.5] * 3
    assert model.normalize.std.flatten().tolist() == [0.5] * 3
    x = torch.rand(2, 3, 32, 32)
    assert torch.allclose(model(x), model.net(x * 2 - 1), rtol=0, atol=1e-6)


def test_custom_mean_std_per_channel_and_scalar():
    m = build_model("logistic", input_shape=(3, 8, 8), num_classes=4, mean=[0.1, 0.2, 0.3], std=0.25)
    assert m.normalize.mean.flatten().tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert m.normalize.std.flatten().tolist() == [0.25] * 3
    x = torch.rand(1, 3, 8, 8)
    want = (x - torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1)) / 0.25
    assert torch.allclose(m.normalize(x), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "mean,std,match",
    [
        ([0.5, 0.5], 0.5, "3 channel"),
        (0.5, 0.0, "positive"),
        (0.5, [-1.0, 1.0, 1.0], "positive"),
        (float("nan"), 0.5, "finite"),
        ("abc", 0.5, "number"),
    ],
)
def test_bad_normalisation_is_an_input_error(mean, std, match):
    with pytest.raises(InputError, match=match):
        build_model("logistic", input_shape=(3, 8, 8), num_classes=2, mean=mean, std=std)


def test_unknown_arch_lists_the_valid_ones():
    with pytest.raises(InputError) as err:
        build_model("resnet50", input_shape=(3, 32, 32), num_classes=10)
    for name in ARCHITECTURES:
        assert name in str(err.value)


def test_unknown_kwarg_lists_the_valid_ones():
    with pytest.raises(InputError, match=r"hidden=128") as err:
        build_model("mlp2", input_shape=(1, 8, 8), num_classes=10, hiden=64)
    assert "hiden" in str(err.value)
    with pytest.raises(InputError, match="options .* none"):
        build_model("logistic", input_shape=(1, 8, 8), num_classes=10, hidden=3)


@pytest.mark.parametrize(
    "arch,kw",
    [
        ("resnet", {"depth": 50}),
        ("resnet", {"depth": True}),
        ("resnet", {"width": 0}),
        ("resnet", {"width": float("inf")}),
        ("resnet", {"width": "1"}),
        ("vgg11", {"width": -1.0}),
        ("vgg11", {"bn": 1}),
        ("mlp2", {"hidden": 0}),
        ("mlp2", {"hidden": 2.5}),
        ("conv2", {"c1": 0}),
        ("cnn3", {"bn": "yes"}),
        ("cnn4", {"channels": True}),
        ("lenet5", {"activation": "gelu"}),
    ],
)
def test_bad_kwarg_values_are_input_errors(arch, kw):
    with pytest.raises(InputError):
        build_model(arch, input_shape=(1, 8, 8), num_classes=10, **kw)


@pytest.mark.parametrize("shape", [(28, 28), (1, 0, 28), (1, 28, 28.0), "1x28x28", None])
def test_bad_input_shape(shape):
    with pytest.raises(InputError, match="input_shape"):
        build_model("logistic", input_shape=shape, num_classes=10)


@pytest.mark.parametrize("n", [1, 0, 2.0, True])
def test_bad_num_classes(n):
    with pytest.raises(InputError, match="num_classes"):
        build_model("logistic", input_shape=(1, 8, 8), num_classes=n)


def test_forward_rejects_wrong_input_shape():
    model = small("conv2", (1, 28, 28))
    with pytest.raises(InputError, match=r"\[B, 1, 28, 28\]"):
        model(torch.rand(2, 3, 32, 32))
    with pytest.raises(InputError):
        model(torch.rand(1, 28, 28))


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_init_is_deterministic_given_the_seed(arch):
    torch.manual_seed(123)
    a = small(arch, (1, 8, 8)).state_dict()
    torch.manual_seed(123)
    b = small(arch, (1, 8, 8)).state_dict()
    torch.manual_seed(124)
    c = small(arch, (1, 8, 8)).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize("arch", ["conv2", "resnet", "vgg11", "lenet5"])
def test_input_gradients_flow(arch):
    model = small(arch, (1, 8, 8)).eval()
    x = torch.rand(2, 1, 8, 8, requires_grad=True)
    model(x)[:, 3].sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_resolved_kwargs_are_remembered():
    m = build_model("cnn3", input_shape=(1, 8, 8), num_classes=10, channels=8)
    assert m.arch == "cnn3" and m.input_shape == (1, 8, 8) and m.num_classes == 10
    assert m.arch_kwargs == {"channels": 8, "hidden": 128, "bn": False}
    assert arch_defaults("resnet") == {"depth": 18, "width": 1.0}
    assert arch_defaults("logistic") == {}


# --- architecture details -------------------------------------------------------------------------------


def test_logistic_is_one_linear_layer():
    m = small("logistic", (1, 28, 28))
    linears = [x for x in m.modules() if isinstance(x, nn.Linear)]
    assert len(linears) == 1 and linears[0].in_features == 784
    assert count_parameters(m) == 784 * 10 + 10


def test_mlp2_layout():
    m = build_model("mlp2", input_shape=(1, 28, 28), num_classes=10, hidden=64)
    kinds = [type(x) for x in m.net]
    assert kinds == [nn.Flatten, nn.Linear, nn.ReLU, nn.Linear]
    assert m.net[1].bias is not None and m.net[1].out_features == 64
    assert count_parameters(m) == 784 * 64 + 64 + 64 * 10 + 10


def test_conv2_layout():
    m = small("conv2", (1, 28, 28))
    convs = [x for x in m.modules() if isinstance(x, nn.Conv2d)]
    pools = [x for x in m.modules() if isinstance(x, nn.MaxPool2d)]
    dense = [x for x in m.modules() if isinstance(x, nn.Linear)]
    assert [c.out_channels for c in convs] == [32, 64] and len(pools) == 2
    assert [(d.in_features, d.out_features) for d in dense] == [(64 * 7 * 7, 128), (128, 10)]


@pytest.mark.parametrize("arch,n", [("cnn3", 3), ("cnn4", 4)])
def test_cnn_conv_counts_and_optional_bn(arch, n):
    plain = small(arch, (3, 32, 32))
    with_bn = small(arch, (3, 32, 32), bn=True)
    assert sum(isinstance(x, nn.Conv2d) for x in plain.modules()) == n
    assert not any(isinstance(x, nn.BatchNorm2d) for x in plain.modules())
    assert sum(isinstance(x, nn.BatchNorm2d) for x in with_bn.modules()) == n


def test_lenet5_is_classic_on_28x28_and_32x32():
    for shape in [(1, 28, 28), (1, 32, 32)]:
        m = small("lenet5", shape)
        convs = [x for x in m.modules() if isinstance(x, nn.Conv2d)]
        dense = [x for x in m.modules() if isinstance(x, nn.Linear)]
        assert [(c.out_channels, c.kernel_size) for c in convs] == [(6, (5, 5)), (16, (5, 5))]
        assert [(d.in_features, d.out_features) for d in dense] == [(400, 120), (120, 84), (84, 10)]
        assert count_parameters(m) == 61706


@pytest.mark.parametrize("depth,blocks", [(8, 4), (18, 8), (34, 16)])
def test_resnet_depths(depth, blocks):
    m = build_model("resnet", input_shape=(3, 32, 32), num_classes=10, depth=depth, width=0.125)
    assert sum(isinstance(x, BasicBlock) for x in m.modules()) == blocks
    stem = m.net.conv1
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1) and stem.out_channels == 8
    assert not any(isinstance(x, nn.MaxPool2d) for x in m.modules())
    assert m.net.linear.in_features == 64
    assert m.eval()(torch.rand(1, 3, 32, 32)).shape == (1, 10)


def test_resnet18_full_width_matches_the_usual_size():
    with torch.device("meta"):
        m = build_model("resnet", input_shape=(3, 32, 32), num_classes=10, depth=18)
    assert count_parameters(m) == 11_173_962  # the CIFAR ResNet-18 of DFAD/DFME


@pytest.mark.parametrize("shape,pools", [((1, 8, 8), 3), ((1, 28, 28), 4), ((3, 32, 32), 5)])
def test_vgg11_skips_pools_that_would_shrink_below_1x1(shape, pools):
    m = small("vgg11", shape)
    assert sum(isinstance(x, nn.MaxPool2d) for x in m.modules()) == pools
    convs = [x for x in m.modules() if isinstance(x, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 64, 64, 128, 128, 128, 128]


def test_count_parameters_trainable_only():
    m = small("mlp2", (1, 8, 8))
    total = count_parameters(m)
    m.net[1].weight.requires_grad_(False)
    assert count_parameters(m, trainable_only=True) == total - 64 * 128
    assert count_parameters(m) == total


@settings(max_examples=15, deadline=None)
@given(
    arch=st.sampled_from(["logistic", "mlp2", "conv2", "cnn3", "cnn4", "lenet5", "vgg11", "resnet"]),
    c=st.integers(1, 3),
    h=st.integers(1, 36),
    w=st.integers(1, 36),
)
def test_any_input_size_works(arch, c, h, w):
    kw = {"hidden": 8} if arch in ("mlp2", "conv2", "cnn3", "cnn4") else {}
    if arch in ("cnn3", "cnn4"):
        kw["channels"] = 4
    if arch == "resnet":
        kw = {"depth": 8, "width": 0.0625}
    m = build_model(arch, input_shape=(c, h, w), num_classes=3, **kw).eval()
    assert m(torch.rand(2, c, h, w)).shape == (2, 3)
