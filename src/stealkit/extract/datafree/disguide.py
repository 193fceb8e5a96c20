"""DisGUIDE's generator objective: disagreement of two clones plus class diversity (Rosenthal, Enouen, Pham &
Tan, "DisGUIDE: Disagreement-Guided Data-Free Model Extraction", AAAI 2023).

The paper's text is not in ``shared/papers``, so its section and equation numbers are not quoted here; the
formulas below are those of the authors' reference code (``disguide/train.py``: ``disguide_gen_loss`` and
``train_student_ensemble``), which this file follows term by term.

Algorithm box (one round, as stealkit runs it inside the shared data-free loop):

1. Generator step(s): draw ``z``, ``x = G(z)``; the clones ``C_1..C_E`` (``E >= 2``, different initialisations)
   give softmax vectors ``p_e = softmax(C_e(x))``. The generator minimises (disagreement loss, then class-diversity loss
   weighted by ``lambda_div``)

       L_G = - mean_{i,k} std_e(p_e(x_i)_k)  +  lambda_div * sum_k pbar_k log pbar_k,
       pbar = mean_{i,e} p_e(x_i)

   i.e. it seeks inputs the clones disagree on (the victim's answer there is informative, and no gradient
   through the victim is needed, so it works with hard labels), while the batch's mean soft vote stays spread
   over the classes. No victim query is spent on this step.
2. Clone step(s): ``x = G(z)`` is queried once; every clone takes a cross-entropy step on the victim's labels
   (hard labels; soft targets with probabilities).
3. Experience replay: the answered batches are stored and each round the clones also train on
   batches drawn from the store, at no query cost (:mod:`stealkit.extract.datafree.replay`, with the hard-sample
   weighting of :mod:`stealkit.extract.datafree.cabage` as an option).

DFME and MAZE take the objective with ``objective="disagreement"`` (:class:`Committee`): their generator then
spends no query, so an iteration costs only the clone steps' queries. CoDFe does not take the second clone
(it hurt CoDFe on the validation split: 0.873 against 0.889 at 25k; docs/archive.md, "Data-free extraction"); it uses :func:`sample_disagreement`'s one-clone
hardness for CaBaGE-style filtering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.extract.datafree.attack import DataFreeAttack
from stealkit.extract.datafree.selection import MakeSelector, Selector, StudentSelector


def ensemble_probs(logits: list[torch.Tensor]) -> torch.Tensor:
    """``[B, E, K]`` softmax vectors of ``E`` clones' logits ``[B, K]`` each."""
    return torch.stack([F.softmax(lg, dim=1) for lg in logits], dim=1)


def disagreement_loss(probs: torch.Tensor) -> torch.Tensor:
    """Disagreement loss: ``-mean_{i,k} std_e p_e(x_i)_k`` over ``probs`` of shape ``[B, E, K]`` (``E >= 2``)."""
    if probs.shape[1] < 2:
        raise ValueError("the disagreement loss needs at least two clones")
    return -_std(probs).mean()


def _std(probs: torch.Tensor) -> torch.Tensor:
    """The clones' standard deviation ``[B, K]``, kept differentiable where the clones agree exactly (the
    square root's gradient at zero would be infinite, and turn the generator's weights into NaN)."""
    return (probs.var(dim=1) + 1e-12).sqrt()


def class_diversity_loss(probs: torch.Tensor) -> torch.Tensor:
    """Class-diversity loss: ``sum_k pbar_k log pbar_k`` (negative entropy of the batch's mean soft vote), ``probs``
    ``[B, E, K]`` or ``[B, K]``; smallest when the batch covers every class equally."""
    pbar = probs.reshape(-1, probs.shape[-1]).mean(dim=0) + 1e-6
    return (pbar * pbar.log()).sum()


def sample_disagreement(probs: torch.Tensor) -> torch.Tensor:
    """Per-sample disagreement ``[B]``: mean over classes of the clones' std (the same quantity, unreduced);
    with one clone, the entropy of its prediction stands in (how unsure the clone is)."""
    if probs.shape[1] < 2:
        p = probs[:, 0].clamp_min(1e-12)
        return -(p * p.log()).sum(dim=1)
    return _std(probs).mean(dim=1)


