"""The two data types: ``Dataset`` (images, labels, class names) and ``Splits`` (victim / attacker / test)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from stealkit.data._checks import Shape3, check_count
from stealkit.errors import InputError

Indices = torch.Tensor | np.ndarray | Sequence[int] | range


@dataclass(frozen=True, eq=False)
class Dataset:
    """Labelled images.

    Attributes:
        x: float32 ``[N, C, H, W]`` with every pixel in ``[0, 1]`` (or ``[N, d]``: feature vectors mapped to
            ``[0, 1]`` by their ranges, :mod:`stealkit.data.features`).
        y: int64 ``[N]``, each label an index into ``classes``.
        classes: the class names; ``len(classes)`` is the size of the label space, which can be larger than
            the set of labels present (after ``keep_classes`` for example).
        name: a short name for reports, e.g. ``"digits/attacker_pool"``.

    Equality is identity (comparing tensors element-wise has no single truth value).
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: tuple[str, ...]
    name: str

    def __post_init__(self) -> None:
        x, y = self.x, self.y
        if not isinstance(self.name, str):
            raise InputError(f"Dataset name must be a string, got {type(self.name).__name__}")
        where = f"dataset {self.name!r}"
        if isinstance(self.classes, str) or not isinstance(self.classes, Sequence):
            raise InputError(f"{where}: classes must be a sequence of class names, got {self.classes!r}")
        classes = tuple(self.classes)
        if not classes or not all(isinstance(c, str) for c in classes):
            raise InputError(f"{where}: classes must be a non-empty sequence of strings, got {classes!r}")
        object.__setattr__(self, "classes", classes)
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise InputError(
                f"{where}: x and y must be torch tensors, got {type(x).__name__}, {type(y).__name__}"
            )
        if x.dim() not in (2, 4):
            raise InputError(f"{where}: x must have shape [N, C, H, W] (images) or [N, d] (features in [0, 1]), "
                             f"got {tuple(x.shape)}")
        if x.dtype != torch.float32:
            raise InputError(f"{where}: x must be float32 with pixels in [0, 1], got {x.dtype}")
        if y.dim() != 1 or y.dtype != torch.int64:
            raise InputError(f"{where}: y must be an int64 vector [N], got {y.dtype} {tuple(y.shape)}")
        if x.shape[0] != y.shape[0]:
            raise InputError(f"{where}: x has {x.shape[0]} images but y has {y.shape[0]} labels")
        if x.shape[0] == 0:
            return
        lo, hi = torch.aminmax(x)  # NaN propagates into both
        if torch.isnan(lo) or torch.isnan(hi):
            raise InputError(f"{where}: x contains NaN pixels")
        if lo < 0 or hi > 1:
            raise InputError(
                f"{where}: pixels must lie in [0, 1], found [{lo.item():.4g}, {hi.item():.4g}] "
                "(divide uint8 images by 255)"
            )
        ylo, yhi = torch.aminmax(y)
        if ylo < 0 or yhi >= len(classes):
            raise InputError(
                f"{where}: labels must lie in [0, {len(classes) - 1}] for {len(classes)} classes, "
                f"found [{ylo.item()}, {yhi.item()}]"
            )

    @property
    def input_shape(self) -> Shape3 | tuple[int]:
        """``(C, H, W)`` of one image, or ``(d,)`` of one feature vector."""
        return tuple(int(s) for s in self.x.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        """Size of the label space (``len(classes)``)."""
        return len(self.classes)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __repr__(self) -> str:
        return f"Dataset(name={self.name!r}, n={len(self)}, input_shape={self.input_shape}, classes={self.num_classes})"

    def subset(self, indices: Indices, *, name: str | None = None) -> Dataset:
        """The images at ``indices`` (integer indices in any order, or a boolean mask of length N)."""
        idx = torch.as_tensor(np.asarray(indices) if not isinstance(indices, torch.Tensor) else indices)
        if idx.dtype == torch.bool:
            if idx.shape != (len(self),):
                raise InputError(
                    f"a boolean mask for {self.name!r} must have shape ({len(self)},), got {tuple(idx.shape)}"
                )
            idx = idx.nonzero().flatten()
        elif idx.numel() == 0:
            idx = idx.to(torch.int64).flatten()
        elif idx.is_floating_point() or idx.is_complex() or idx.dim() != 1:
            raise InputError(
                f"subset indices must be a 1-D sequence of integers, got {idx.dtype} {tuple(idx.shape)}"
            )
        idx = idx.to(torch.int64)
        if idx.numel() and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise InputError(f"subset index out of range for {self.name!r} with {len(self)} images")
        return Dataset(self.x[idx], self.y[idx], self.classes, self.name if name is None else name)

    def take(self, n: int) -> Dataset:
        """The first ``n`` images (all of them when ``n >= len(self)``, like slicing)."""
        n = check_count(n)
        return Dataset(self.x[:n], self.y[:n], self.classes, self.name)

    def with_x(self, x: torch.Tensor) -> Dataset:
        """The same labels and classes with other images (e.g. resized ones)."""
        return dataclasses.replace(self, x=x)


@dataclass(frozen=True, eq=False)
class Splits:
    """The three disjoint splits of Milli et al. (2019), Section 4.

    Attributes:
        victim_train: the victim's training set, with labels.
        attacker_pool: unlabelled natural images for the attacker to query with (its labels exist only for
            analysis; an attack must never read them).
        test: held-out images for measuring accuracy and agreement.
        name: the data set's name, e.g. ``"fashion-mnist"``.
    """

    victim_train: Dataset
    attacker_pool: Dataset
    test: Dataset
    name: str

    def __post_init__(self) -> None:
        parts = {"victim_train": self.victim_train, "attacker_pool": self.attacker_pool, "test": self.test}
        for part, ds in parts.items():
            if not isinstance(ds, Dataset):
                raise InputError(f"splits {self.name!r}: {part} must be a Dataset, got {type(ds).__name__}")
        shapes = {ds.input_shape for ds in parts.values()}
        if len(shapes) != 1:
            raise InputError(
                f"splits {self.name!r}: the three splits have different image shapes {sorted(shapes)}"
            )
        if len({ds.classes for ds in parts.values()}) != 1:
            raise InputError(f"splits {self.name!r}: the three splits have different class lists")

    @property
    def input_shape(self) -> Shape3:
        """``(C, H, W)`` of one image."""
        return self.victim_train.input_shape

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names shared by the three splits."""
        return self.victim_train.classes

    @property
    def num_classes(self) -> int:
        """Size of the label space."""
        return self.victim_train.num_classes
