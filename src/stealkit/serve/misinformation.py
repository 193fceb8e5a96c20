"""Adaptive Misinformation (Kariyappa & Qureshi, "Defending Against Model Stealing Attacks with Adaptive
Misinformation", CVPR 2020): answer queries that look out of distribution from a network trained to be wrong.

The served probabilities are ``y = (1 - a(x)) * f(x) + a(x) * f_hat(x)`` (Sec. 4), with

- ``f`` the defended model's softmax;
- ``f_hat`` the *misinformation* network: the same architecture, trained on the defender's own training data to
  put little probability on the correct class (loss ``-log(1 - f_hat(x)_y)``, :func:`misinformation_loss`);
- ``a(x) = sigmoid(nu * (tau - S(x)))``, ``S(x)`` the maximum softmax probability of ``f`` (the out-of-distribution
  score of Hendrycks & Gimpel), ``nu`` the steepness (large: the switch is nearly a step) and ``tau`` the threshold:
  an input whose score is above ``tau`` is treated as in distribution and served ``f`` almost unchanged.

``tau`` is chosen (:func:`pick_threshold`) so that a fraction ``keep`` of the defender's in-distribution
validation inputs score above it; the paper sweeps ``tau`` to trace the defender's accuracy against the clone's.

Deviation from the paper, stated wherever the figures are: the paper trains ``f`` with Outlier Exposure
(Hendrycks et al. 2019) to sharpen the score; stealkit defends the model as the owner trained it and uses its
plain maximum softmax probability, so on a victim trained without Outlier Exposure the detector is weaker than
the paper's. The paper's steepness is ``nu = 1000`` (:data:`PAPER_NU`).

The defence sees the queried images (``f_hat(x)``), so it is an
:class:`~stealkit.oracle.local.InputAwareDefence`: ``LocalOracle`` and the audit serve it; a ``stealkit serve`` keys
file cannot name it (it needs a network trained on the owner's data; :func:`stealkit.serve.defences.parse_defence`
refuses it with one line).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stealkit.errors import InputError

#: the paper's steepness of the switch between f and f_hat
PAPER_NU = 1000.0
#: the default share of in-distribution validation inputs served f (the paper's sweep spans it)
DEFAULT_KEEP = 0.95
#: the spec names (``--defence am:keep=0.9``)
NAMES = ("am", "adaptive_misinformation")


@dataclass(frozen=True)
class MisinformationSettings:
    """``keep``: the share of in-distribution validation inputs whose score lies above ``tau`` (served ``f``);
    ``nu``: the switch's steepness; ``epochs``: the misinformation network's training epochs (its loss is near 0
    within a few epochs on digits: the network only has to avoid one class)."""

    keep: float = DEFAULT_KEEP
    nu: float = PAPER_NU
    epochs: int = 10

    def __post_init__(self) -> None:
        if not (isinstance(self.keep, int | float) and 0.0 < self.keep < 1.0):
            raise InputError(f"am keep must be a share strictly between 0 and 1 (e.g. 0.95), got {self.keep!r}")
        if not (isinstance(self.nu, int | float) and math.isfinite(self.nu) and 0.0 < self.nu <= 1e6):
            raise InputError(f"am nu must be a steepness in (0, 1e6] (the paper's is 1000), got {self.nu!r}")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or not 1 <= self.epochs <= 1000:
            raise InputError(f"am epochs must be an integer in [1, 1000], got {self.epochs!r}")


def is_am_spec(spec: Any) -> bool:
    """Whether ``spec`` (a defence spec string or table) names Adaptive Misinformation."""
    if isinstance(spec, str):
        name = spec.partition(":")[0]
    elif isinstance(spec, Mapping):
        name = str(spec.get("name", ""))
    else:
        return False
    return name.strip().lower() in NAMES


def parse_am(spec: str) -> MisinformationSettings:
    """``"am"``, ``"am:keep=0.9"``, ``"am:keep=0.9,nu=1000,epochs=20"`` -> its settings (one line on a bad one)."""
    from stealkit.settings import parse_value

    name, _, rest = spec.partition(":")
    if name.strip().lower() not in NAMES:
        raise InputError(f"{spec!r} is not an adaptive misinformation spec (am:keep=0.95,nu=1000)")
    kwargs: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise InputError(f"defence option {part!r} in {spec!r} is not KEY=VALUE")
        key = key.strip()
        if key not in ("keep", "nu", "epochs"):
            raise InputError(f"unknown option {key!r} of defence am; it takes keep, nu and epochs")
        kwargs[key] = parse_value(value.strip())
    return MisinformationSettings(**kwargs)


def misinformation_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The misinformation network's loss, ``mean(-log(1 - softmax(logits)_y))``, computed stably as
    ``logsumexp(logits) - logsumexp(logits without the class y)``."""
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, target.long().view(-1, 1), True)
    others = logits.masked_fill(mask, float("-inf"))
    return (torch.logsumexp(logits, dim=1) - torch.logsumexp(others, dim=1)).mean()


def fresh_copy(model: nn.Module, seed: int) -> nn.Module:
    """A network of ``model``'s architecture with fresh weights, seeded (``model`` and the global generator are
    left as they were): a deep copy whose layers are re-initialised by their own ``reset_parameters``."""
    try:
        twin = copy.deepcopy(model).cpu()
    except Exception as exc:  # a wrapped ONNX session or a scripted module may not copy
        raise InputError(f"adaptive misinformation needs a PyTorch model it can copy and retrain: {exc}") from None
    reset = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in twin.modules():
            if callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()  # type: ignore[operator]
                reset += 1
    if not reset or not any(p.requires_grad for p in twin.parameters()):
        raise InputError("adaptive misinformation needs a PyTorch model with trainable layers (an ONNX file has "
                         "none): train the misinformation network yourself and pass it to AdaptiveMisinformation")
    return twin


