"""Data layer: labelled image sets, their victim / attacker / test splits, adaptation and query sources.

Images are always float32 ``[N, C, H, W]`` with pixels in [0, 1]; labels int64 ``[N]``.
"""

from stealkit.data.adapt import adapt_dataset, adapt_images, imbalance, keep_classes, resize, to_channels
from stealkit.data.dataset import Dataset, Splits
from stealkit.data.own import OwnData, read_images
from stealkit.data.query_sources import (
    QUERY_SOURCES,
    SourceSpec,
    describe_source,
    load_query_source,
    parse_source,
)
from stealkit.data.readers import CIFAR10_CLASSES, read_cifar10, read_idx, read_mnist, read_svhn
from stealkit.data.safe_pickle import UnsafePickleError, load_data_pickle
from stealkit.data.sources import (
    DATASETS,
    FASHION_MNIST_CLASSES,
    SPLITS,
    candidate_dirs,
    load_split,
    load_splits,
)
from stealkit.data.synthetic import gaussian, natural_patches, uniform

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "FASHION_MNIST_CLASSES",
    "OwnData",
    "QUERY_SOURCES",
    "SPLITS",
    "Dataset",
    "SourceSpec",
    "Splits",
    "UnsafePickleError",
    "adapt_dataset",
    "adapt_images",
    "candidate_dirs",
    "describe_source",
    "gaussian",
    "imbalance",
    "keep_classes",
    "load_data_pickle",
    "load_query_source",
    "load_split",
    "load_splits",
    "natural_patches",
    "parse_source",
    "read_cifar10",
    "read_idx",
    "read_images",
    "read_mnist",
    "read_svhn",
    "resize",
    "to_channels",
    "uniform",
]
