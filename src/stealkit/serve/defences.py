"""Output perturbation defences against model extraction.

Every defence maps ``(probs [B, K], logits [B, K]) -> probs [B, K]`` (the :data:`stealkit.oracle.Defence`
signature), so the same objects serve as ``LocalOracle(defences=...)`` and as the HTTP server's per-key or
per-model defences. They are applied to the (temperature-scaled) softmax before the output mode, in order.

- :func:`rounding` -- round each probability to ``decimals`` places (Tramer et al. 2016, Sec. 6.1;
  ART's ``Rounded``); rows are not renormalised.
- :func:`top_k` -- reveal the ``k`` largest probabilities, zero the rest (ART's ``HighConfidence`` in spirit).
- :func:`label_only` -- a one-hot vector of the top class (ART's ``ClassLabels``, correct for every row).
- :func:`reverse_sigmoid` -- Lee et al. 2019, "Defending against NN model stealing attacks using deceptive
  perturbations", Sec. 3 (Eq. 3): ``y' = alpha * (y - beta * (s(gamma * s^-1(y)) - 1/2))`` with ``s`` the
  sigmoid, ``s^-1`` its inverse and ``alpha`` the renormaliser. The perturbation keeps the top-1 label in the
  common case but makes the map from logits to outputs non-invertible. Parameters as in ART's ``ReverseSigmoid``
  (beta=1, gamma=0.1, probabilities clipped to [1e-9, 1-1e-9], negatives clipped to 0).
- :func:`gaussian_noise` -- add N(0, sigma^2) to each probability, clip at 0, renormalise (ART's
  ``GaussianNoise``).

Adaptive Misinformation (Kariyappa & Qureshi 2020) needs the queried images and a network trained on the owner's
data: :mod:`stealkit.serve.misinformation` (audit and Python only; :func:`parse_defence` refuses ``am``).

Specs for configuration files: ``"round:decimals=2"``, ``"topk:k=3"``, ``"label"``,
``"reverse_sigmoid:beta=1.0,gamma=0.1"``, ``"noise:sigma=0.05,seed=0"`` or the same as TOML tables
(``{name = "round", decimals = 2}``); see :func:`parse_defence`.

What a defence costs the honest user: :func:`served_accuracy` and :func:`served_calibration` (top-1 accuracy and
ECE of the served answer, the owner's own evaluation; nothing charged).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stealkit.errors import InputError
from stealkit.oracle import keep_top_k
from stealkit.settings import parse_value

Defence = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Rounding:
    decimals: int = 2

    def __call__(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return torch.round(probs, decimals=self.decimals)


@dataclass(frozen=True)
class TopK:
    k: int = 1

    def __call__(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return keep_top_k(probs, self.k)


@dataclass(frozen=True)
class LabelOnly:
    def __call__(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        idx = probs.argmax(dim=1, keepdim=True)
        return torch.zeros_like(probs).scatter_(1, idx, 1.0)


@dataclass(frozen=True)
class ReverseSigmoid:
    beta: float = 1.0
    gamma: float = 0.1

    def __call__(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        p = probs.double().clamp(1e-9, 1.0 - 1e-9)
        # s(gamma * s^-1(p)) with s^-1(p) = log(p / (1 - p))
        r = self.beta * (torch.sigmoid(self.gamma * torch.log(p / (1.0 - p))) - 0.5)
        out = (probs.double() - r).clamp(0.0, 1.0)
        total = out.sum(dim=1, keepdim=True)
        # a row the perturbation zeroed entirely falls back to the unperturbed probabilities
        out = torch.where(total > 0, out / total.clamp_min(1e-300), probs.double())
        return out.to(probs.dtype)


class GaussianNoise:
    """Additive Gaussian noise on probabilities, seeded and thread-safe (one generator, one lock)."""

    def __init__(self, sigma: float = 0.05, seed: int = 0) -> None:
        if not sigma >= 0:
            raise InputError(f"noise sigma must be >= 0, got {sigma}")
        self.sigma = float(sigma)
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"GaussianNoise(sigma={self.sigma}, seed={self.seed})"

    def __call__(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        with self._lock:
            noise = torch.randn(probs.shape, generator=self._gen, dtype=probs.dtype) * self.sigma
        out = (probs + noise.to(probs.device)).clamp_min(0.0)
        total = out.sum(dim=1, keepdim=True)
        return torch.where(total > 0, out / total.clamp_min(1e-30), probs)


#: the ranges a defence parameter may take: beyond them every answer is NaN, Inf or meaningless (a keys file
#: with ``noise:sigma=inf`` or ``round:decimals=100000`` would make every query of that key fail)
MAX_DECIMALS = 15  # float64 holds about 15-16 significant digits
MAX_SIGMA = 10.0  # noise on probabilities in [0, 1]; sigma 10 already drowns them
MAX_K = 1_000_000
MAX_BETA_GAMMA = 1000.0


def _number(value: Any, what: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and \
        (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        raise InputError(f"{what} must be a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _integer(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(f"{what} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def rounding(decimals: int = 2) -> Rounding:
    """Round probabilities to ``decimals`` places (0 to :data:`MAX_DECIMALS`)."""
    return Rounding(_integer(decimals, "rounding decimals", 0, MAX_DECIMALS))


def top_k(k: int = 1) -> TopK:
    """Reveal only the ``k`` largest probabilities."""
    return TopK(_integer(k, "topk k", 1, MAX_K))


def label_only() -> LabelOnly:
    """One-hot of the top class."""
    return LabelOnly()


def reverse_sigmoid(beta: float = 1.0, gamma: float = 0.1) -> ReverseSigmoid:
    """Lee et al. 2019's reverse sigmoid perturbation (finite ``beta >= 0``, ``gamma > 0``)."""
    return ReverseSigmoid(_number(beta, "reverse_sigmoid beta", 0.0, MAX_BETA_GAMMA),
                          _number(gamma, "reverse_sigmoid gamma", 0.0, MAX_BETA_GAMMA, lo_open=True))


