"""Evaluation: accuracy on labelled data and fidelity (top-1 agreement) with the victim.

Inputs follow the model: each batch goes to the device of the model's parameters (wherever the caller keeps
the data), and the results come back on the CPU, where the labels they are compared with live.
"""

from __future__ import annotations

import torch
from torch import nn

from stealkit.chunking import DEFAULT_CHUNK, MIN_CPU_CHUNK, forward_chunk
from stealkit.device import module_device


def predict_logits(model: nn.Module, x: torch.Tensor, *, batch_size: int | None = None,
                   device: str | torch.device | None = None) -> torch.Tensor:
    """Logits of ``model`` on ``x`` in eval mode, in chunks, without gradients, on the CPU.

    Each chunk runs on the model's own device; ``device`` is used only for a model without parameters. The
    chunk (``batch_size``) defaults to the device's (:func:`stealkit.chunking.forward_chunk`)."""
    device = module_device(model, default=str(device or "cpu"))
    was_training = model.training
    model.eval()
    if batch_size is None:
        batch_size = forward_chunk(model, tuple(x.shape[1:]), device) if x.shape[0] > MIN_CPU_CHUNK else DEFAULT_CHUNK
    outs = []
    with torch.inference_mode():
        for i in range(0, x.shape[0], batch_size):
            outs.append(model(x[i : i + batch_size].to(device)).float().cpu())
    if was_training:
        model.train()
    return torch.cat(outs) if outs else torch.empty(0)


def predict_labels(model: nn.Module, x: torch.Tensor, *, batch_size: int | None = None,
                   device: str | torch.device | None = None) -> torch.Tensor:
    return predict_logits(model, x, batch_size=batch_size, device=device).argmax(1)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, device: str | torch.device | None = None) -> float:
    """Fraction of ``x`` that ``model`` labels as ``y``."""
    return agreement(predict_labels(model, x, device=device), y)


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of positions where two label vectors agree (fidelity when one is the victim's)."""
    if a.numel() == 0:
        return float("nan")
    return float((a.long().cpu() == b.long().cpu()).float().mean())


#: equal-width bins of :func:`expected_calibration_error` (Guo et al. 2017's choice)
ECE_BINS = 15


def expected_calibration_error(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    """Expected calibration error (Guo, Pleiss, Sun, Weinberger, "On calibration of modern neural networks",
    ICML 2017, Sec. 2, Eq. 3): ``sum_b |B_b| / n * |acc(B_b) - conf(B_b)|`` over ``bins`` equal-width bins of
    the confidence, bin ``b`` holding confidences in ``(b / bins, (b + 1) / bins]`` (the first also holds 0).
    ``confidence [n]``: the confidence served with each top-1 answer; ``correct [n]``: whether that answer is
    right."""
    conf = confidence.detach().double().reshape(-1).cpu()
    ok = correct.detach().double().reshape(-1).cpu()
    if conf.numel() != ok.numel() or conf.numel() == 0:
        raise ValueError(f"confidence and correct need the same non-zero length, got {conf.numel()} and {ok.numel()}")
    idx = (torch.ceil(conf * bins) - 1).clamp(0, bins - 1).long()
    gap = torch.zeros(bins, dtype=torch.float64).index_add_(0, idx, ok - conf)
    return float(gap.abs().sum() / conf.numel())


class Evaluator:
    """Scores a student on the test split: accuracy against the truth, fidelity against the victim.

    ``victim_labels`` are the victim's top-1 labels on the same test images, computed once by the
    experimenter (from the local model, unmetered) so evaluation never spends the attacker's budget. The
    student is scored on its own device (``device`` only matters for a student without parameters).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, victim_labels: torch.Tensor | None, *, device: str = "cpu"):
        self.x, self.y, self.victim_labels, self.device = x, y, victim_labels, device
        #: the labels of the last model scored, in test order: a benchmark keeps them as its per-image record
        self.last_pred: torch.Tensor | None = None

    @property
    def victim_accuracy(self) -> float | None:
        return None if self.victim_labels is None else agreement(self.victim_labels, self.y)

    def __call__(self, model: nn.Module) -> dict[str, float | None]:
        pred = predict_labels(model, self.x, device=self.device)
        self.last_pred = pred
        fid = None if self.victim_labels is None else agreement(pred, self.victim_labels)
        scores = {"accuracy": agreement(pred, self.y), "fidelity": fid}
        from stealkit.progress import measured

        measured(accuracy=scores["accuracy"])  # on the terminal's query bar, or the next status line
        return scores
