"""Query sources: a one-line spec that says which images an attacker queries the victim with.

Grammar: ``NAME[:key=value]...`` (case-insensitive name, no spaces needed), for example::

    pool                   the attacker pool of the victim's own data set
    digits:classes=0-4     the attacker pool of `digits`, only classes 0..4, adapted to the victim's input
    cifar10:imbalance=0.1  CIFAR-10's attacker pool with a long-tailed class profile
    gaussian:mean=0.5:std=0.25
    uniform
    patches                crops of scikit-learn's bundled photographs
    my/images.npz          the owner's own images: a .npy/.npz file or a folder of PNG/JPEG images
                           (:mod:`stealkit.data.own`), adapted to the victim's input; from Python, also
                           arrays (an :class:`~stealkit.data.own.ArrayData`, whose text is array:HASH)

A feature-vector victim (input shape ``(d,)``, :mod:`stealkit.data.features`) takes its owner's ``.npy``/``.npz``
of ``x [N, d]`` (mapped into ``[0, 1]^d`` by the victim's feature ranges), ``uniform`` (uniform over the ranges'
box) or ``gaussian`` (one ``mean`` and ``std``, in ``[0, 1]`` units); image sources are refused.

Options of data set sources (``pool`` and every name in ``DATASETS``): ``classes=0-4`` or ``classes=0,2,5``
(or mixed, ``0-2,7``) keeps those classes; ``imbalance=R`` with R in (0, 1] applies a long-tail profile.
Options of ``gaussian``: ``mean`` and ``std``, each one number or one per channel (``mean=0.49,0.48,0.45``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from stealkit.data._checks import Shape3, check_count, check_seed, check_shape
from stealkit.data.adapt import adapt_images, imbalance, keep_classes
from stealkit.data.features import FeatureRange, is_tabular, read_own
from stealkit.data.own import ArrayData, check_own_path, is_own_path, read_images
from stealkit.data.sources import DATASETS, canonical_dataset, load_split
from stealkit.data.synthetic import gaussian, natural_patches, uniform
from stealkit.errors import InputError

SYNTHETIC_SOURCES: tuple[str, ...] = ("gaussian", "uniform", "patches")
QUERY_SOURCES: tuple[str, ...] = ("pool", *DATASETS, *SYNTHETIC_SOURCES)

_DATA_OPTIONS = ("classes", "imbalance")
_OPTIONS: dict[str, tuple[str, ...]] = {
    "pool": _DATA_OPTIONS,
    **{name: _DATA_OPTIONS for name in DATASETS},
    "gaussian": ("mean", "std"),
    "uniform": (),
    "patches": (),
}


@dataclass(frozen=True)
class SourceSpec:
    """A parsed query source spec. ``name`` is canonical (``pool``, a data set, or a synthetic source)."""

    name: str
    classes: tuple[int, ...] | None = None
    imbalance: float | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    path: str | None = None  # name "file": the owner's file or folder

    @property
    def is_file(self) -> bool:
        """True for the owner's own file or folder of images."""
        return self.path is not None

    @property
    def is_synthetic(self) -> bool:
        """True for sources that generate images instead of reading a finite pool."""
        return self.name in SYNTHETIC_SOURCES


