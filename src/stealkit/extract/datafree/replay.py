"""Experience replay for data-free extraction: a bounded ring buffer of answered queries.

MAZE (Kariyappa et al., CVPR 2021, Sec. 3.3) replays past generator batches with the victim's answers so the
clone keeps learning from them at no query cost; CoDFe can use the same buffer as a stealkit option. Inputs are
kept in float16 and targets (probability vectors; one-hot for labels) in float32; the buffer grows
geometrically up to ``capacity`` and then overwrites its oldest rows, so memory and checkpoints stay bounded.
"""

from __future__ import annotations

from typing import Any

import torch


class ReplayBuffer:
    """At most ``capacity`` (input, target) rows; ``filled`` rows are valid, ``pos`` is where the next goes."""

    def __init__(self, capacity: int, input_shape: tuple[int, ...], num_classes: int) -> None:
        self.capacity = capacity
        self.x = torch.empty(0, *input_shape, dtype=torch.float16)
        self.p = torch.empty(0, num_classes, dtype=torch.float32)
        self.filled = 0
        self.pos = 0

    def __len__(self) -> int:
        return self.filled

    def add(self, x: torch.Tensor, p: torch.Tensor) -> None:
        cap = self.capacity
        if cap <= 0:
            return
        x, p = x[-cap:], p[-cap:]
        if self.x.shape[0] < cap:  # grow geometrically up to the capacity
            size = min(cap, max(2 * self.x.shape[0], 4 * x.shape[0]))
            grow_x = torch.empty(size, *x.shape[1:], dtype=torch.float16)
            grow_p = torch.empty(size, p.shape[1], dtype=torch.float32)
            grow_x[: self.filled], grow_p[: self.filled] = self.x[: self.filled], self.p[: self.filled]
            self.x, self.p = grow_x, grow_p
        idx = (self.pos + torch.arange(x.shape[0])) % cap
        self.x[idx], self.p[idx] = x.detach().cpu().half(), p.detach().cpu().float()
        self.pos = int((self.pos + x.shape[0]) % cap)
        self.filled = min(self.filled + x.shape[0], cap)

    def sample(self, n: int, generator: torch.Generator, device: str | torch.device) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
        """``n`` rows drawn uniformly with replacement, as float32 on ``device``."""
        idx = torch.randint(self.filled, (n,), generator=generator)
        return self.x[idx].to(device).float(), self.p[idx].to(device)

    # checkpoint state: the same names MAZE checkpoints have always used
    def tensors(self) -> dict[str, torch.Tensor]:
        return {"buffer_x": self.x[: self.filled], "buffer_p": self.p[: self.filled]}

    def scalars(self) -> dict[str, Any]:
        return {"filled": self.filled, "pos": self.pos}

    def load(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        self.x, self.p = tensors["buffer_x"].clone(), tensors["buffer_p"].clone()
        self.filled, self.pos = int(scalars["filled"]), int(scalars["pos"])
