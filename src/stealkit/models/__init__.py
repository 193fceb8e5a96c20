"""The model zoo: architectures from the papers stealkit reproduces, a safe save/load format, and the
generators used by data-free extraction.

Every model takes pixels in ``[0, 1]`` (float32, NCHW) and returns logits ``[B, num_classes]``; its first
layer is :class:`Normalize`. Models are saved as safetensors + JSON and never loaded from pickles.
"""

from stealkit.models.generators import DaSTGenerator, UpsampleGenerator, to_pixels
from stealkit.models.io import build_from_spec, load_model, save_model
from stealkit.models.layers import Classifier, Normalize, count_parameters
from stealkit.models.resnet import BasicBlock, ResNet, resnet
from stealkit.models.spec import ModelSpec
from stealkit.models.vgg import VGG, vgg11
from stealkit.models.zoo import (
    ARCHITECTURES,
    DEFAULT_MEAN,
    DEFAULT_STD,
    arch_defaults,
    build_model,
    cnn3,
    cnn4,
    conv2,
    lenet5,
    logistic,
    mlp2,
)

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "VGG",
    "BasicBlock",
    "Classifier",
    "DaSTGenerator",
    "ModelSpec",
    "Normalize",
    "ResNet",
    "UpsampleGenerator",
    "arch_defaults",
    "build_from_spec",
    "build_model",
    "cnn3",
    "cnn4",
    "conv2",
    "count_parameters",
    "lenet5",
    "load_model",
    "logistic",
    "mlp2",
    "resnet",
    "save_model",
    "to_pixels",
    "vgg11",
]
