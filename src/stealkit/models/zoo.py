"""The architecture registry (:data:`ARCHITECTURES`, :func:`build_model`) and the small networks.

Every builder has the signature ``builder(input_shape, num_classes, *, kwarg=default, ...)`` and returns
the network body; :func:`build_model` puts a :class:`~stealkit.models.layers.Normalize` in front of it.
Default normalisation (``mean``/``std`` left as ``None``) is mean 0.5 and std 0.5 in every channel, which
maps pixels in ``[0, 1]`` to ``[-1, 1]``. Weights use PyTorch's default initialisation, so a model is
reproducible given ``torch.manual_seed``.

All builders accept any ``(C, H, W)``; a 2x2 pool that would shrink a map below 1x1 is skipped, which is
how the pooled networks run on 8x8 inputs. A feature-vector input ``(d,)`` (:mod:`stealkit.data.features`) takes
the dense families only (:data:`FEATURE_ARCHS`); :func:`student_for` picks ``mlp`` for it in place of an image
network.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

from torch import nn

from stealkit.errors import InputError
from stealkit.models._checks import boolean, positive_int
from stealkit.models.layers import Classifier, Normalize, pool_out, valid_input_shape
from stealkit.models.resnet import resnet
from stealkit.models.vgg import vgg11

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "arch_defaults",
    "build_model",
    "cnn3",
    "cnn4",
    "conv2",
    "FEATURE_ARCHS",
    "lenet5",
    "logistic",
    "mlp",
    "mlp2",
    "student_for",
]

DEFAULT_MEAN = 0.5
DEFAULT_STD = 0.5

Builder = Callable[..., nn.Module]


def _width(input_shape: tuple[int, ...]) -> int:
    return math.prod(input_shape)


def logistic(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Multinomial logistic regression: one linear layer on the flattened pixels.

    Milli, Schmidt, Dragan & Hardt, "Model Reconstruction from Model Explanations", FAT* 2019, Sec. 4.
    """
    return nn.Sequential(nn.Flatten(), nn.Linear(_width(input_shape), num_classes))


def mlp2(input_shape: tuple[int, int, int], num_classes: int, *, hidden: int = 128) -> nn.Module:
    """Two-layer ReLU network, Linear-ReLU-Linear with biases (Milli et al., FAT* 2019, Sec. 4)."""
    hidden = positive_int("mlp2", "hidden", hidden)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(_width(input_shape), hidden), nn.ReLU(inplace=True), nn.Linear(hidden, num_classes)
    )


def mlp(input_shape: tuple[int, ...], num_classes: int, *, hidden: Sequence[int] | int = (64, 64)) -> nn.Module:
    """A dense ReLU network with the hidden widths ``hidden`` (one int per layer, e.g. ``(64, 64)`` or
    ``"64,64"``; ``()`` is logistic regression): the student family of feature-vector victims (and usable on flattened images)."""
    if isinstance(hidden, str):  # the command line's "32,16"
        try:
            hidden = [int(t) for t in hidden.strip("[]() ").split(",") if t.strip()]
        except ValueError:
            raise InputError(f"mlp: hidden must be layer widths such as 64,64, got {hidden!r}") from None
    widths = [hidden] if isinstance(hidden, int) else list(hidden) if isinstance(hidden, Sequence) else None
    if widths is None:
        raise InputError(f"mlp: hidden must be a list of layer widths (e.g. [64, 64]), got {hidden!r}")
    widths = [positive_int("mlp", "hidden", w) for w in widths]
    layers: list[nn.Module] = [nn.Flatten()]
    width = _width(input_shape)
    for w in widths:
        layers += [nn.Linear(width, w), nn.ReLU(inplace=True)]
        width = w
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def conv2(
    input_shape: tuple[int, int, int], num_classes: int, *, c1: int = 32, c2: int = 64, hidden: int = 128
) -> nn.Module:
    """Two 3x3 conv layers (``c1``, ``c2`` channels, ReLU), each followed by a 2x2 max-pool, then two dense
    layers (``hidden`` units, then the logits): the convolutional network of Milli et al. (FAT* 2019, Sec. 4).
    """
    c1 = positive_int("conv2", "c1", c1)
    c2 = positive_int("conv2", "c2", c2)
    hidden = positive_int("conv2", "hidden", hidden)
    c, h, w = input_shape
    layers: list[nn.Module] = []
    for cin, cout in ((c, c1), (c1, c2)):
        layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True)]
        fits, h, w = pool_out(h, w)
        if fits:
            layers.append(nn.MaxPool2d(2))
    layers += [
        nn.Flatten(),
        nn.Linear(c2 * h * w, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, num_classes),
    ]
    return nn.Sequential(*layers)


