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
   batches drawn from the store, at no query cost (:mod:`stealkit.extract.replay`, with the hard-sample
   weighting of :mod:`stealkit.extract.cabage` as an option).

In stealkit the terms are weights of CoDFe's generator loss (:mod:`stealkit.extract.codfe`:
``disagreement``, ``diversity``, ``students``), so DisGUIDE's objective can run alone (``confidence=0``) or
together with CoDFe's confidence loss (Eq. 2 there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
