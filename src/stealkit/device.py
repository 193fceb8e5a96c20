"""The device policy: which torch device a stealkit process computes on.

``--device`` on every command (and ``run``, ``sweep``, ``reproduce``, which pass it to their steps) takes
``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``; without it ``$STEALKIT_DEVICE`` is read, else ``auto``.
``auto`` is the first CUDA GPU when torch sees one, else the CPU (``mps`` is never chosen by ``auto``).
A CUDA device this process cannot use (a CPU-only torch build, no GPU visible, an index past the last GPU)
is one clear :class:`~stealkit.errors.InputError`, never a traceback from inside torch.

The device resolved last in this process is recorded in every run's ``config.json`` (with the GPU's name),
see :func:`device_info`. Code below the command layer never chooses a device: tensors follow the model they
are fed to (``next(model.parameters()).device``, :func:`module_device`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from stealkit.errors import InputError

ENV_VAR = "STEALKIT_DEVICE"
CHOICES = "auto, cpu, cuda, cuda:N or mps"
_CUDA = re.compile(r"^cuda(?::(\d+))?$")
_resolved: str | None = None  # the device the last resolve_device() in this process chose


def resolve_device(spec: str | None = None, *, source: str = "--device") -> str:
    """The device to compute on, as a canonical string (``"cpu"``, ``"cuda:0"``, ``"mps"``).

    ``spec`` ``None`` or empty reads ``$STEALKIT_DEVICE`` (then ``auto``). ``cuda`` becomes ``cuda:0``, so
    the string names exactly the device the tensors report. Raises :class:`InputError` for an unknown
    spelling or a device this process cannot use.
    """
    global _resolved
    if not spec:
        spec, source = os.environ.get(ENV_VAR) or "auto", f"${ENV_VAR}"
    text = str(spec).strip().lower()
    if text == "auto":
        device = "cuda:0" if _cuda_available() else "cpu"
    elif text == "cpu":
        device = "cpu"
    elif text == "mps":
        device = _check_mps(source)
    elif m := _CUDA.match(text):
        device = _check_cuda(int(m.group(1) or 0), source, text)
    else:
        raise InputError(f"{source} {spec!r}: unknown device; expected {CHOICES}")
    _resolved = device
    return device


def resolved_device() -> str | None:
    """The device the last :func:`resolve_device` of this process chose (``None`` before any)."""
    return _resolved


def device_info(device: str | None = None) -> dict[str, Any]:
    """``{"device": ..., "gpu": name}`` of ``device`` (default: the one resolved last) for ``config.json``."""
    device = device if device is not None else _resolved
    info: dict[str, Any] = {"device": device}
    if device and device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        try:
            info["gpu"] = torch.cuda.get_device_name(index)
        except (AssertionError, RuntimeError):  # no usable CUDA in this process (e.g. a simulated device in tests)
            info["gpu"] = None
        info["cuda"] = torch.version.cuda
    return info


def module_device(module: Any, default: str = "cpu") -> Any:
    """The device of a module's first parameter or buffer (``default`` for a module that has neither)."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    import torch

    return torch.device(default)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _check_cuda(index: int, source: str, text: str) -> str:
    import torch

    if torch.version.cuda is None and not torch.cuda.is_available():
        raise InputError(f"{source} {text}: this torch ({torch.__version__}) is a CPU-only build; install a CUDA "
                         "build of torch (https://pytorch.org/get-started) or use --device cpu")
    if not torch.cuda.is_available():
        raise InputError(f"{source} {text}: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU "
                         "(check nvidia-smi, the driver and $CUDA_VISIBLE_DEVICES) or use --device cpu")
    count = torch.cuda.device_count()
    if index >= count:
        raise InputError(f"{source} {text}: there is no GPU {index}; this machine has {count} "
                         f"(cuda:0 to cuda:{count - 1})")
    return f"cuda:{index}"


def _check_mps(source: str) -> str:
    import torch

    if not torch.backends.mps.is_available():
        raise InputError(f"{source} mps: Apple's Metal backend is not available in this torch/machine; "
                         "use --device cpu")
    return "mps"