def _plain_cnn(
    arch: str,
    n_conv: int,
    input_shape: tuple[int, int, int],
    num_classes: int,
    channels: int,
    hidden: int,
    bn: bool,
) -> nn.Module:
    channels = positive_int(arch, "channels", channels)
    hidden = positive_int(arch, "hidden", hidden)
    bn = boolean(arch, "bn", bn)
    c, h, w = input_shape
    layers: list[nn.Module] = []
    for i in range(n_conv):
        out = channels * 2**i
        layers.append(nn.Conv2d(c, out, 3, padding=1, bias=not bn))
        if bn:
            layers.append(nn.BatchNorm2d(out))
        layers.append(nn.ReLU(inplace=True))
        fits, h, w = pool_out(h, w)
        if fits:
            layers.append(nn.MaxPool2d(2))
        c = out
    layers += [
        nn.Flatten(),
        nn.Linear(c * h * w, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, num_classes),
    ]
    return nn.Sequential(*layers)


def cnn3(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    channels: int = 32,
    hidden: int = 128,
    bn: bool = False,
) -> nn.Module:
    """Lightweight CNN with 3 conv layers (3x3, ``channels`` doubling per layer, each with ReLU and a 2x2
    max-pool, optional batch norm) and two dense layers.

    The substitute of CoDFe (data-free model extraction with 3-conv substitutes and 4-conv targets, Sec. 4),
    which follows DaST (Zhou et al., "DaST: Data-free Substitute Training for Adversarial Attacks", CVPR 2020).
    """
    return _plain_cnn("cnn3", 3, input_shape, num_classes, channels, hidden, bn)


def cnn4(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    channels: int = 32,
    hidden: int = 128,
    bn: bool = False,
) -> nn.Module:
    """Lightweight CNN with 4 conv layers, the target network of CoDFe (Sec. 4), "as DaST" (Zhou et al.,
    CVPR 2020). Same layout as :func:`cnn3` with one more conv block."""
    return _plain_cnn("cnn4", 4, input_shape, num_classes, channels, hidden, bn)


def lenet5(input_shape: tuple[int, int, int], num_classes: int, *, activation: str = "tanh") -> nn.Module:
    """LeNet-5 (LeCun, Bottou, Bengio & Haffner, "Gradient-Based Learning Applied to Document Recognition",
    Proc. IEEE 1998): C1 6@5x5, S2 2x2 average pool, C3 16@5x5, S4 2x2 average pool, F5 120, F6 84, output.

    Adaptations: C1 pads by 2 when the input is smaller than 32x32 (the usual MNIST variant, so 28x28 inputs
    reach the paper's 5x5x16 S4 map exactly as 32x32 ones do); C3 pads by 2 when its input is smaller than
    5x5 (8x8 inputs: 8 -> 4 -> 4 -> 2); pools that would shrink a map below 1x1 are skipped; C5 is a dense
    layer on the flattened S4 map; the RBF output layer is a linear layer. ``activation`` is ``"tanh"`` (the
    paper's squashing function) or ``"relu"``.
    """
    if activation not in ("tanh", "relu"):
        raise InputError(f"lenet5: activation must be 'tanh' or 'relu', got {activation!r}")

    def act() -> nn.Module:
        return nn.Tanh() if activation == "tanh" else nn.ReLU(inplace=True)

    c, h, w = input_shape
    layers: list[nn.Module] = []
    for cin, cout, pad in ((c, 6, 2 if min(h, w) < 32 else 0), (6, 16, None)):
        if pad is None:
            pad = 0 if min(h, w) >= 5 else 2
        layers += [nn.Conv2d(cin, cout, 5, padding=pad), act()]
        h, w = h + 2 * pad - 4, w + 2 * pad - 4
        fits, h, w = pool_out(h, w)
        if fits:
            layers.append(nn.AvgPool2d(2))
    layers += [
        nn.Flatten(),
        nn.Linear(16 * h * w, 120),
        act(),
        nn.Linear(120, 84),
        act(),
        nn.Linear(84, num_classes),
    ]
    return nn.Sequential(*layers)


