"""The adaptive sampling policy of Knockoff Nets (Orekondy, Schiele & Fritz, CVPR 2019, Section 4.1.2).

The surrogate pool is split into *actions* (its own class labels, as in the paper; or k-means clusters when
the pool has none, e.g. Gaussian noise). A gradient bandit (Sutton & Barto, Sec. 2.8) keeps a preference
``H_a`` per action and samples actions from ``pi = softmax(H)``. Each step draws ``step_batch`` actions, takes
one not-yet-queried image of each, queries them, and rewards the choice with the mean of the normalised
rewards (Orekondy et al., eq. 2-4):

* ``cert`` -- certainty: the margin between the victim's two most probable classes;
* ``div``  -- diversity: ``sum_k max(0, y_k - mean_k)`` against the answers of the last ``div_window`` steps;
* ``loss`` -- the online student's cross entropy against the victim's answer, before it trains on it.

Each reward is standardised with its running mean and variance; the preferences move by
``alpha * (r - r_bar) * (1[a] - pi)`` with baseline ``r_bar`` the running mean reward. The online student
takes one SGD step on each new batch. Differences from ART's ``KnockoffNets(sampling_strategy="adaptive")``:
images are drawn without replacement (ART may pay twice for the same image), exhausted actions are masked
out, the student learns from probabilities when the oracle gives them (ART uses labels only), the coarse-to-
fine label hierarchy of the paper is flat (our pools have at most a few dozen classes), and all queries
are counted by the ledger.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.answer_cache import AnswerCache
from stealkit.extract.losses import LossFn
from stealkit.extract.targets import answer_probs
from stealkit.kmeans import kmeans
from stealkit.progress import progress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnockoffConfig:
    """Knockoff Nets' adaptive policy (see :mod:`stealkit.extract.surrogate_data.knockoff`).

    ``step_batch`` images are queried per policy step; ``rewards`` any of ``cert``, ``div``, ``loss``;
    ``div_window`` steps of answers form the diversity reward's running mean; ``alpha`` is the gradient-bandit
    step; the online student takes one SGD step of learning rate ``online_lr`` per policy step.
    """

    step_batch: int = 16
    rewards: tuple[str, ...] = ("cert", "div", "loss")
    div_window: int = 25
    alpha: float = 0.1
    online_lr: float = 0.02

    def __post_init__(self) -> None:
        bad = [r for r in self.rewards if r not in ("cert", "div", "loss")]
        if bad or not self.rewards:
            raise InputError(f"knockoff rewards must be a non-empty subset of cert, div, loss; got {self.rewards}")
        if self.step_batch < 1 or self.div_window < 1 or self.alpha <= 0 or self.online_lr <= 0:
            raise InputError("knockoff step_batch and div_window must be >= 1, alpha and online_lr > 0")


def kmeans_actions(x: torch.Tensor, k: int, *, seed: int = 0, iters: int = 20, size: int = 8) -> torch.Tensor:
    """Action labels ``[N]`` for an unlabelled pool: k-means on images downsampled to ``size`` x ``size``."""
    feats = F.adaptive_avg_pool2d(x.float(), size).flatten(1)
    return kmeans(feats, k, torch.Generator().manual_seed(seed), iters=iters, init="random")


class _RunningStat:
    """Running mean and variance (Welford) of a vector of rewards."""

    def __init__(self, dim: int) -> None:
        self.n, self.mean, self.m2 = 0, torch.zeros(dim), torch.zeros(dim)

    def update(self, value: torch.Tensor) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)

    def standardise(self, value: torch.Tensor) -> torch.Tensor:
        if self.n < 2:
            return value.clamp(0, 1)
        std = (self.m2 / (self.n - 1)).sqrt().clamp_min(1e-8)
        return (value - self.mean) / std


def knockoff_select(
    cache: AnswerCache,
    n: int,
    *,
    make_student: Callable[[], nn.Module],
    loss_fn: LossFn,
    config: KnockoffConfig,
    actions: torch.Tensor | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Query ``n`` distinct images of ``cache.x`` chosen by the adaptive policy; returns their indices and a
    trace (final policy, rewards per step). Answers stay in ``cache`` for the final student's training."""
    oracle = cache.oracle
    k = oracle.num_classes
    if actions is None:
        actions = kmeans_actions(cache.x, k, seed=seed)
    actions = actions.long().cpu()
    if actions.shape[0] != len(cache):
        raise InputError(f"{actions.shape[0]} action labels for a pool of {len(cache)} images")
    names, actions = torch.unique(actions, return_inverse=True)
    n_actions = names.numel()
    gen = torch.Generator().manual_seed(seed)
    buckets = [(actions == a).nonzero().flatten() for a in range(n_actions)]
    buckets = [b[torch.randperm(b.numel(), generator=gen)].tolist() for b in buckets]
    h = torch.zeros(n_actions)
    stats = _RunningStat(len(config.rewards))
    baseline, steps = 0.0, 0
    history: list[torch.Tensor] = []
    student = make_student().to(device).train()
    opt = torch.optim.SGD(student.parameters(), lr=config.online_lr, momentum=0.9)
    chosen: list[int] = []
    trace_rewards: list[float] = []
    bar = progress(total=n, desc="knockoff policy", unit="query")
    while len(chosen) < n:
        alive = torch.tensor([len(b) > 0 for b in buckets])
        if not bool(alive.any()):
            break
        pi = torch.softmax(h.masked_fill(~alive, -math.inf), dim=0)
        m = min(config.step_batch, n - len(chosen))
        acts = torch.multinomial(pi, m, replacement=True, generator=gen).tolist()
        picked, picked_acts = [], []
        for a in acts:
            if buckets[a]:
                picked.append(buckets[a].pop())
                picked_acts.append(a)
        idx = torch.tensor(picked, dtype=torch.long)
        answers = cache.get(idx)
        y = answer_probs(answers, oracle.mode, k)
        xb, ab = cache.x[idx].to(device), answers.to(device)
        logits = student(xb)
        with torch.no_grad():
            ce = -(y.to(device) * F.log_softmax(logits, dim=1)).sum(dim=1).cpu()
        loss = loss_fn(logits, ab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        top2 = y.topk(min(2, k), dim=1).values
        cert = top2[:, 0] - (top2[:, 1] if k > 1 else 0)
        recent = torch.cat(history[-config.div_window :]) if history else y
        div = (y - recent.mean(dim=0)).clamp_min(0).sum(dim=1)
        history.append(y)
        parts = {"cert": cert, "div": div, "loss": ce}
        for j, a in enumerate(picked_acts):
            raw = torch.stack([parts[r][j] for r in config.rewards])
            stats.update(raw)
            reward = float(stats.standardise(raw).mean())
            steps += 1
            baseline += (reward - baseline) / steps
            pi = torch.softmax(h.masked_fill(~alive, -math.inf), dim=0)
            onehot = F.one_hot(torch.tensor(a), n_actions).float()
            h = h + config.alpha * (reward - baseline) * (onehot - pi)
            trace_rewards.append(reward)
        chosen.extend(picked)
        bar.update(len(picked))
    bar.close()
    alive = torch.tensor([len(b) > 0 for b in buckets])
    pi = torch.softmax(h.masked_fill(~alive, -math.inf), dim=0) if bool(alive.any()) else torch.softmax(h, 0)
    counts = torch.bincount(actions[torch.tensor(chosen, dtype=torch.long)], minlength=n_actions)
    trace = {"actions": [int(a) for a in names], "final_policy": [round(float(p), 4) for p in pi],
             "queries_per_action": [int(c) for c in counts], "mean_reward": float(baseline)}
    return torch.tensor(chosen, dtype=torch.long), trace
