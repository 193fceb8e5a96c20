"""The data-free attacks' (DFME, MAZE, DaST, CoDFe) common shape: :class:`DataFreeAttack`, and the argument
checks they share.

A method is a :class:`DataFreeAttack` (its state is real: a student, a generator, their optimisers and a
random generator) that knows its per-iteration query cost and how to take one iteration;
:func:`stealkit.extract.datafree.loop.run_datafree` drives it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from stealkit.errors import InputError, StealkitError
from stealkit.oracle import OutputMode

QueryFn = Callable[[torch.Tensor], torch.Tensor]


class DataFreeAttack:
    """Base class of the data-free methods: a student, a generator, named optimisers and one RNG.

    Subclasses set ``name``, build :attr:`student`, :attr:`generator` and :attr:`optimizers`, and implement
    :meth:`iteration_cost` (victim queries one iteration spends: the cost formula the tests check against the
    ledger) and :meth:`step`. Extra state (a replay buffer, a fixed noise set, an adaptive weight) is exposed
    through :meth:`extra_tensors` / :meth:`extra_scalars` and restored by :meth:`load_extra`.
    """

    name = "datafree"

    def __init__(self, *, input_shape: tuple[int, int, int], num_classes: int, mode: OutputMode, seed: int,
                 device: str = "cpu") -> None:
        self.input_shape = tuple(int(s) for s in input_shape)
        self.num_classes = int(num_classes)
        self.mode = OutputMode.parse(mode)
        self.seed = int(seed)
        self.device = device
        self.rng = torch.Generator().manual_seed(seed)
        self.student: nn.Module = nn.Identity()
        self.generator: nn.Module = nn.Identity()
        self.optimizers: dict[str, torch.optim.Optimizer] = {}

    # -- what subclasses implement ------------------------------------------------------------------------
    def iteration_cost(self) -> int:
        raise NotImplementedError

    def step(self, query: QueryFn, progress: float) -> dict[str, float]:
        """One iteration; ``progress`` in [0, 1) drives the learning-rate schedule. Returns its losses."""
        raise NotImplementedError

    def reported(self) -> nn.Module:
        """The student the run reports and saves (a method that selects among students overrides this)."""
        return self.student

    def candidates(self) -> dict[str, nn.Module]:
        """The students a selection chooses among; the loop scores them for the selected-vs-best gap only."""
        return {"student": self.student}

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def extra_scalars(self) -> dict[str, Any]:
        return {}

    def load_extra(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        return None

    def sample_images(self, n: int) -> torch.Tensor:
        """``n`` generator samples for the report, drawn with a fixed seed and without touching any state."""
        import copy

        gen = copy.deepcopy(self.generator)
        z = torch.randn(n, gen.nz, generator=torch.Generator().manual_seed(12345)).to(self.device)
        with torch.no_grad():
            if hasattr(gen, "sample_labels"):
                labels = torch.arange(n, device=self.device) % self.num_classes
                return gen(z, labels).cpu()
            return gen(z).cpu()

    # -- shared helpers ------------------------------------------------------------------------------------
    def noise(self, n: int, nz: int) -> torch.Tensor:
        return torch.randn(n, nz, generator=self.rng).to(self.device)

    def modules(self) -> dict[str, nn.Module]:
        return {"student": self.student, "generator": self.generator}


def check_positive(who: str, **values: float) -> None:
    for k, v in values.items():
        if not v > 0:
            raise InputError(f"{who}: {k} must be positive, got {v}")


def needs_probabilities(method: str, mode: OutputMode, label_smoothing: float) -> None:
    """Refuse the label-only adaptation of a probability method when it is switched off."""
    if mode is OutputMode.LABEL and not label_smoothing > 0:
        raise StealkitError(f"{method} needs probabilities; for its label-only adaptation pass a label smoothing "
                            "> 0 (e.g. --label-smoothing 0.1), or query with --mode probs")