def _parse_classes(value: str, spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for token in value.split(","):
        token = token.strip()
        try:
            if "-" in token:
                lo_text, hi_text = token.split("-", 1)
                lo, hi = int(lo_text), int(hi_text)
                if lo > hi:
                    raise ValueError
                values = list(range(lo, hi + 1))
            else:
                values = [int(token)]
        except ValueError:
            raise InputError(
                f"query source {spec!r}: bad classes item {token!r}; write class indices like classes=0-4 "
                "or classes=0,2,5"
            ) from None
        out += [v for v in values if v not in out]
    return tuple(out)


def _parse_floats(value: str, key: str, spec: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise InputError(
            f"query source {spec!r}: {key} must be a number or comma-separated numbers, got {value!r}"
        ) from None


def _parse_ratio(value: str, spec: str) -> float:
    try:
        ratio = float(value)
    except ValueError:
        ratio = float("nan")
    if not 0 < ratio <= 1:
        raise InputError(
            f"query source {spec!r}: imbalance must be a number in (0, 1], e.g. imbalance=0.1; got {value!r}"
        )
    return ratio


def parse_source(spec: str) -> SourceSpec:
    """Parse a query source spec (see the module docstring); ``InputError`` says what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"empty query source; use one of: {', '.join(QUERY_SOURCES)}")
    if isinstance(spec, ArrayData):  # the owner's arrays, from the Python API
        return SourceSpec(name="file", path=spec)
    head, *option_texts = (part.strip() for part in spec.strip().split(":"))
    key = head.lower()
    if key in QUERY_SOURCES:
        name = key
    else:
        try:
            name = canonical_dataset(key)
        except InputError:
            if is_own_path(spec):
                return SourceSpec(name="file", path=str(check_own_path(spec.strip(), "query source")))
            raise InputError(
                f"unknown query source {head!r}; valid sources: {', '.join(QUERY_SOURCES)}, or a .npy/.npz file "
                "or a folder of images"
            ) from None
    allowed = _OPTIONS[name]
    values: dict[str, str] = {}
    for text in option_texts:
        opt, eq, value = text.partition("=")
        opt, value = opt.strip().lower(), value.strip()
        if not eq or not opt or not value:
            raise InputError(f"query source {spec!r}: option {text!r} must be written key=value")
        if opt not in allowed:
            valid = ", ".join(allowed) if allowed else "none"
            raise InputError(
                f"query source {spec!r}: unknown option {opt!r} for {name}; valid options: {valid}"
            )
        if opt in values:
            raise InputError(f"query source {spec!r}: option {opt!r} is given twice")
        values[opt] = value
    return SourceSpec(
        name=name,
        classes=_parse_classes(values["classes"], spec) if "classes" in values else None,
        imbalance=_parse_ratio(values["imbalance"], spec) if "imbalance" in values else None,
        mean=_parse_floats(values["mean"], "mean", spec) if "mean" in values else None,
        std=_parse_floats(values["std"], "std", spec) if "std" in values else None,
    )


def _pool_dataset(parsed: SourceSpec, spec: str, victim_dataset: str | None) -> str:
    if parsed.name != "pool":
        return parsed.name
    if victim_dataset is None:
        raise InputError(
            f"query source {spec!r} means the victim's own attacker pool, but the victim's data set is not known; "
            f"name a data set instead ({', '.join(DATASETS)})"
        )
    return canonical_dataset(victim_dataset)


def load_query_source(
    spec: str,
    *,
    input_shape: Shape3 | tuple[int, ...],
    n: int | None,
    seed: int,
    data_dir: str | Path | None = None,
    victim_dataset: str | None = None,
    split_seed: int = 0,
    features: FeatureRange | None = None,
) -> torch.Tensor:
    """Images for query source ``spec``, adapted to ``input_shape``: float32 ``[n, C, H, W]`` in [0, 1] (for a
    feature-vector victim, ``input_shape`` ``(d,)``: ``[n, d]`` in [0, 1], files mapped by ``features``).

    Data set sources return their attacker pool (after ``classes``/``imbalance``) shuffled with ``seed``.
    ``n=None`` means the whole pool; a pool smaller than ``n`` is returned whole, so the result can be
    shorter than ``n`` and callers cap their number of distinct queries at its length. Synthetic sources
    need an ``n``. ``split_seed`` is the ``load_splits`` seed that cut the data set into victim / attacker /
    test: pass the victim's own split seed (default 0, as in ``load_splits``), or a ``digits`` pool can
    overlap the victim's training images. ``seed`` only shuffles and subsamples.
    """
    parsed = parse_source(spec)
    if is_tabular(input_shape):
        return _feature_source(parsed, spec, int(tuple(input_shape)[0]), n=n, seed=check_seed(seed),
                               features=features)
    shape = check_shape(input_shape)
    seed = check_seed(seed)
    if n is not None:
        n = check_count(n)
    if parsed.is_synthetic:
        if n is None:
            raise InputError(f"query source {spec!r} is unbounded; give a number of images n")
        if parsed.name == "gaussian":
            return gaussian(n, shape, seed=seed, mean=parsed.mean or 0.5, std=parsed.std or 0.5)
        if parsed.name == "uniform":
            return uniform(n, shape, seed=seed)
        return natural_patches(n, shape, seed=seed)
    if parsed.path is not None:
        x = read_images(parsed.path, input_shape=shape, with_labels=False, what="query source").x
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
        if n is not None:
            order = order[:n]
        return x[order].contiguous()
    dataset = _pool_dataset(parsed, spec, victim_dataset)
    ds = load_split(dataset, "attacker_pool", data_dir=data_dir, seed=check_seed(split_seed))
    if parsed.classes is not None:
        ds = keep_classes(ds, parsed.classes)
    if parsed.imbalance is not None:
        ds = imbalance(ds, ratio=parsed.imbalance, seed=seed)
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))
    if n is not None:
        order = order[:n]
    return adapt_images(ds.x[order], shape).contiguous()


def _feature_source(parsed: SourceSpec, spec: str, d: int, *, n: int | None, seed: int,
                    features: FeatureRange | None) -> torch.Tensor:
    """Query source ``spec`` for a victim of ``d`` features: ``[n, d]`` in [0, 1]."""
    if n is not None:
        n = check_count(n)
    gen = torch.Generator().manual_seed(seed)
    if parsed.path is not None:
        x = read_own(parsed.path, input_shape=(d,), features=features, with_labels=False, what="query source").x
        order = torch.randperm(len(x), generator=gen)
        return x[order if n is None else order[:n]].contiguous()
    if parsed.name in ("uniform", "gaussian"):
        if n is None:
            raise InputError(f"query source {spec!r} is unbounded; give a number of points n")
        if parsed.name == "uniform":
            return torch.rand((n, d), generator=gen)
        if len(parsed.mean or ()) > 1 or len(parsed.std or ()) > 1:
            raise InputError(f"query source {spec!r}: a feature-vector victim takes one mean and one std")
        mean, std = (parsed.mean or (0.5,))[0], (parsed.std or (0.5,))[0]
        return (torch.randn((n, d), generator=gen) * std + mean).clamp_(0.0, 1.0)
    raise InputError(f"query source {spec!r} holds images, but the victim takes a vector of {d} features; give "
                     "your own .npy/.npz of feature vectors, or uniform / gaussian (e.g. --unrelated uniform)")


def _ranges(values: tuple[int, ...]) -> str:
    parts: list[str] = []
    ordered = sorted(values)
    start = prev = ordered[0]
    for v in [*ordered[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def _numbers(values: tuple[float, ...] | None, default: float) -> str:
    return "/".join(f"{v:g}" for v in values) if values else f"{default:g}"


def describe_source(spec: str, *, victim_dataset: str | None = None) -> str:
    """A one-line human description of a query source spec, for reports."""
    parsed = parse_source(spec)
    if isinstance(parsed.path, ArrayData):
        return f"the owner's images ({len(parsed.path.x):,} given as arrays, {parsed.path})"
    if parsed.path is not None:
        return f"the owner's images in {parsed.path}"
    if parsed.name == "gaussian":
        return (
            f"Gaussian noise in pixel space (mean {_numbers(parsed.mean, 0.5)}, "
            f"std {_numbers(parsed.std, 0.5)}, clipped to [0, 1])"
        )
    if parsed.name == "uniform":
        return "uniform noise in [0, 1]"
    if parsed.name == "patches":
        return "random crops of scikit-learn's two sample photographs"
    if parsed.name == "pool":
        text = (
            f"attacker pool of the victim's data set ({victim_dataset})"
            if victim_dataset
            else "attacker pool of the victim's data set"
        )
    else:
        text = f"attacker pool of {parsed.name}"
    extras = []
    if parsed.classes is not None:
        extras.append(f"classes {_ranges(parsed.classes)} only")
    if parsed.imbalance is not None:
        extras.append(f"long-tailed, last class kept at ratio {parsed.imbalance:g}")
    return text + (f" ({'; '.join(extras)})" if extras else "")
