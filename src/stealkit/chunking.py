"""How many images to send through a model at once when only throughput matters.

On a CPU a forward pass is fastest while each layer's output for the whole chunk stays in the last-level
cache; past that, every layer streams its activations through main memory. Measured on this project's 2-core
AMD EPYC (32 MiB L3, 1 torch thread, torch 2.13.0+cpu; ``benchmarks/forward_chunk.py`` at 9158eae, since removed: docs/archive.md,
"One-off diagnostics removed from benchmarks/"): the Fashion-MNIST ``conv2`` victim answers 2,400-2,700 images/s in chunks of
32-256 and 1,500-1,650 in chunks of 512-1,024; ``cnn4`` 1,750-2,130 at 32-256 and 1,180-1,360 at 512-1,024;
the digits ``conv2`` victim is fastest at 512 (noisy). The 28x28 victims slow down where the largest layer
output of the chunk passes about 32 MiB, so the CPU chunk is the largest power of two that keeps it under
that (between 16 and 512). On other devices the chunk stays 1,024 (a GPU wants large batches; memory is the
only bound there).

The chunk never changes which images are charged: a query of B images is still B queries on the ledger.
Per-image outputs do not depend on it beyond float rounding: the same labels, logits equal to 1e-5 (checked in
``tests/test_chunking.py``). On the AMD EPYC where the chunk was measured they were bitwise equal for any
chunk of 16 or more on ``conv2`` and ``cnn4`` models; on an Intel Xeon (2026-11-25) a chunk of 16 differed by
up to 7e-8 in the logits (its 8-image remainder), chunks of 64 and 1,024 not at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: the chunk on devices other than the CPU, and the CPU chunk when a model's activations cannot be measured
DEFAULT_CHUNK = 1024
#: the largest single layer output per CPU chunk (the last-level cache of a typical server core complex)
CPU_ACTIVATION_BYTES = 32 * 2**20
MIN_CPU_CHUNK, MAX_CPU_CHUNK = 16, 512


def largest_activation_bytes(model: nn.Module, input_shape: Sequence[int], device: torch.device) -> int | None:
    """Bytes of the largest leaf-module output for one image (``None`` if the model cannot be probed so)."""
    sizes: list[int] = []

    def record(_mod: nn.Module, _inp: object, out: object) -> None:
        if isinstance(out, torch.Tensor):
            sizes.append(out.numel() * out.element_size())

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    try:
        handles = [m.register_forward_hook(record) for m in leaves]
    except RuntimeError:  # e.g. a scripted module
        return None
    was_training = model.training
    model.eval()  # the probe must not touch batch-norm statistics
    try:
        with torch.inference_mode():
            model(torch.zeros(1, *input_shape, device=device))
    except Exception:  # noqa: BLE001 - a model we cannot probe keeps the default chunk
        return None
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return max(sizes) if sizes else None


def cpu_chunk(activation_bytes: int | None) -> int:
    """The CPU chunk for a model whose largest layer output for one image is ``activation_bytes``."""
    if not activation_bytes or activation_bytes <= 0:
        return DEFAULT_CHUNK
    fit = max(1, CPU_ACTIVATION_BYTES // activation_bytes)
    return max(MIN_CPU_CHUNK, min(MAX_CPU_CHUNK, 1 << (fit.bit_length() - 1)))


def forward_chunk(model: nn.Module, input_shape: Sequence[int], device: torch.device | str) -> int:
    """How many images of ``input_shape`` to send through ``model`` on ``device`` at once."""
    device = torch.device(device)
    if device.type != "cpu":
        return DEFAULT_CHUNK
    return cpu_chunk(largest_activation_bytes(model, input_shape, device))
