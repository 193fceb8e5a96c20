"""A simulated second device on a CPU-only machine, to catch cuda/cpu mismatches without a GPU.

Inside ``with fake_cuda():`` the device ``cuda`` exists: ``torch.cuda.is_available()`` is true, and a tensor
moved or created there (``.to("cuda")``, ``.cuda()``, ``device="cuda"``, a module's ``.to("cuda")``) is a CPU
tensor of the marker class :class:`OnFakeCuda` that reports ``device == cuda:0``. Every torch call is checked
the way CUDA would check it: a call that mixes fake-cuda tensors with CPU tensors (other than 0-dim scalars,
indices of a cuda tensor and the source of a copy), draws from a generator of the other device, or turns a
fake-cuda tensor into numpy raises the ``RuntimeError`` torch would raise on a GPU. The numbers are the CPU's,
so a path that passes here computes exactly what it computes on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

FAKE = torch.device("cuda", 0)
_CPU = torch.device("cpu")


class OnFakeCuda(torch.Tensor):
    """A CPU tensor standing for one on ``cuda:0`` (the mode below decides every result's device)."""

    __torch_function__ = torch._C._disabled_torch_function_impl


class _FakeCudaGenerator(torch.Generator):
    """A generator standing for one on ``cuda:0`` (``torch.Generator(device="cuda")``)."""

    def __new__(cls, device: Any = "cpu") -> Any:
        is_cuda = torch.device(device).type == "cuda"
        gen = super().__new__(cls, "cpu")
        gen.fake_cuda = is_cuda  # type: ignore[attr-defined]
        return gen

    def __init__(self, device: Any = "cpu") -> None:  # everything happened in __new__
        pass

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return FAKE if self.fake_cuda else _CPU


_REAL_GENERATOR = torch.Generator
_TO_HOST = {torch.Tensor.numpy, torch.Tensor.__array__}
_MAY_MIX = {torch.Tensor.copy_, torch.Tensor.__setitem__, torch.Tensor.__getitem__, torch.Tensor.index_put_,
            torch.Tensor.index_put}  # cross-device copies and CPU indices are allowed on a cuda tensor


def _is_fake(t: Any) -> bool:
    return isinstance(t, OnFakeCuda)


def _mark(t: Any, cls: type) -> Any:
    """Move ``t`` to the simulated device (``cls`` OnFakeCuda) or off it, in place: autograd is untouched."""
    if isinstance(t, torch.Tensor) and type(t) in (torch.Tensor, OnFakeCuda):
        t.__class__ = cls
    return t


def _device_of(value: Any) -> torch.device | None:
    if isinstance(value, torch.Tensor):
        return FAKE if _is_fake(value) else _CPU
    return torch.device(value) if isinstance(value, str | torch.device) else None


def _mismatch(func: Any, why: str) -> RuntimeError:
    name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                        f"cpu! ({why} in {name}; simulated by tests/fake_cuda.py)")