def train_misinformation(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int = 10,
                         batch_size: int = 64, lr: float | None = None, seed: int = 0,
                         device: str | torch.device = "cpu") -> nn.Module:
    """``f_hat``: a fresh copy of ``model``'s architecture trained on ``(x, y)`` (the defender's training data) with
    :func:`misinformation_loss` (Adam, cosine schedule, seeded); returned in eval mode on ``device``."""
    from stealkit.train import TrainConfig, fit

    net = fresh_copy(model, seed)
    fit(net, x, y, TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, weight_decay=0.0),
        loss_fn=misinformation_loss, desc="misinformation network", device=device)
    return net.to(device).eval()


def max_softmax(logits: torch.Tensor) -> torch.Tensor:
    """The out-of-distribution score ``S(x)``: the largest softmax probability (float64)."""
    return torch.softmax(logits.double(), dim=1).max(dim=1).values


def pick_threshold(scores: torch.Tensor, keep: float) -> float:
    """``tau`` such that a share ``keep`` of ``scores`` lies above it: midway between the highest score of the
    ``round((1 - keep) * n)`` lowest (defended) and the next (kept)."""
    s = torch.sort(scores.double().flatten()).values
    n = s.numel()
    if n < 2:
        raise InputError("picking tau needs at least 2 validation inputs")
    k = min(max(round((1.0 - keep) * n), 1), n - 1)
    return float((s[k - 1] + s[k]) / 2)


def _forward(net: nn.Module, x: torch.Tensor, device: torch.device, chunk: int = 1024) -> torch.Tensor:
    outs = []
    with torch.inference_mode():
        for i in range(0, x.shape[0], chunk):
            outs.append(net(x[i : i + chunk].to(device)).float().cpu())
    return torch.cat(outs) if outs else torch.zeros(0)


@dataclass
class AdaptiveMisinformation:
    """The defence (an :class:`~stealkit.oracle.local.InputAwareDefence`): ``misinformation`` is ``f_hat`` (a
    network returning logits on images in [0, 1]), ``tau`` and ``nu`` the switch; ``record``: how it was made
    (settings, the validation share kept, training time), what results store."""

    misinformation: nn.Module
    tau: float
    nu: float = PAPER_NU
    record: dict[str, Any] = field(default_factory=dict)
    needs_input: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tau) and 0.0 <= self.tau <= 1.0):
            raise InputError(f"am tau must be a probability in [0, 1], got {self.tau!r}")
        self.misinformation.eval()
        self._device = next((t.device for t in (*self.misinformation.parameters(),
                                                *self.misinformation.buffers())), torch.device("cpu"))

    def __repr__(self) -> str:
        return f"AdaptiveMisinformation(tau={self.tau:.6g}, nu={self.nu:g})"

    def alpha(self, probs: torch.Tensor) -> torch.Tensor:
        """``a(x) = sigmoid(nu * (tau - S(x)))`` from the served model's probabilities (float64, one per row)."""
        score = probs.double().max(dim=1).values
        return torch.sigmoid(self.nu * (self.tau - score))

    def __call__(self, probs: torch.Tensor, logits: torch.Tensor, *, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != probs.shape[0]:
            raise InputError(f"adaptive misinformation got {x.shape[0]} images for {probs.shape[0]} answers")
        a = self.alpha(probs).unsqueeze(1)
        wrong = torch.softmax(_forward(self.misinformation, x, self._device).double(), dim=1)
        out = (1.0 - a) * probs.double().cpu() + a * wrong
        return out.to(dtype=probs.dtype, device=probs.device)


def fit_adaptive_misinformation(model: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor,
                                val_x: torch.Tensor, settings: MisinformationSettings | None = None, *,
                                seed: int = 0, device: str | torch.device = "cpu",
                                batch_size: int = 64) -> AdaptiveMisinformation:
    """The defence for ``model``: ``f_hat`` trained on the defender's ``(train_x, train_y)``, ``tau`` picked on the
    in-distribution validation images ``val_x`` (the share ``settings.keep`` scoring above it), the paper's
    ``nu``. Seeded and deterministic on one device; the model itself is not changed."""
    from stealkit.device import module_device

    settings = settings or MisinformationSettings()
    started = time.perf_counter()
    epochs = settings.epochs
    net = train_misinformation(model, train_x, train_y, epochs=epochs, batch_size=batch_size, seed=seed,
                               device=device)
    was_training = model.training
    model.eval()
    scores = max_softmax(_forward(model, val_x, module_device(model)))
    model.train(was_training)
    tau = pick_threshold(scores, settings.keep)
    wrong = torch.softmax(_forward(net, train_x, torch.device(device)), dim=1)
    record = {"keep": settings.keep, "nu": settings.nu, "epochs": epochs, "seed": seed, "tau": tau,
              "validation_kept": round(float((scores > tau).double().mean()), 4), "validation_n": int(scores.numel()),
              "misinformation_true_class_prob": round(float(wrong.gather(1, train_y.long().view(-1, 1)).mean()), 4),
              "train_n": int(train_x.shape[0]), "seconds": round(time.perf_counter() - started, 2),
              "ood_score": "maximum softmax probability of the model as trained (no Outlier Exposure)"}
    return AdaptiveMisinformation(net, tau, settings.nu, record)
