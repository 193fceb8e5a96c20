"""The owner's own data: images from a ``.npy`` / ``.npz`` file, a folder of PNG / JPEG images or arrays in memory
(:class:`ArrayData`, from the Python API), made to fit the victim's input (:func:`read_images`): each becomes one
:class:`OwnData`, through the same checks.

Arrays: a ``.npy`` file holds the images ``x``; a ``.npz`` file holds ``x`` and, where labels are needed, ``y``
(read with ``allow_pickle=False``). ``x`` is flat ``[N, C*H*W]`` or shaped ``[N, C, H, W]`` (also ``[N, H, W]``
and ``[N, H, W, C]`` where that is unambiguous). Folders: the images directly in the folder, or one subfolder per
class (the folder's name is the label: sorted names are class ids 0, 1, ...; names that are all integers are their
values); any size or mode, resized to the victim's ``H x W`` and converted to its channels. Pixels are floats in
[0, 1] or bytes 0..255 (a ``uint8`` array or a largest value above 1), detected and stated in ``pixel_scale``.
Every failure is one ``InputError`` line saying what is wrong and what to do.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stealkit.data._checks import Shape3, check_shape
from stealkit.errors import InputError

#: the suffixes of array files, and of the images a folder may hold
ARRAY_SUFFIXES = (".npy", ".npz")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: below this many test items, the audit says how wide a fidelity's 95 % interval is
SMALL_TEST = 200


@dataclass(frozen=True, eq=False)
class OwnData:
    """The owner's images (float32 ``[N, C, H, W]`` in [0, 1], the victim's input), their labels (int64 ``[N]``
    or ``None``), where they came from, how many, the sha256 of the float32 tensor's bytes, how the pixel values
    were read (``"float [0, 1]"`` or ``"bytes 0..255"``) and the class names (a folder's, else ``None``)."""

    x: torch.Tensor
    y: torch.Tensor | None
    source: str
    size: int
    digest: str
    pixel_scale: str
    class_names: tuple[str, ...] | None = None

    def record(self) -> dict[str, Any]:
        """What ``config.json`` records of the data: source, size, digest and pixel scale."""
        return {"source": self.source, "size": self.size, "sha256": self.digest, "pixel_scale": self.pixel_scale}


def is_own_path(spec: str) -> bool:
    """Whether ``spec`` names a file or folder of the owner's data: it ends in ``.npy`` / ``.npz``, holds a path
    separator, or is an existing folder. Cheap: no file is read."""
    text = spec.strip()
    return (text.lower().endswith(ARRAY_SUFFIXES) or "/" in text or os.sep in text
            or (bool(text) and Path(text).is_dir()))


def check_own_path(path: str | os.PathLike[str], what: str = "data") -> Path:
    """``path`` if it is an existing ``.npy`` / ``.npz`` file or folder; else one line saying what to pass."""
    p = Path(path)
    if p.is_dir():
        return p
    if not p.exists():
        raise InputError(f"{what} {os.fspath(path)}: no such file or folder; give an existing .npy or .npz file or "
                         "a folder of PNG/JPEG images")
    if p.suffix.lower() not in ARRAY_SUFFIXES:
        raise InputError(f"{what} {os.fspath(path)}: expected a .npy or .npz file or a folder of PNG/JPEG images, "
                         f"got a {p.suffix or 'suffix-less'} file")
    return p


def _digest(x: torch.Tensor) -> str:
    return hashlib.sha256(x.contiguous().numpy().tobytes()).hexdigest()


def item_digests(x: torch.Tensor) -> list[str]:
    """One sha256 per item of float32 ``x`` (its bytes): the same image, the same digest."""
    arr = x.detach().cpu().float().contiguous().numpy().reshape(len(x), -1)
    return [hashlib.sha256(row.tobytes()).hexdigest() for row in arr]


def overlap(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many items of ``b`` are also in ``a`` (byte-equal after conversion to the victim's input)."""
    seen = set(item_digests(a))
    return sum(d in seen for d in item_digests(b))


def interval_half_width(n: int, p: float = 0.9) -> float:
    """The 95 % interval's half-width of a proportion near ``p`` measured on ``n`` items (normal approximation)."""
    return 1.96 * float(np.sqrt(p * (1 - p) / max(n, 1)))


def _scale(arr: np.ndarray, where: str) -> tuple[np.ndarray, str]:
    """``arr`` as float32 in [0, 1] and how it was read; values outside both ranges are refused."""
    if arr.dtype.kind not in "fiub":
        raise InputError(f"{where}: expected numeric pixel values, got dtype {arr.dtype}; save the images as "
                         "uint8 or float32")
    if arr.dtype == np.uint8:
        return arr.astype(np.float32) / 255.0, "bytes 0..255"
    values = arr.astype(np.float32)
    if values.size == 0:
        return values, "float [0, 1]"
    if not np.isfinite(values).all():
        raise InputError(f"{where}: the images hold NaN or infinite values; give pixels in [0, 1] or 0..255")
    lo, hi = float(values.min()), float(values.max())
    if lo < 0 or hi > 255:
        raise InputError(f"{where}: pixel values lie in [{lo:.4g}, {hi:.4g}], outside both [0, 1] and 0..255; "
                         "give floats in [0, 1] or bytes 0..255 (undo any normalisation)")
    if hi > 1:
        return values / 255.0, "bytes 0..255"
    return values, "float [0, 1]"


def _shaped(arr: np.ndarray, shape: Shape3, where: str) -> np.ndarray:
    """``arr`` as ``[N, C, H, W]`` of the victim's ``shape``; one line naming the shapes accepted otherwise."""
    c, h, w = shape
    n = arr.shape[0] if arr.ndim else 0
    if arr.ndim == 2 and arr.shape[1] == c * h * w:
        return arr.reshape(n, c, h, w)
    if arr.ndim == 4 and tuple(arr.shape[1:]) == (c, h, w):
        return arr
    if arr.ndim == 4 and tuple(arr.shape[1:]) == (h, w, c):
        return arr.transpose(0, 3, 1, 2)
    if arr.ndim == 3 and tuple(arr.shape[1:]) == (h, w):
        return np.repeat(arr[:, None], c, axis=1)
    raise InputError(f"{where}: images of shape {list(arr.shape)} fit neither the victim's flat input "
                     f"[N, {c * h * w}] nor its shaped input [N, {c}, {h}, {w}] (or [N, {h}, {w}, {c}]); "
                     "reshape the array to one of them")


def labels_of(y: Any, n: int, where: str, num_classes: int | None) -> torch.Tensor:
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        raise InputError(f"{where}: y must be one label per image ([{n}]), got shape {list(y.shape)}")
    if y.dtype.kind == "f" and len(y) and not np.all(np.mod(y, 1) == 0):
        raise InputError(f"{where}: y must hold integer class ids, got fractional values")
    if y.dtype.kind not in "fiub":
        raise InputError(f"{where}: y must hold integer class ids, got dtype {y.dtype}")
    labels = torch.from_numpy(y.astype(np.int64))
    if len(labels) and (int(labels.min()) < 0 or (num_classes is not None and int(labels.max()) >= num_classes)):
        top = f"{num_classes - 1}" if num_classes is not None else "K-1"
        raise InputError(f"{where}: labels lie in [{int(labels.min())}, {int(labels.max())}] but the victim's "
                         f"classes are 0..{top}; give its class ids")
    return labels


def load_arrays(path: Path, with_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``x`` and ``y`` (or ``None``) of a ``.npy`` / ``.npz`` file, read with ``allow_pickle=False``; one
    ``InputError`` line for a pickle, an unreadable file, an archive without ``x``, missing labels or no items."""
    where = os.fspath(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise InputError(f"{where}: not a plain numeric array file ({exc}); save it with numpy.save / "
                         "numpy.savez without objects") from None
    except (OSError, EOFError) as exc:
        raise InputError(f"{where}: cannot read it ({exc}); save it again with numpy.save / numpy.savez") from None
    y = None
    if isinstance(loaded, np.ndarray):
        if path.suffix.lower() == ".npz":
            raise InputError(f"{where}: not an .npz archive; save it with numpy.savez(PATH, x=..., y=...)")
        x = loaded
        if with_labels:
            raise InputError(f"{where}: labels are needed but a .npy file holds x (images only, or features only); save "
                             "numpy.savez(PATH.npz, x=inputs, y=labels)")
    else:
        with loaded as archive:
            keys = list(archive.keys())
            if "x" not in keys:
                raise InputError(f"{where}: the .npz holds {keys or 'nothing'} but no 'x'; save "
                                 "numpy.savez(PATH, x=inputs, y=labels)")
            try:
                x = archive["x"]
                y = archive["y"] if "y" in keys else None
            except ValueError as exc:
                raise InputError(f"{where}: not a plain numeric array archive ({exc}); save it without "
                                 "objects") from None
        if with_labels and y is None:
            raise InputError(f"{where}: labels are needed but the .npz holds no 'y'; save "
                             "numpy.savez(PATH, x=inputs, y=labels)")
    if x.ndim < 2 or len(x) == 0:
        raise InputError(f"{where}: no items (x has shape {list(x.shape)}); give at least one")
    return x, y


def _check_numeric(x: np.ndarray, where: str) -> None:
    """At least one item of at least one finite number (the checks that hold for images and feature vectors
    alike; the pixel scale is checked when the items are read as images)."""
    if x.ndim < 2 or len(x) == 0:
        raise InputError(f"{where}: no items (x has shape {list(x.shape)}); give at least one")
    if x.dtype.kind not in "fiub":
        raise InputError(f"{where}: expected numbers, got dtype {x.dtype}; give a float or integer array")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise InputError(f"{where}: the items hold NaN or infinite values; give finite values")


def _check_items(x: np.ndarray, where: str) -> tuple[np.ndarray, str]:
    """``x``'s values as float32 in [0, 1] and how they were read; at least one item of at least one value."""
    if x.ndim < 2 or len(x) == 0:
        raise InputError(f"{where}: no items (x has shape {list(x.shape)}); give at least one")
    return _scale(x, where)


def _from_arrays(x: np.ndarray, y: np.ndarray | None, shape: Shape3, num_classes: int | None,
                 where: str) -> tuple[np.ndarray, str, torch.Tensor | None]:
    """Arrays as the victim's input: pixel scale detected, shape fitted, labels checked (a file's and an in-memory
    array's alike)."""
    values, scale = _check_items(x, where)
    values = _shaped(values, shape, where)
    labels = labels_of(y, len(values), where, num_classes) if y is not None else None
    return values, scale, labels


def _to_numpy(value: Any, name: str, where: str) -> np.ndarray:
    """A numpy array or torch tensor (any device) as a read-only numpy copy; anything else refused."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        arr = t.numpy().copy()
    elif isinstance(value, np.ndarray):
        arr = np.array(value, copy=True)
    else:
        raise InputError(f"{where}: {name} must be a numpy array or a torch tensor, got {type(value).__name__}")
    if arr.dtype.kind == "O":
        raise InputError(f"{where}: {name} holds Python objects; give a numeric array")
    arr.flags.writeable = False
    return arr


def _array_name(x: np.ndarray, y: np.ndarray | None) -> str:
    h = hashlib.sha256()
    for a in (x, y):
        if a is not None:
            h.update(f"{a.dtype.str}{list(a.shape)}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(b"|")
    return f"array:{h.hexdigest()[:16]}"


class ArrayData(str):
    """The owner's data given as arrays or tensors (``x``, and ``y`` where labels are given), as a query source
    or test-data spec. It is a ``str`` whose text, ``array:<16 hex digits of the arrays' sha256>``, is what
    config.json, part ids and resume checks see, so it goes wherever a path spec goes, and it carries read-only
    copies of the arrays to :func:`read_images` (pickled with them, e.g. into an audit's worker processes). Built,
    it has passed every check the victim is not needed for (numeric, finite, at least one item, one integer label >=
    0 per item); the pixel scale is checked when it is read as images."""

    x: np.ndarray
    y: np.ndarray | None
    what: str  # how the caller named it (``test``, ``pool``): the start of its error lines

    def __new__(cls, x: Any, y: Any = None, *, what: str = "data") -> ArrayData:
        xs = _to_numpy(x, "x", what)
        ys = _to_numpy(y, "y", what) if y is not None else None
        _check_numeric(xs, what)
        if ys is not None:
            labels_of(ys, len(xs), what, None)
        self = super().__new__(cls, _array_name(xs, ys))
        self.x, self.y, self.what = xs, ys, what
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.x, self.y, self.what))


def _rebuild(x: np.ndarray, y: np.ndarray | None, what: str) -> ArrayData:
    return ArrayData(x, y, what=what)


def own_spec(value: Any, what: str = "data") -> str:
    """A path, or the owner's arrays as an :class:`ArrayData` spec: ``value`` is a path (``str`` or
    ``os.PathLike``), an array or tensor of images, or a pair ``(x, y)`` of images and labels."""
    if isinstance(value, ArrayData):
        return value
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, tuple):
        if len(value) != 2:
            raise InputError(f"{what}: give (x, y), images and labels; got a tuple of {len(value)}")
        return ArrayData(value[0], value[1], what=what)
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return ArrayData(value, what=what)
    raise InputError(f"{what}: expected a path, an array or tensor of images, or (x, y); got "
                     f"{type(value).__name__}")


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _read_image(path: Path, shape: Shape3) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    c, h, w = shape
    try:
        with Image.open(path) as img:
            img = img.convert("RGB" if c == 3 else "L")
            if img.size != (w, h):
                img = img.resize((w, h), Image.Resampling.BILINEAR)
            arr = np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(f"{path}: not a readable image ({exc}); remove it or save it as PNG/JPEG") from None
    arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    if arr.shape[0] != c:  # grey repeated to a victim of C channels other than 1 or 3
        arr = np.repeat(arr, c, axis=0)
    return arr


def _class_ids(names: list[str]) -> list[int]:
    try:
        return [int(n) for n in names]
    except ValueError:
        return list(range(len(names)))


def _read_folder(folder: Path, shape: Shape3, with_labels: bool,
                 num_classes: int | None) -> tuple[np.ndarray, str, torch.Tensor | None, tuple[str, ...] | None]:
    where = os.fspath(folder)
    loose = _images_in(folder)
    subdirs = sorted((d for d in folder.iterdir() if d.is_dir() and _images_in(d)), key=lambda d: d.name)
    if loose and subdirs:
        raise InputError(f"{where}: holds both images and class folders; put every image in its class's folder "
                         "(or none in folders)")
    if not loose and not subdirs:
        raise InputError(f"{where}: no PNG/JPEG images in it or in its subfolders; give a folder of images "
                         "(one subfolder per class where labels are needed)")
    if loose:
        if with_labels:
            raise InputError(f"{where}: labels are needed but the images are not in class folders; put them in "
                             "one subfolder per class (the folder's name is the label)")
        return np.stack([_read_image(p, shape) for p in loose]), "bytes 0..255", None, None
    names = [d.name for d in subdirs]
    if all(n.lstrip("-").isdigit() for n in names):
        subdirs.sort(key=lambda d: int(d.name))
        names = [d.name for d in subdirs]
    ids = _class_ids(names)
    images, labels = [], []
    for d, k in zip(subdirs, ids, strict=True):
        files = _images_in(d)
        images += [_read_image(p, shape) for p in files]
        labels += [k] * len(files)
    y = labels_of(np.asarray(labels, dtype=np.int64), len(labels), where, num_classes)
    return np.stack(images), "bytes 0..255", y, tuple(names)


_CACHE: dict[tuple[Any, ...], OwnData] = {}


def _stamp(p: Path) -> tuple[Any, ...]:
    if p.is_file():
        st = p.stat()
        return (st.st_mtime_ns, st.st_size)
    return tuple(sorted((os.fspath(f), f.stat().st_mtime_ns, f.stat().st_size) for f in p.rglob("*") if f.is_file()))


def read_images(path: str | os.PathLike[str] | ArrayData, *, input_shape: Shape3 | tuple[int, ...],
                with_labels: bool, num_classes: int | None = None, what: str = "data") -> OwnData:
    """The owner's images at ``path`` (a ``.npy`` / ``.npz`` file or a folder of images, see the module
    docstring, or an :class:`ArrayData`: source ``"array"``) as the victim's input ``input_shape``;
    ``with_labels``: labels are required (an ``.npz``'s ``y`` or a folder's class folders), else read where
    present. ``num_classes``: labels must be below it. ``what`` starts each error line (e.g. ``--test-data``; an
    :class:`ArrayData`'s start with its own name). Reads are cached per file state (or content) and shape."""
    shape = check_shape(input_shape)
    if isinstance(path, ArrayData):
        return _read_in_memory(path, shape, with_labels, num_classes)
    p = check_own_path(path, what)
    key = (os.fspath(p.resolve()), _stamp(p), shape, with_labels, num_classes)
    if key in _CACHE:
        return _CACHE[key]
    try:
        if p.is_dir():
            arr, scale, y, names = _read_folder(p, shape, with_labels, num_classes)
        else:
            arr, scale, y = _from_arrays(*load_arrays(p, with_labels), shape, num_classes, os.fspath(p))
            names = None
    except InputError as exc:
        raise InputError(f"{what} {exc}") from None
    x = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    if scale == "bytes 0..255" and p.is_dir():
        x = x / 255.0
    data = _own(x, y, os.fspath(path), scale, names)
    if len(_CACHE) > 8:
        _CACHE.clear()
    _CACHE[key] = data
    return data


def _own(x: torch.Tensor, y: torch.Tensor | None, source: str, scale: str,
         names: tuple[str, ...] | None = None) -> OwnData:
    return OwnData(x=x, y=y, source=source, size=len(x), digest=_digest(x), pixel_scale=scale, class_names=names)


def _read_in_memory(data: ArrayData, shape: Shape3, with_labels: bool, num_classes: int | None) -> OwnData:
    """In-memory arrays through the checks a file's go through; source ``"array"``; errors start with the name
    the caller gave them (``test``, ``pool``)."""
    if with_labels and data.y is None:
        raise InputError(f"{data.what}: labels are needed but only images were given; pass (x, y), images and "
                         "labels")
    key = (str(data), shape, with_labels, num_classes)
    if key not in _CACHE:
        arr, scale, y = _from_arrays(data.x, data.y, shape, num_classes, data.what)
        if len(_CACHE) > 8:
            _CACHE.clear()
        _CACHE[key] = _own(torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)), y, "array", scale)
    return _CACHE[key]