class _FakeCudaMode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func == torch.Tensor.device.__get__:
            return FAKE if _is_fake(args[0]) else func(*args)
        if func == torch.Tensor.is_cuda.__get__:
            return _is_fake(args[0])
        if func in _TO_HOST and _is_fake(args[0]):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first. (simulated by tests/fake_cuda.py)")
        if func is torch.Tensor.__deepcopy__ and _is_fake(args[0]):  # copy as a plain tensor, then mark it
            flipped = [t for t in (args[0], args[0].grad) if _is_fake(t)]
            for t in flipped:
                t.__class__ = torch.Tensor
            try:
                out = _mark(func(*args, **kwargs), OnFakeCuda)
            finally:
                for t in flipped:
                    t.__class__ = OnFakeCuda
            return out if out.grad is None else (_mark(out.grad, OnFakeCuda), out)[1]
        if func is torch._has_compatible_shallow_copy_type:  # nn.Module._apply asks: never across devices
            return _is_fake(args[0]) == _is_fake(args[1]) and func(*args)
        target = None
        if func is torch.Tensor.cuda:
            target, args, kwargs = FAKE, args[:1], {}
        elif func is torch.Tensor.cpu:
            target = _CPU
        elif func is torch.Tensor.to:
            target, args, kwargs = self._to_target(args, kwargs)
        else:
            target = _device_of(kwargs.get("device"))
            if target is not None and target.type == "cuda":
                kwargs["device"] = "cpu"
            self._check(func, args, kwargs, target)
        flat = tree_flatten((args, kwargs))[0]
        here = FAKE if any(_is_fake(t) for t in flat) else _CPU
        to = here if target is None else (FAKE if target.type == "cuda" else _CPU)
        if func in (torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.to) and to != here:
            out = args[0].clone() if func is torch.Tensor.cuda else func(*args, **kwargs)
            if out is args[0] or out.data_ptr() == args[0].data_ptr():
                out = out.clone()  # a copy to another device never aliases its source
            return _mark(out, OnFakeCuda if to == FAKE else torch.Tensor)
        if func is torch.Tensor.cuda:
            return args[0]
        out = func(*args, **kwargs)
        if to == FAKE:
            inputs = {id(t) for t in flat if isinstance(t, torch.Tensor) and not _is_fake(t)}
            tree_map(lambda t: _mark(t, OnFakeCuda) if id(t) not in inputs else t, out)
        return out

    @staticmethod
    def _to_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """The device ``Tensor.to(...)`` asks for, and its arguments with that device made the CPU."""
        rest, target = list(args[1:]), None
        for i, a in enumerate(rest):
            d = _device_of(a)
            if d is not None:
                target, rest[i] = d, (a.dtype if isinstance(a, torch.Tensor) else _CPU)
        if kwargs.get("device") is not None:
            target, kwargs["device"] = _device_of(kwargs["device"]), _CPU
        return target, (args[0], *rest), kwargs

    @staticmethod
    def _check(func: Any, args: Any, kwargs: dict[str, Any], target: torch.device | None) -> None:
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        fake = [t for t in tensors if _is_fake(t)]
        cpu = [t for t in tensors if not _is_fake(t) and t.dim() > 0]
        if func in _MAY_MIX:
            if args and not _is_fake(args[0]) and fake and func is not torch.Tensor.copy_:
                raise _mismatch(func, "a cuda index or value for a cpu tensor")
        elif fake and cpu:
            raise _mismatch(func, "a cpu tensor beside a cuda tensor")
        gen = kwargs.get("generator")
        if isinstance(gen, _REAL_GENERATOR):
            on_cuda = target.type == "cuda" if target is not None else bool(fake)
            if bool(getattr(gen, "fake_cuda", False)) != on_cuda:
                raise RuntimeError(f"Expected a '{'cuda' if on_cuda else 'cpu'}' device type for generator but "
                                   f"found '{'cpu' if on_cuda else 'cuda'}' (simulated by tests/fake_cuda.py)")


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """Simulate one GPU, ``cuda:0``, for the duration (see the module docstring)."""
    import unittest.mock as mock

    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch("torch.cuda.is_available", lambda: True))
        patches.enter_context(mock.patch("torch.cuda.device_count", lambda: 1))
        patches.enter_context(mock.patch("torch.cuda.get_device_name", lambda *a: "fake GPU (tests/fake_cuda.py)"))
        patches.enter_context(mock.patch("torch.version.cuda", "fake"))
        patches.enter_context(mock.patch("torch.Generator", _FakeCudaGenerator))
        patches.enter_context(mock.patch("torch.__future__._overwrite_module_params_on_conversion", True))
        with _FakeCudaMode():
            yield


def on_fake_cuda(t: torch.Tensor) -> bool:
    """Whether ``t`` stands for a tensor on the simulated GPU."""
    return _is_fake(t)
