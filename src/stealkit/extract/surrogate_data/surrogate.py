"""Surrogate-data model extraction (Truong et al., *Data-Free Model Extraction*, CVPR 2021, appendix A).

The attacker queries the victim with a surrogate data set and distils the answers into a student:

* **Loss (A.1).** With probability or logit access the student minimises ``tau**2 * KL(V_tau || S_tau)``,
  where ``V_tau = softmax(v / tau)`` and ``S_tau = softmax(s / tau)`` (Hinton et al.'s temperature scaling).
  From probabilities ``p = softmax(v)`` the attacker gets ``V_tau = softmax(log p / tau)`` exactly, so no
  logits are needed; zeros (top-k answers, underflow) stay zeros. With label-only access the loss is cross
  entropy; ``l1`` matches the student's logits to the victim's (recovered, appendix B, for probabilities).
* **Optimiser and schedules (A.2).** SGD, maximum learning rate 0.1, and either the cyclic schedule (Smith's
  one-cycle) or step decay (x0.2 at 30%, 60% and 80% of training).
* **Distinct-sample cap (A.2).** At most ``max_distinct`` different images are ever queried (the paper caps at
  50,000); each is queried once, when first needed, and its answer is cached
  (:class:`~stealkit.extract.answer_cache.AnswerCache`), so every later epoch re-uses it without spending a
  query. The ledger count therefore equals the number of distinct images answered.
* **Query strategy.** ``random`` queries a seeded shuffle of the pool; ``knockoff`` picks images with the
  adaptive policy of Knockoff Nets (Orekondy et al., CVPR 2019; :mod:`stealkit.extract.surrogate_data.knockoff`).
* **Active selection** (``select``; ActiveThief, Pal et al. AAAI 2020): rounds of query -> train -> select by
  the substitute's uncertainty or by k-center coverage (:mod:`stealkit.extract.surrogate_data.active`), resumable.
* **Semi-supervised training** (``ssl="fixmatch"``; Jagielski et al. USENIX Security 2020, Sec. 5.2; FixMatch,
  Sohn et al. 2020): the student also learns from the pool images never queried
  (:mod:`stealkit.extract.surrogate_data.semi_supervised`).
* **Hooks** for research variants, from the caller's own code rather than a config field: ``make_student`` (e.g. a
  pretrained initialisation), ``loss_wrapper`` (wraps the loss on each batch of answered images: MixUp, a weight
  average, soft teacher targets or a self-training term on the pool) and ``first_round`` (chooses the first
  queries: a cold start such as TypiClust). Variants measured and not adopted were removed after commit
  ``9158eae`` (``git show 9158eae:src/stealkit/extract/surrogate_data/...``).

Surrogate sources (the victim's attacker pool, a skewed subset, another data set adapted by resizing and
channel repetition, natural patches, Gaussian noise) come from :func:`stealkit.data.load_query_source`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from stealkit import fmt
from stealkit.errors import InputError
from stealkit.extract.answer_cache import AnswerCache, distinct_cap
from stealkit.extract.common import ExtractionResult, curve_point
from stealkit.extract.logit_recovery import recover_logits
from stealkit.extract.losses import LossFn
from stealkit.extract.surrogate_data.active import SELECTIONS, ActiveConfig, Select, active_rounds
from stealkit.extract.surrogate_data.knockoff import KnockoffConfig, knockoff_select
from stealkit.extract.surrogate_data.presets import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    resolve_preset,
)
from stealkit.extract.surrogate_data.presets import DEFAULT_PRESET as DEFAULT_PRESET  # re-exported
from stealkit.extract.surrogate_data.presets import PRESETS as PRESETS
from stealkit.extract.surrogate_data.semi_supervised import SSL, FixMatchConfig, FixMatchLoss
from stealkit.extract.targets import victim_log_probs
from stealkit.grad_clip import check_grad_clip
from stealkit.metrics import Evaluator
from stealkit.oracle import Oracle, OutputMode
from stealkit.train import Batching, TrainConfig, check_batching, fit

log = logging.getLogger(__name__)

StudentLoss = Literal["auto", "kl", "ce", "l1"]
CycleSchedule = Literal["cyclic", "step", "constant"]
Strategy = Literal["random", "knockoff"]

_SCHEDULES: dict[str, str] = {"cyclic": "onecycle", "step": "step", "constant": "none"}
#: the peak learning rate of SGD when ``lr`` is not given (DFME A.2)
DEFAULT_LR = 0.1

FLIP_INVARIANT = ("fashion-mnist", "cifar10", "cifar100", "svhn-flip")  # data sets whose mirror images are valid

#: the loss on one batch of answered images, ``loss(model, x, answers, gen) -> scalar``: ``x`` the images (on the
#: device), ``answers`` their cached victim answers, ``gen`` the training loop's generator. ``loss_wrapper`` of
#: :func:`extract_surrogate` wraps it.
BatchLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]
#: ``first_round(pool, m)``: the indices of the ``m`` images of ``pool`` (the surrogate pool in the seed's shuffled
#: order) to query first, before any answer (a cold start)
FirstRound = Callable[[torch.Tensor, int], torch.Tensor]

#: settings removed after commit 9158eae (measured on the validation split and not adopted, docs/archive.md)
REMOVED_SETTINGS = ("augment", "ema", "mixup", "noisy_student", "pretrain", "pretraining", "cold_start",
                    "cold_start_size", "optimizer", "active.round_ssl", "active.fast_select", "active.factor",
                    "fixmatch.views", "fixmatch.sharpen")


# --------------------------------------------------------------------------------------------------------
# Losses (A.1)
# --------------------------------------------------------------------------------------------------------
def tau_kl(student_logits: torch.Tensor, victim_logp_tau: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """``tau**2 * KL(V_tau || S_tau)`` averaged over the batch (A.1); ``victim_logp_tau`` is ``log V_tau``.

    Its gradient with respect to the student's logits is ``tau * (S_tau - V_tau) / B``: the ``tau**2`` keeps
    the gradient's scale independent of the temperature (Hinton et al. 2015).
    """
    log_s = F.log_softmax(student_logits / tau, dim=1)
    v = victim_logp_tau.exp()
    terms = torch.where(v > 0, v * (victim_logp_tau - log_s), torch.zeros_like(v))
    return tau * tau * terms.sum(dim=1).mean()


def resolve_loss(loss: StudentLoss, mode: OutputMode | str) -> str:
    """``auto`` means cross entropy for labels and the tau-scaled KL otherwise; other choices are checked."""
    mode = OutputMode.parse(mode)
    if loss == "auto":
        return "ce" if mode is OutputMode.LABEL else "kl"
    if loss not in ("kl", "ce", "l1"):
        raise InputError(f"unknown student loss {loss!r}; expected auto, kl, ce or l1")
    if loss == "kl" and mode is OutputMode.LABEL:
        raise InputError("loss 'kl' needs a probs, topk or logits oracle; with labels use --loss ce")
    if loss == "l1" and mode in (OutputMode.LABEL, OutputMode.TOPK):
        raise InputError(f"loss 'l1' needs logits or full probabilities, not {mode.value}; use --loss kl or ce")
    return loss


def make_student_loss(loss: StudentLoss, mode: OutputMode | str, tau: float = 1.0,
                      label_smoothing: float = 0.0) -> LossFn:
    """The student's loss ``fn(student_logits, victim_answers)`` for an oracle in ``mode``. ``label_smoothing``
    applies to the cross entropy only (Szegedy et al., *Rethinking the Inception Architecture*, CVPR 2016,
    Sec. 7: the one-hot target mixed with the uniform distribution, weight ``label_smoothing``)."""
    mode = OutputMode.parse(mode)
    kind = resolve_loss(loss, mode)
    if kind == "ce":
        ls = label_smoothing
        if mode is OutputMode.LABEL:
            return lambda s, y: F.cross_entropy(s, y.long(), label_smoothing=ls)
        return lambda s, a: F.cross_entropy(s, a.argmax(dim=1), label_smoothing=ls)
    if kind == "l1":
        if mode is OutputMode.LOGITS:
            return lambda s, z: F.l1_loss(s, z.float())
        return lambda s, p: F.l1_loss(s, recover_logits(p.float()))
    return lambda s, a: tau_kl(s, victim_log_probs(a, mode, tau), tau)


# --------------------------------------------------------------------------------------------------------
# Configuration and the attack
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SurrogateConfig:
    """Settings of :func:`extract_surrogate`. The defaults are the plain attack of DFME appendix A at batch 64;
    :meth:`default` (or :func:`resolve_config`) gives the validated default of ``stealkit extract surrogate``.

    ``max_distinct``: cap on distinct images queried (``None``: the pool or the budget). ``loss``: ``auto``
    (KL for probs/topk/logits, CE for labels), ``kl``, ``ce`` or ``l1``. ``tau``: the temperature of A.1.
    ``schedule``: ``cyclic`` or ``step`` (A.2), or ``constant``, with maximum learning rate ``lr`` of SGD with
    Nesterov momentum (A.2; ``None``: ``DEFAULT_LR``, 0.1). ``label_smoothing``: with the cross-entropy loss
    (labels), the target mixed with the uniform distribution by this weight (Szegedy et al. 2016, Sec. 7; 0: off;
    no effect on ``kl``/``l1``), only when the distinct-sample cap gives at least ``label_smoothing_min_per_class``
    queries per class (0: always; the default preset uses 10, below which digits lost on validation).
    ``batching``: how every training on the answers (round substitutes, the student, the labelled side of
    FixMatch) cuts an epoch into batches: ``ragged`` (a last batch of what is left) or ``equal`` (as many
    batches, sizes within one of each other; :func:`stealkit.train.epoch_batches`).
    ``grad_clip``: every such training rescales each step's gradient to at most this norm (Pascanu et al. ICML
    2013 Sec. 3.2, :mod:`stealkit.grad_clip`; 0: off, bitwise the loop without it; costs no query).
    ``min_steps``: the student (not the round substitutes) trains at least this many optimiser steps: its
    epochs are raised to ``ceil(min_steps / batches per epoch)`` (:meth:`student_epochs`; 0: off, ``epochs``
    as given). ``eval_every``: score the student every so many epochs.
    ``strategy``: ``random`` (a seeded shuffle) or ``knockoff`` (Knockoff Nets' adaptive policy, ``knockoff``).
    ``select``: ``random`` (one shuffle) or an active strategy queried in rounds (``active``; ActiveThief).
    ``ssl``: ``fixmatch`` adds the consistency loss on the whole pool (``fixmatch``).
    """

    max_distinct: int | None = None
    loss: StudentLoss = "auto"
    tau: float = 1.0
    epochs: int = DEFAULT_EPOCHS
    min_steps: int = 0
    batch_size: int = DEFAULT_BATCH_SIZE
    batching: Batching = "ragged"
    grad_clip: float = 0.0
    lr: float | None = None
    schedule: CycleSchedule = "cyclic"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    strategy: Strategy = "random"
    knockoff: KnockoffConfig = field(default_factory=KnockoffConfig)
    label_smoothing: float = 0.0
    label_smoothing_min_per_class: int = 0
    select: Select = "random"
    active: ActiveConfig = field(default_factory=ActiveConfig)
    ssl: SSL = "none"
    fixmatch: FixMatchConfig = field(default_factory=FixMatchConfig)
    query_batch: int = 256
    eval_every: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_distinct is not None and self.max_distinct < 1:
            raise InputError(f"max_distinct must be a positive number of images, got {self.max_distinct}")
        if not (self.tau > 0 and math.isfinite(self.tau)):
            raise InputError(f"tau must be a positive number, got {self.tau}")
        if self.schedule not in _SCHEDULES:
            raise InputError(f"unknown schedule {self.schedule!r}; expected cyclic, step or constant")
        if self.strategy not in ("random", "knockoff"):
            raise InputError(f"unknown query strategy {self.strategy!r}; expected random or knockoff")
        if self.select not in SELECTIONS:
            raise InputError(f"unknown selection {self.select!r}; expected one of {', '.join(SELECTIONS)}")
        if self.select != "random" and self.strategy == "knockoff":
            raise InputError(f"selection {self.select!r} replaces the knockoff policy; use one or the other")
        if self.ssl not in ("none", "fixmatch"):
            raise InputError(f"unknown semi-supervised method {self.ssl!r}; expected none or fixmatch")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise InputError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.label_smoothing_min_per_class < 0:
            raise InputError("label_smoothing_min_per_class must be >= 0 (0: smooth at every budget), got "
                             f"{self.label_smoothing_min_per_class}")
        check_batching(self.batching)
        check_grad_clip(self.grad_clip)
        if self.loss not in ("auto", "kl", "ce", "l1"):
            raise InputError(f"unknown student loss {self.loss!r}; expected auto, kl, ce or l1")
        if self.epochs < 1 or self.batch_size < 1 or self.peak_lr <= 0 or self.query_batch < 1 or self.eval_every < 0:
            raise InputError("epochs, batch_size and query_batch must be >= 1, lr > 0, eval_every >= 0")
        if self.min_steps < 0:
            raise InputError(f"min_steps must be >= 0 optimiser steps (0: off), got {self.min_steps}")

    @classmethod
    def default(cls, answers: int, num_classes: int, *, mode: OutputMode | str, flip: bool = False,
                **fields: Any) -> SurrogateConfig:
        """The default of ``stealkit extract surrogate`` (``--preset auto``) for ``answers`` distinct images of
        ``num_classes`` classes answered in ``mode``; ``flip``: the pool is flip-invariant (``FLIP_INVARIANT``);
        ``fields`` as the command's flags give them (e.g. ``seed``, ``epochs``). See :func:`resolve_config`."""
        return resolve_config(DEFAULT_PRESET, answers, num_classes, mode=mode, flip=flip, **fields)[1]

    @property
    def peak_lr(self) -> float:
        """The (maximum) learning rate: ``lr``, or ``DEFAULT_LR``."""
        return self.lr if self.lr is not None else DEFAULT_LR

    def epoch_images(self, answers: int, pool_size: int) -> int:
        """How many answered images one epoch of the student visits: ``answers``, or with FixMatch the answered
        ones cycled until ``mu`` unlabelled draws per labelled one cover the pool (:func:`epoch_indices`)."""
        if self.ssl == "fixmatch" and answers:
            return epoch_indices(torch.arange(answers), pool_size, self.fixmatch).numel()
        return answers

    def student_epochs(self, answers: int, pool_size: int) -> int:
        """The student's epochs on ``answers`` answered images of a ``pool_size``-image pool: ``epochs``, raised
        so that it takes at least ``min_steps`` steps. An epoch has ``ceil(images / batch_size)`` batches (with
        either batching) of :meth:`epoch_images`."""
        if self.min_steps == 0 or answers == 0:
            return self.epochs
        batches = math.ceil(self.epoch_images(answers, pool_size) / self.batch_size)
        return max(self.epochs, math.ceil(self.min_steps / batches))

    def student_steps(self, answers: int, pool_size: int) -> int:
        """The optimiser steps the student takes on ``answers`` answered images of a ``pool_size``-image pool:
        :meth:`student_epochs` times the batches of an epoch (not counting the round substitutes)."""
        batches = math.ceil(self.epoch_images(answers, pool_size) / self.batch_size)
        return self.student_epochs(answers, pool_size) * batches

    def train_config(self) -> TrainConfig:
        return TrainConfig(epochs=self.epochs, batch_size=self.batch_size, optimizer="sgd", lr=self.peak_lr,
                           momentum=self.momentum, weight_decay=self.weight_decay,
                           schedule=_SCHEDULES[self.schedule], seed=self.seed,  # type: ignore[arg-type]
                           batching=self.batching, grad_clip=self.grad_clip)


def resolve_config(preset: str, answers: int, num_classes: int, *, mode: OutputMode | str, flip: bool = False,
                   settings: Mapping[str, Any] | None = None, **fields: Any) -> tuple[str, SurrogateConfig]:
    """The configuration ``stealkit extract surrogate --preset PRESET`` runs, and the name of what the preset
    resolved to: ``SurrogateConfig(**fields)``, then the preset for a budget of ``answers`` distinct images of
    ``num_classes`` classes answered in ``mode`` (:func:`~stealkit.extract.surrogate_data.presets.
    resolve_preset`), then ``settings`` (``--set`` and the explicit flags: they win; ``"active.initial"``-style
    keys reach a group), then FixMatch's flips where ``flip`` (the pool is flip-invariant) unless
    ``settings`` names ``fixmatch.flip``. The command and ``benchmarks/surrogate_extraction.py``'s default rows
    both call this; a removed setting (``REMOVED_SETTINGS``) is an error that says where to find it."""
    from stealkit.settings import apply_settings

    given = dict(settings or {})
    removed = [k for k in given if k in REMOVED_SETTINGS or k.split(".")[0] in REMOVED_SETTINGS]
    if removed:
        raise InputError(f"setting {removed[0]!r} was removed (measured on the validation split and not adopted, "
                         "docs/archive.md); its code is at commit 9158eae")
    resolved, chosen = resolve_preset(preset, answers, num_classes, mode=OutputMode.parse(mode).value)
    config = apply_settings(SurrogateConfig(**fields), {**chosen, **given}, who="surrogate")
    if "fixmatch.flip" not in given:  # mirror images only where the data set is flip-invariant
        config = replace(config, fixmatch=replace(config.fixmatch, flip=flip))
    return resolved, config


def epoch_indices(indices: torch.Tensor, pool_size: int, fm: FixMatchConfig) -> torch.Tensor:
    """The labelled indices an epoch visits under FixMatch: cycled until the ``mu`` unlabelled images drawn
    per labelled one cover the pool once (``fm.epoch == "pool"``, as FixMatch counts training by unlabelled
    data), or each once (``"labelled"``, the plain attack's epoch)."""
    if fm.epoch == "labelled" or indices.numel() == 0:
        return indices
    want = max(indices.numel(), math.ceil(pool_size / fm.mu))
    return indices.repeat(math.ceil(want / indices.numel()))[:want]


def train_student(
    student: nn.Module,
    cache: AnswerCache,
    indices: torch.Tensor,
    loss_fn: LossFn,
    config: SurrogateConfig,
    *,
    on_epoch: Callable[[int, nn.Module, dict[str, float]], None] | None = None,
    device: str | torch.device = "cpu",
    loss_wrapper: Callable[[BatchLoss], BatchLoss] | None = None,
) -> list[dict[str, float]]:
    """Train ``student`` on the images ``cache.x[indices]`` against their cached answers (queried when first
    needed). SGD with the A.2 schedule; returns one ``{"epoch", "loss", "lr"}`` per epoch. With ``ssl``
    ``fixmatch`` every step adds FixMatch's loss on images drawn from the whole pool ``cache.x``.
    ``loss_wrapper(answered)`` replaces the loss on each batch of answered images (:data:`BatchLoss`); if what it
    returns has a ``finish(model)`` method, it is called after the last epoch (e.g. a weight average copying
    itself into the student)."""
    tc = replace(config.train_config(), seed=config.seed)

    def answered(model: nn.Module, x: torch.Tensor, answers: torch.Tensor, _: torch.Generator) -> torch.Tensor:
        return loss_fn(model(x), answers)

    answered_loss = answered if loss_wrapper is None else loss_wrapper(answered)

    def labelled(model: nn.Module, idx: torch.Tensor, _: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        idx = idx.cpu()
        answers = cache.get(idx).to(device)  # queried the first time an image is needed, then reused
        return answered_loss(model, cache.x[idx].to(device), answers, gen)

    batch_loss: Callable[..., torch.Tensor] = labelled
    if config.ssl == "fixmatch":
        indices = epoch_indices(indices, len(cache), config.fixmatch)
        steps = math.ceil(indices.numel() / tc.batch_size) * tc.epochs
        batch_loss = FixMatchLoss(labelled, cache.x, config.fixmatch, device, total_steps=steps,
                                  answers=lambda idx: cache.answers[idx.cpu()],  # type: ignore[index]
                                  num_classes=cache.oracle.num_classes)
    finish = getattr(answered_loss, "finish", None)

    def epoch_done(epoch: int, rec: dict[str, float]) -> None:
        if epoch == tc.epochs:
            if isinstance(batch_loss, FixMatchLoss):
                batch_loss.finish(student)  # FixMatch's mean teacher becomes the student
            if finish is not None:
                finish(student)
        if on_epoch is not None:
            on_epoch(epoch, student, rec)
            student.train()

    # the loop's "inputs" are the pool indices: images and answers are looked up per batch
    return fit(student, indices, indices, tc, batch_loss=batch_loss, on_epoch=epoch_done, device=device,
               desc=f"student ({indices.numel()} images)")


def extract_surrogate(
    oracle: Oracle,
    pool: torch.Tensor,
    *,
    make_student: Callable[[], nn.Module],
    config: SurrogateConfig,
    evaluator: Evaluator | None = None,
    pool_labels: torch.Tensor | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    on_epoch: Callable[[int, nn.Module, dict[str, float]], None] | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    device: str | torch.device = "cpu",
    loss_wrapper: Callable[[BatchLoss], BatchLoss] | None = None,
    first_round: FirstRound | None = None,
) -> ExtractionResult:
    """Steal ``oracle`` by querying images of the surrogate ``pool`` ``[N, C, H, W]`` and distilling them.

    The pool is shuffled with ``config.seed`` and cut to the distinct-sample cap (the pool size, the cap and
    the budget left, whichever is least); ``random`` then queries all of it while the student trains (epoch 1
    answers, later epochs re-use), ``knockoff`` chooses which images to query with the adaptive policy
    (``pool_labels`` name its actions; without them the pool is clustered). The ledger's count is the
    number of distinct images answered. ``on_epoch(epoch, student, record)`` sees training as it goes.
    An active ``select`` queries in rounds (:func:`stealkit.extract.surrogate_data.active.active_rounds`); with
    ``checkpoint_dir`` the rounds are saved there and ``resume`` continues them without paying twice. When the
    budget answers the whole pool there is nothing to select: the pool is queried as ``random`` does, without
    rounds (``extra["select_skipped"]``).

    Hooks (for variants that are not part of the package; each is ``None`` by default, the attack as above):
    ``make_student`` builds every student and round substitute (e.g. from pretrained weights);
    ``loss_wrapper`` wraps the loss on each batch of answered images of every student and round substitute
    (:func:`train_student`; e.g. MixUp, a weight average with ``finish``, soft teacher targets or a self-training
    term on the pool the caller holds); ``first_round(pool, m)`` chooses the first ``m`` queries among the
    shuffled pool (:data:`FirstRound`; a cold start): with it the attack runs in rounds (its first round is the
    whole budget with ``select="random"``, the seed set of an active ``select``). ``first_round`` cannot be
    combined with ``strategy="knockoff"``, whose policy chooses every query. The ledger counts every query either
    way.
    """
    if pool.dim() != len(oracle.input_shape) + 1 or tuple(pool.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"the surrogate pool must have shape [N, {', '.join(map(str, oracle.input_shape))}], "
                         f"got {list(pool.shape)}; adapt it with stealkit.data.adapt_images")
    if pool.shape[0] == 0:
        raise InputError("the surrogate pool is empty")
    if first_round is not None and config.strategy == "knockoff":
        raise InputError("first_round chooses the first queries; the knockoff policy chooses all of them: use one "
                         "or the other")
    gen = torch.Generator().manual_seed(config.seed)
    order = torch.randperm(pool.shape[0], generator=gen)
    queries_before = oracle.ledger.total
    t_start = time.perf_counter()
    n = distinct_cap(oracle, pool.shape[0], config.max_distinct)
    if n == 0:
        raise InputError("the oracle's budget allows no query at all; raise --budget")
    extra: dict[str, Any] = {}
    whole_pool = config.select != "random" and n >= pool.shape[0] and first_round is None
    if whole_pool:  # the budget answers the whole pool: nothing to choose, so no rounds (the plain path's images)
        if resume:
            raise InputError("nothing to resume: the budget answers the whole pool, so this run queries it in one "
                             "pass without active rounds or a checkpoint; run it again without --resume")
        config = replace(config, select="random")
        extra["select_skipped"] = "the budget answers the whole pool"
    if config.min_steps:  # the student's epochs for this budget (the round substitutes keep theirs)
        epochs = config.student_epochs(n, pool.shape[0])
        every = config.eval_every * math.ceil(epochs / config.epochs)  # as many curve points as without the floor
        config = replace(config, epochs=epochs, eval_every=every)
        extra["epochs"], extra["eval_every"] = epochs, every
    if config.label_smoothing and (n < config.label_smoothing_min_per_class * oracle.num_classes
                                   or resolve_loss(config.loss, oracle.mode) != "ce"):
        config = replace(config, label_smoothing=0.0)  # too few answers per class, or no cross entropy
    loss_fn = make_student_loss(config.loss, oracle.mode, config.tau, config.label_smoothing)
    if config.strategy == "knockoff":
        labels = pool_labels[order] if pool_labels is not None else None
        cache = AnswerCache(oracle, pool[order], query_batch=config.query_batch)
        indices, trace = knockoff_select(cache, n, make_student=make_student, loss_fn=loss_fn,
                                         config=config.knockoff, actions=labels, seed=config.seed, device=device)
        extra["knockoff"] = trace
    elif config.select == "random" and first_round is None and (checkpoint_dir is None or whole_pool):
        # the first n of the shuffle, queried while the student trains; the rest is FixMatch's unlabelled pool
        cache = AnswerCache(oracle, pool[order], query_batch=config.query_batch)
        indices = torch.arange(n)
    else:
        cache, indices, active = _active(oracle, pool[order], n, loss_fn, make_student, config, evaluator,
                                         checkpoint_dir, resume, device, first_round, loss_wrapper)
        extra.update(active)
    curve: list[dict[str, Any]] = []

    def epoch_hook(epoch: int, student: nn.Module, rec: dict[str, float]) -> None:
        last = epoch == config.epochs
        if evaluator is not None and (last or (config.eval_every and epoch % config.eval_every == 0)):
            point = curve_point(oracle, evaluator, student, epoch=epoch, n_distinct=cache.n_answered,
                                loss=rec["loss"])
            curve.append(point)
            if on_point is not None:
                on_point(point)
            log.info("epoch %d: accuracy %s, fidelity %s (%s queries)", epoch, fmt.figure(point["accuracy"]),
                     fmt.figure(point["fidelity"]), fmt.queries(point["queries"]))
        if on_epoch is not None:
            on_epoch(epoch, student, rec)

    student = make_student()
    history = train_student(student, cache, indices, loss_fn, config, on_epoch=epoch_hook, device=device,
                            loss_wrapper=loss_wrapper)
    final = curve[-1] if curve else {"accuracy": None, "fidelity": None}
    return ExtractionResult(
        method="surrogate" if config.strategy == "random" else "surrogate-knockoff",
        student=student,
        queries=oracle.ledger.as_dict(),
        accuracy=final["accuracy"],
        fidelity=final["fidelity"],
        victim_accuracy=evaluator.victim_accuracy if evaluator is not None else None,
        curve=curve,
        extra={"mode": oracle.mode.value, "loss": resolve_loss(config.loss, oracle.mode), "tau": config.tau,
               "schedule": config.schedule, "lr": config.peak_lr, "strategy": config.strategy,
               "select": config.select, "ssl": config.ssl, "label_smoothing": config.label_smoothing,
               "batching": config.batching, "grad_clip": config.grad_clip,
               "steps": config.student_steps(indices.numel(), len(cache)),
               "hooks": [name for name, hook in (("loss_wrapper", loss_wrapper), ("first_round", first_round))
                         if hook is not None],
               "seconds": round(time.perf_counter() - t_start, 2), "n_distinct": cache.n_answered,
               "queries_spent": oracle.ledger.total - queries_before, "cache_hits": cache.hits,
               "final_train_loss": history[-1]["loss"], **extra},
    )


def _active(oracle: Oracle, pool: torch.Tensor, n: int, loss_fn: LossFn, make_student: Callable[[], nn.Module],
            config: SurrogateConfig, evaluator: Evaluator | None, checkpoint_dir: Path | None, resume: bool,
            device: str | torch.device, first_round: FirstRound | None,
            loss_wrapper: Callable[[BatchLoss], BatchLoss] | None,
            ) -> tuple[AnswerCache, torch.Tensor, dict[str, Any]]:
    """Query ``n`` images of ``pool`` in active rounds; each round's substitute is scored into the trace.
    ``first_round(pool, m)`` chooses the first round's images (``None``: random, or with ``select="random"`` the
    plain path's first ``n``)."""
    from stealkit.extract.journal import JournalOracle

    answering: Oracle = JournalOracle(oracle) if checkpoint_dir is not None else oracle  # type: ignore[assignment]
    cache = AnswerCache(answering, pool, query_batch=config.query_batch)
    scores: list[dict[str, Any]] = []

    def train(idx: torch.Tensor, epochs: int) -> nn.Module:
        student = make_student()
        train_student(student, cache, idx, loss_fn, replace(config, epochs=epochs, ssl="none"), device=device,
                      loss_wrapper=loss_wrapper)
        return student

    def on_round(student: nn.Module, rec: dict[str, Any]) -> None:
        if evaluator is not None:
            scores.append({**rec, "queries": rec["answered"], **evaluator(student)})

    def first(m: int) -> torch.Tensor:
        assert first_round is not None
        picked = torch.as_tensor(first_round(cache.x, m), dtype=torch.long).flatten()
        if picked.numel() != m or picked.unique().numel() != m or int(picked.min()) < 0 or int(picked.max()) >= len(cache):
            raise InputError(f"first_round must return {m} distinct indices into the pool of {len(cache)} images")
        return picked

    identity: dict[str, Any] = {"lr": config.peak_lr, "first_round": first_round is not None}
    if first_round is not None:
        pick: Callable[[int], torch.Tensor] | None = first
    elif config.select == "random":  # checkpointed without selection: the same images as the plain path
        pick = torch.arange
    else:
        pick = None
    indices, trace = active_rounds(cache, n, strategy=config.select, config=config.active, train=train,
                                   seed=config.seed, on_round=on_round, checkpoint_dir=checkpoint_dir,
                                   resume=resume, device=device, first=pick, identity=identity)
    trace["round_scores"] = scores
    return cache, indices, {"active": trace}
