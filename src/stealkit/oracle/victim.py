"""The victim handle: :class:`Target` (the victim as a caller has it) and :func:`open_victim` (its metered oracle,
and what the experimenter knows about it for evaluation). Every runner and study opens its victim here."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit.errors import InputError, StealkitError
from stealkit.metrics import Evaluator, predict_labels
from stealkit.oracle.base import Oracle, OutputMode

log = logging.getLogger(__name__)


@dataclass
class Victim:
    """An oracle over the victim, and what the experimenter knows about it for evaluation."""

    oracle: Oracle
    input_shape: tuple[int, int, int]
    num_classes: int
    dataset: str | None
    split_seed: int = 0
    model: nn.Module | None = None  # only for local victims: evaluation, never attacks
    spec: Any = None
    location: str = ""
    #: a remote victim's top-1 labels of the test split, bought by the caller (evaluation queries, charged to
    #: their own ledger): fidelity is then measured against them (a local victim's come from its model)
    reference_labels: torch.Tensor | None = None
    #: the owner's labelled test data (a ``.npy``/``.npz`` file or a folder of images): the test split
    test_data: str | None = None
    #: a feature-vector victim's feature ranges (its input is ``[0, 1]^d`` mapped onto them), else ``None``
    features: Any = None

    @property
    def is_local(self) -> bool:
        return self.model is not None


@dataclass(frozen=True)
class Target:
    """The victim as a caller has it, and how to reach it.

    ``victim``: a model directory, an ``.onnx``/``.pt`` file (with ``?k=v`` metadata), an ``http(s)://`` or
    ``v2+http://`` address, or an ``nn.Module`` taking images in [0, 1] (then ``input_shape`` is required and
    ``num_classes`` defaults to one forward of zeros, outside any ledger). ``standard:NAME`` is resolved by the
    caller (:func:`stealkit.victims.standard_victim`).

    A victim whose input is a vector of ``d`` features (``input_shape=(d,)``, or an ONNX graph input
    ``[batch, d]``) is opened behind its feature ranges (:mod:`stealkit.oracle.tabular`): ``features`` (a
    :class:`~stealkit.data.features.FeatureRange` or a ranges file), else the min / max of ``test_data`` and
    ``feature_data`` (the owner's other data files, e.g. the pool) with a margin."""

    victim: Any
    key: str | None = None
    top_k: int = 1
    dataset: str | None = None
    data_dir: str | None = None
    device: str = "cpu"
    seed: int = 0
    input_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    reference_labels: Any = None  # the victim's labels of the test split, for a remote victim (see Victim)
    test_data: str | None = None  # the owner's labelled test data, replacing the data set's test split
    features: Any = None  # a feature-vector victim's declared ranges (FeatureRange or a ranges file)
    feature_data: tuple[str, ...] = ()  # other owner data files the feature ranges are taken from

    def open(self, *, mode: str | OutputMode = "probs", budget: int | None = None, temperature: float = 1.0,
             explain: bool = False, defences: tuple[Any, ...] = ()) -> Victim:
        """The opened victim: :func:`open_victim` with this target's key, top-k, data set, device and seed."""
        v = open_victim(self.victim, mode=mode, budget=budget, temperature=temperature, top_k=self.top_k,
                        key=self.key, explain=explain, dataset=self.dataset, device=self.device, seed=self.seed,
                        defences=defences, input_shape=self.input_shape, num_classes=self.num_classes,
                        features=self.features, feature_data=(self.test_data, *self.feature_data))
        if v.model is None:
            v.reference_labels = self.reference_labels
        v.test_data = self.test_data
        return v

    def with_seed(self, seed: int) -> Target:
        """The same target with another seed."""
        return dataclasses.replace(self, seed=seed)

    @property
    def location(self) -> str:
        """What config.json records: the path or address, or ``<module NAME>`` for an ``nn.Module``."""
        return module_location(self.victim) if isinstance(self.victim, nn.Module) else os.fspath(self.victim)


def module_location(module: nn.Module) -> str:
    """How a module victim is named in a run's records: ``<module NAME>``."""
    return f"<module {type(module).__name__}>"


def is_url(victim: str) -> bool:
    return victim.startswith(("http://", "https://", "v2+http://", "v2+https://"))


def open_victim(
    victim: str | Path | nn.Module,
    *,
    mode: str | OutputMode = "probs",
    budget: int | None = None,
    temperature: float = 1.0,
    top_k: int = 1,
    key: str | None = None,
    explain: bool = False,
    dataset: str | None = None,
    device: str = "cpu",
    seed: int = 0,
    defences: tuple[Any, ...] = (),
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    features: Any = None,
    feature_data: tuple[str | None, ...] = (),
) -> Victim:
    """Open a victim given as a model directory, an ONNX or TorchScript file, an ``http(s)://`` API address, a
    v2 (Open Inference Protocol) endpoint ``v2+http://host:port/v2/models/NAME`` (:mod:`stealkit.oracle.http_v2`),
    or an ``nn.Module`` (called as it is, with ``input_shape``; ``num_classes`` from one forward of zeros when
    not given).

    A file may carry what its metadata lacks as ``FILE?input_shape=C,H,W&num_classes=K&...`` (see
    :mod:`stealkit.models.foreign_meta`; the CLI's ``--input-shape`` etc. are folded in this way). It is wrapped
    as an ``nn.Module`` and answered by the same :class:`~stealkit.oracle.LocalOracle`, so the ledger counts
    the same. (The CLI's ``--victim standard:NAME`` is resolved to a directory by the command layer, which may
    build victims; this layer only opens them.) ``defences`` (:func:`stealkit.serve.defences.parse_defence`)
    perturb a local victim's answers, as a ``stealkit serve`` key's ``defences`` do; a remote victim's are its server's.
    A victim of ``d`` features (input shape ``(d,)``) is answered behind its feature ranges: ``features``
    declared, else taken from the owner's data files ``feature_data`` (:func:`stealkit.oracle.tabular.map_features`).
    """
    from stealkit.oracle.tabular import map_features

    if isinstance(victim, nn.Module):
        shape, k = _module_shape(victim, input_shape, num_classes)
        mapped, ranges = map_features(victim, shape, features, feature_data)
        return _local(mapped, None, shape, k, features=ranges, location=module_location(victim), mode=mode, budget=budget,
                      temperature=temperature, top_k=top_k, explain=explain, dataset=dataset, device=device,
                      seed=seed, defences=defences)
    victim = str(victim)
    if victim.startswith("standard:"):
        raise InputError(f"{victim}: resolve standard victims first (stealkit.victims.standard_victim(NAME).path)")
    if is_url(victim):
        if defences:
            raise InputError(f"{victim} is a remote victim: its defences are its server's (a stealkit serve key's defences)")
        try:
            from stealkit.oracle.http import HttpOracle
            from stealkit.oracle.http_v2 import V2HttpOracle, is_v2
        except ImportError:
            raise StealkitError("HTTP victims need stealkit.oracle.http, which this install lacks") from None
        remote: HttpOracle
        if is_v2(victim):  # the Open Inference Protocol: a key only if the server wants one
            remote = V2HttpOracle(victim, key=key, mode=mode, budget=budget)
        elif not key:
            raise InputError("an HTTP victim needs an API key: pass --key KEY")
        else:
            remote = HttpOracle(victim, key=key, mode=mode, budget=budget)
        if len(remote.input_shape) != 3:
            remote.close()
            raise InputError(f"{victim} takes a vector of {remote.input_shape[0]} features: feature-vector victims are "
                             "audited from their model file (ONNX, TorchScript) or nn.Module, not over HTTP yet")
        return Victim(
            oracle=remote,
            input_shape=remote.input_shape,
            num_classes=remote.num_classes,
            dataset=dataset or getattr(remote, "dataset", None),
            split_seed=int(getattr(remote, "split_seed", 0) or 0),
            location=victim,
        )
    from stealkit.models import load_model
    from stealkit.models.foreign import is_foreign, load_foreign

    model: nn.Module
    spec: Any  # a ModelSpec, or a ForeignMeta for an ONNX/TorchScript file
    if is_foreign(victim):
        model, spec = load_foreign(victim, device=device)
        if explain and spec.format == "onnx":
            raise InputError(f"{spec.path} is an ONNX victim: onnxruntime gives no gradients, so it cannot answer "
                             "explanations; use a TorchScript (.pt) or stealkit model directory for explanation modes")
    else:
        model, spec = load_model(victim, device=device)
    declared = (getattr(spec, "extra", None) or {}).get("feature_ranges")
    if features is None and isinstance(declared, str):  # a file's declared ranges (FILE.onnx?feature_ranges=r.json)
        features = declared
    if not is_foreign(victim) and len(spec.input_shape) == 1:
        # a stealkit model of d features (a stolen copy) already takes points of [0, 1]^d: no map in front of it;
        # its ranges (kept in its model.json) read the owner's rows
        from stealkit.oracle.tabular import saved_ranges

        ranges = saved_ranges(spec.input_shape[0], features, declared, feature_data)
    else:
        model, ranges = map_features(model, tuple(spec.input_shape), features, feature_data)
    return _local(model, spec, tuple(spec.input_shape), spec.num_classes, features=ranges, location=victim,
                  mode=mode, budget=budget,
                  temperature=temperature, top_k=top_k, explain=explain, dataset=dataset, device=device, seed=seed,
                  defences=defences)


def _module_shape(module: nn.Module, input_shape: tuple[int, ...] | None,
                  num_classes: int | None) -> tuple[tuple[int, ...], int]:
    """A module victim's ``(input_shape, num_classes)``; the class count from one unmetered forward of zeros."""
    if input_shape is None:
        raise InputError("an nn.Module victim needs input_shape=(C, H, W) (images) or (d,) (a vector of d features)")
    shape = tuple(int(s) for s in input_shape)
    if len(shape) not in (1, 3) or min(shape) < 1:
        raise InputError(f"input_shape must be (C, H, W) or (d,) of positive sizes, got {input_shape}")
    if num_classes is None:
        was_training = module.training
        module.eval()
        with torch.no_grad():
            num_classes = int(module(torch.zeros(1, *shape)).shape[-1])
        module.train(was_training)
    return shape, int(num_classes)


def _local(model: nn.Module, spec: Any, input_shape: tuple[int, ...], num_classes: int, *, location: str,
           features: Any = None,
           mode: str | OutputMode, budget: int | None, temperature: float, top_k: int, explain: bool,
           dataset: str | None, device: str, seed: int, defences: tuple[Any, ...]) -> Victim:
    """A :class:`~stealkit.oracle.LocalOracle` (or its explanation twin) over ``model``, its ledger on the progress bar."""
    from stealkit.oracle.local import LocalExplanationOracle, LocalOracle
    from stealkit.progress import ledger_progress

    cls = LocalExplanationOracle if explain else LocalOracle
    kwargs: dict[str, Any] = {"seed": seed} if explain else {}
    oracle = cls(
        model,
        input_shape,
        num_classes=num_classes,
        mode=mode,
        temperature=temperature,
        top_k=top_k,
        budget=budget,
        device=device,
        defences=defences,
        **kwargs,
    )
    ledger_progress(oracle.ledger)
    extra = (getattr(spec, "extra", None) or {}) if spec is not None else {}
    return Victim(
        oracle=oracle,
        input_shape=tuple(input_shape),  # type: ignore[arg-type]
        num_classes=num_classes,
        dataset=dataset or extra.get("dataset"),
        split_seed=int(extra.get("split_seed", 0)),
        model=model,
        spec=spec,
        location=location,
        features=features,
    )


def make_evaluator(victim: Victim, test_x: torch.Tensor, test_y: torch.Tensor, device: str = "cpu") -> Evaluator:
    """Evaluation on the test split; fidelity needs the victim's labels: a local model's, computed without the
    ledger, or a remote victim's bought by the caller (``victim.reference_labels``)."""
    labels = predict_labels(victim.model, test_x, device=device) if victim.model is not None else \
        victim.reference_labels
    return Evaluator(test_x, test_y, labels, device=device)


def victim_splits(victim: Victim, data_dir: str | Path | None = None) -> Any:
    """The victim task's splits (for the attacker pool and the test split); with the owner's ``test_data``, its
    test split is theirs (:func:`victim_test`)."""
    from stealkit.data import load_splits

    if not victim.dataset:
        raise InputError("the victim's data set is unknown: pass --dataset (e.g. digits, fashion-mnist)")
    splits = load_splits(victim.dataset, data_dir=data_dir, seed=victim.split_seed)
    if tuple(splits.test.input_shape) != tuple(victim.input_shape):
        raise InputError(
            f"--dataset {victim.dataset} has images of shape {splits.test.input_shape} but the victim takes "
            f"{victim.input_shape}; pass the data set the victim was trained for"
        )
    if victim.test_data:
        own = own_test(victim)
        splits = dataclasses.replace(splits, test=dataclasses.replace(own, classes=splits.test.classes))
    return splits


def own_test(victim: Victim) -> Any:
    """The owner's test data (``victim.test_data``) as a :class:`~stealkit.data.Dataset` of the victim's input,
    labels checked against its classes."""
    from stealkit.data import Dataset
    from stealkit.data.features import read_own

    assert victim.test_data
    own = read_own(victim.test_data, input_shape=victim.input_shape, features=victim.features, with_labels=True,
                   num_classes=victim.num_classes, what="--test-data")
    assert own.y is not None
    return Dataset(own.x, own.y, tuple(str(k) for k in range(victim.num_classes)), name=f"own:{own.source}")


def victim_test(victim: Victim, data_dir: str | Path | None = None) -> Any:
    """The test split every figure is scored on: the owner's ``--test-data`` when given (the data set may then be
    unknown), else the victim's data set's test split."""
    if victim.test_data:
        return own_test(victim)
    if not victim.dataset:
        raise InputError("the victim's data set is unknown: pass --dataset (e.g. digits, fashion-mnist) or your own "
                         "labelled test data with --test-data FILE")
    return victim_splits(victim, data_dir).test


def own_data(victim: Victim, pools: dict[str, str] | None = None, data_dir: str | Path | None = None
             ) -> tuple[dict[str, Any], list[str]]:
    """What config.json records of the owner's data (``{"test_data": ..., FLAG: ...}``: source, size, sha256 and
    pixel scale of ``--test-data`` and of each query source in ``pools`` (``{flag: spec}``) that is a file or
    folder), and the warnings where it can mislead: test items also in a pool (by per-item digest), a test split
    too small for a fidelity's precision (its 95 % interval). Both empty when no own data is given."""
    from stealkit.data import parse_source
    from stealkit.data.features import read_own
    from stealkit.data.own import SMALL_TEST, interval_half_width, overlap

    records: dict[str, Any] = {}
    notes: list[str] = []
    files = {flag: parse_source(spec).path for flag, spec in (pools or {}).items()}
    owned = {flag: read_own(path, input_shape=victim.input_shape, features=victim.features, with_labels=False,
                            what=flag) for flag, path in files.items() if path is not None}
    if victim.test_data:
        test = own_test(victim)
        records["test_data"] = read_own(victim.test_data, input_shape=victim.input_shape, features=victim.features,
                                        with_labels=True, num_classes=victim.num_classes, what="--test-data").record()
        n = len(test.y)
        if n < SMALL_TEST:
            notes.append(f"--test-data holds {n:,} items: a fidelity near 0.9 measured on them is known to "
                         f"+/- {interval_half_width(n):.3f} (95 % interval); give at least {SMALL_TEST} for "
                         "figures to two digits")
    for flag, data in owned.items():
        records[flag.lstrip("-").replace("-", "_")] = data.record()
    test_x = None
    if owned:
        with contextlib.suppress(InputError):  # no test split: nothing to overlap
            test_x = victim_test(victim, data_dir).x
    for flag, data in owned.items():
        k = overlap(data.x, test_x) if test_x is not None else 0
        if test_x is not None and k:
            notes.append(f"{k:,} of the {len(test_x):,} test items are also in {flag} {data.source}: fidelity and "
                         "accuracy on them overstate what a copy does on unseen data; remove them from one of the "
                         "two")
    for note in notes:
        if note not in _WARNED:  # once per process, however many runs read the same data
            _WARNED.add(note)
            log.warning("%s", note)
    return records, notes


_WARNED: set[str] = set()


def own_data_config(victim: Victim, pools: dict[str, str] | None = None,
                    data_dir: str | Path | None = None) -> dict[str, Any]:
    """``{"own_data": records}`` for a runner's config.json (:func:`own_data`, its warnings logged once), or
    ``{}`` when no own data is given; and ``{"feature_ranges": ...}`` (source, digest, the ranges) for a
    feature-vector victim."""
    records, _ = own_data(victim, pools, data_dir)
    ranges = {"feature_ranges": victim.features.record()} if victim.features is not None else {}
    return ({"own_data": records} if records else {}) | ranges