def gaussian_noise(sigma: float = 0.05, seed: int = 0) -> GaussianNoise:
    """Gaussian noise of standard deviation ``sigma`` (0 to :data:`MAX_SIGMA`) on probabilities, renormalised."""
    return GaussianNoise(_number(sigma, "noise sigma", 0.0, MAX_SIGMA), _integer(seed, "noise seed", 0, 2**63 - 1))


DEFENCES: dict[str, Callable[..., Defence]] = {
    "round": rounding,
    "rounding": rounding,
    "topk": top_k,
    "top_k": top_k,
    "label": label_only,
    "label_only": label_only,
    "reverse_sigmoid": reverse_sigmoid,
    "noise": gaussian_noise,
    "gaussian_noise": gaussian_noise,
}


def parse_defence(spec: str | Mapping[str, Any]) -> Defence:
    """Build a defence from ``"name:key=value,key=value"`` or a mapping ``{"name": ..., key: value}``."""
    if isinstance(spec, str):
        name, _, rest = spec.partition(":")
        kwargs: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            if "=" not in part:
                raise InputError(f"defence option {part!r} in {spec!r} is not KEY=VALUE")
            k, v = part.split("=", 1)
            kwargs[k.strip()] = parse_value(v.strip())
    elif isinstance(spec, Mapping):
        kwargs = dict(spec)
        name = str(kwargs.pop("name", ""))
    else:
        raise InputError(f"a defence is a string like 'round:decimals=2' or a table, got {spec!r}")
    name = name.strip().lower()
    if name in ("am", "adaptive_misinformation"):
        raise InputError("defence 'am' (adaptive misinformation) trains a network on your training data: it is an "
                         "audit/Python-only defence (stealkit audit --defence am, or "
                         "stealkit.serve.misinformation.fit_adaptive_misinformation), not a keys-file one")
    if name not in DEFENCES:
        raise InputError(f"unknown defence {name!r}; expected one of {sorted(set(DEFENCES))}")
    try:
        return DEFENCES[name](**kwargs)
    except TypeError as exc:
        raise InputError(f"bad options for defence {name!r}: {exc}") from None


def parse_defences(specs: Sequence[str | Mapping[str, Any]] | None) -> tuple[Defence, ...]:
    return tuple(parse_defence(s) for s in (specs or ()))


def served_accuracy(model: torch.nn.Module, defence: Any, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy on ``(x, y)`` of the probabilities served through ``defence`` (the owner's own
    evaluation: no ledger charged, no query observed)."""
    return served_calibration(model, x, y, mode="probs", defence=defence)["accuracy"]


def served_calibration(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, mode: str = "probs",
                       defence: Any = None, top_k: int = 1) -> dict[str, float]:
    """Top-1 accuracy and expected calibration error (:func:`stealkit.metrics.expected_calibration_error`, 15
    equal-width bins) of what an API serves in ``mode`` (through ``defence``, if any) on ``(x, y)``, computed
    from the model's logits as :meth:`stealkit.oracle.LocalOracle.answer_from_logits` answers (nothing charged).

    The served confidence is the top-1 class's served score: the probability (after the defence; rounded
    scores are not renormalised) for ``probs``; for ``topk``, the largest of the ``top_k`` probabilities it
    shows, as served (the same number ``probs`` serves); 1.0 for ``label`` (a bare label claims certainty)."""
    from stealkit.device import module_device
    from stealkit.metrics import expected_calibration_error
    from stealkit.oracle import LocalOracle

    oracle = LocalOracle(model, tuple(x.shape[1:]), mode=mode, top_k=top_k, defences=[defence] if defence else [],
                         device=module_device(model))
    answer = oracle.answer_from_logits(oracle.logits(x), x=x)
    if oracle.mode.value == "label":
        pred = answer.long().cpu()
        conf = torch.ones(pred.shape[0])
    else:
        conf, pred = answer.float().cpu().max(dim=1)
    correct = pred == y.cpu()
    return {"accuracy": float(correct.float().mean()),
            "ece": expected_calibration_error(conf, correct)}