def check_disguide(who: str, config: Any) -> None:
    """The settings of the disagreement objective that DFME and MAZE share."""
    from stealkit.errors import InputError

    if config.objective not in ("victim", "disagreement"):
        raise InputError(f"{who} objective must be 'victim' or 'disagreement', got {config.objective!r}")
    if config.objective == "disagreement" and config.students < 2:
        raise InputError(f"{who}: the disagreement objective needs students >= 2")
    if not 0 <= config.holdout < 1 or config.diversity < 0 or config.holdout_capacity < 1:
        raise InputError(f"{who}: holdout must be in [0, 1), diversity >= 0 and holdout_capacity >= 1")


class Committee:
    """The clones DisGUIDE trains: the attack's own student plus ``size - 1`` re-initialised copies (the
    student factory seeds itself, so each copy is re-initialised from its own seed), with their optimisers
    named ``student1``, ``student2``, ..."""

    def __init__(self, student: nn.Module, make_student: Callable[[], nn.Module], size: int, seed: int,
                 make_optimizer: Callable[[nn.Module], torch.optim.Optimizer], device: str) -> None:
        self.clones = [student]
        for i in range(1, size):
            clone = make_student()
            torch.manual_seed(seed + 1000 + i)
            for mod in clone.modules():
                if hasattr(mod, "reset_parameters"):
                    mod.reset_parameters()
            self.clones.append(clone.to(device).train())
        self.optimizers = {f"student{i}": make_optimizer(c) for i, c in enumerate(self.clones) if i > 0}

    def named(self) -> dict[str, nn.Module]:
        return {"student" if i == 0 else f"student{i}": c for i, c in enumerate(self.clones)}

    def generator_loss(self, x: torch.Tensor, diversity: float) -> torch.Tensor:
        """The generator's loss on ``x = G(z)``: disagreement plus ``diversity`` times the class-diversity term."""
        probs = ensemble_probs([c(x) for c in self.clones])
        loss = disagreement_loss(probs)
        return loss + diversity * class_diversity_loss(probs) if diversity > 0 else loss


class CommitteeAttack(DataFreeAttack):
    """What DFME and MAZE share with the disagreement objective: a :class:`Committee` (``self.committee``),
    an optional :class:`~stealkit.extract.datafree.selection.Selector` (``self.selector``), and the checkpoint,
    candidate and reported-student plumbing for both."""

    committee: Committee
    selector: Selector | None = None

    def held_out_selector(self, snapshot: nn.Module, make_selector: MakeSelector | None, capacity: int) -> Selector:
        """The caller's selector around ``snapshot``, or the built-in one: the most recent ``capacity`` held-out
        rows, a candidate at least as good replaces the snapshot."""
        if make_selector is not None:
            return make_selector(snapshot)
        return StudentSelector(snapshot, capacity, self.input_shape, self.num_classes, self.device, keep="recent")

    def hold_out(self, x: torch.Tensor, probs: torch.Tensor, share: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Give the first ``share`` of an answered batch to the selector; return the rest to train on."""
        if self.selector is None:
            return x, probs
        cut = x.shape[0] - int(x.shape[0] * (1 - share))
        self.selector.add(x[:cut], probs[:cut])
        return x[cut:], probs[cut:]

    def generator_steps(self, steps: int, batch: int, nz: int, diversity: float) -> list[float]:
        """``steps`` generator updates on the committee's disagreement (no victim query); their losses."""
        losses = []
        for _ in range(steps):
            loss = self.committee.generator_loss(self.generator(self.noise(batch, nz)), diversity)
            self.optimizers["generator"].zero_grad(set_to_none=True)
            loss.backward()
            self.optimizers["generator"].step()
            losses.append(float(loss.detach()))
        return losses

    def select(self, out: dict[str, float]) -> dict[str, float]:
        """After an iteration: let the selector choose among the clones; ``out`` gains its agreement."""
        if self.selector is not None:
            self.selector.consider(self.candidates())
            out["selected_agreement"] = self.selector.score
        return out

    def modules(self) -> dict[str, nn.Module]:
        selected = {"selected": self.selector.snapshot} if self.selector is not None else {}
        return {**self.committee.named(), "generator": self.generator, **selected}

    def candidates(self) -> dict[str, nn.Module]:
        return self.committee.named()

    def reported(self) -> nn.Module:
        return self.selector.snapshot if self.selector is not None and self.selector.source else self.student

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return self.selector.tensors() if self.selector is not None else {}

    def extra_scalars(self) -> dict[str, Any]:
        return {"selector": self.selector.scalars()} if self.selector is not None else {}

    def load_extra(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        if self.selector is not None and "selector" in scalars:
            self.selector.load(tensors, scalars["selector"])