ARCHITECTURES: dict[str, Builder] = {
    "logistic": logistic,
    "mlp": mlp,
    "mlp2": mlp2,
    "conv2": conv2,
    "cnn3": cnn3,
    "cnn4": cnn4,
    "lenet5": lenet5,
    "resnet": resnet,
    "vgg11": vgg11,
}


#: the families that take a feature vector ``(d,)``
FEATURE_ARCHS = ("mlp", "mlp2", "logistic")
#: the student :func:`student_for` gives a feature-vector victim in place of an image network
FEATURE_STUDENT = "mlp"


def student_for(arch: str, input_shape: Sequence[int]) -> str:
    """The student family that runs for ``arch`` on ``input_shape``: ``arch`` itself, except an image network
    (e.g. the default ``conv2``) for a feature vector ``(d,)``, which becomes :data:`FEATURE_STUDENT`."""
    if len(tuple(input_shape)) == 1 and arch in ARCHITECTURES and arch not in FEATURE_ARCHS:
        return FEATURE_STUDENT
    return arch


def _builder(arch: str) -> Builder:
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise InputError(f"unknown architecture {arch!r}; choose one of: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[arch]


def arch_defaults(arch: str) -> dict[str, object]:
    """The keyword arguments ``arch`` accepts, with their defaults."""
    params = inspect.signature(_builder(arch)).parameters
    return {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def build_model(
    arch: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    mean: float | Sequence[float] | None = None,
    std: float | Sequence[float] | None = None,
    **kwargs: object,
) -> Classifier:
    """Build ``arch`` for inputs of ``input_shape`` ``(C, H, W)`` (pixels in [0, 1]) and ``num_classes``.

    ``mean``/``std`` are per-channel (a scalar is repeated); ``None`` means 0.5. ``kwargs`` are the
    architecture's own options (see :func:`arch_defaults`). Returns a :class:`Classifier` whose first module is
    the :class:`Normalize` layer and whose output is logits ``[B, num_classes]``.
    """
    defaults = arch_defaults(arch)
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        valid = ", ".join(f"{k}={v!r}" for k, v in defaults.items()) or "none"
        raise InputError(
            f"{arch} does not take {', '.join(unknown)}; its options (with defaults) are: {valid}"
        )
    shape = valid_input_shape(input_shape, features=True)
    if len(shape) == 1 and arch not in FEATURE_ARCHS:
        raise InputError(f"{arch} is an image network; a vector of {shape[0]} features takes "
                         f"{', '.join(FEATURE_ARCHS)} (e.g. --student mlp)")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise InputError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    resolved = {**defaults, **kwargs}
    net = ARCHITECTURES[arch](shape, num_classes, **resolved)
    normalize = Normalize(
        DEFAULT_MEAN if mean is None else mean, DEFAULT_STD if std is None else std, channels=shape[0],
        flat=len(shape) == 1,
    )
    return Classifier(
        normalize, net, arch=arch, input_shape=shape, num_classes=num_classes, arch_kwargs=resolved
    )
