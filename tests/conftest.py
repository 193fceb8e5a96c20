from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn


class TinyNet(nn.Module):
    """A tiny differentiable classifier on 1x4x4 images (pixels in [0, 1])."""

    def __init__(self, num_classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def labelled_tiny_batch(seed: int = 3, n: int = 5) -> tuple[TinyNet, torch.Tensor, torch.Tensor]:
    """A TinyNet victim (seed 0, eval mode), ``n`` seeded random 1x4x4 images and the victim's labels for them."""
    victim = TinyNet(seed=0).eval()
    x = torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    return victim, x, victim(x).argmax(1)


@pytest.fixture
def tiny_model() -> nn.Module:
    return TinyNet().eval()


@pytest.fixture
def tiny_batch() -> torch.Tensor:
    return torch.rand(12, 1, 4, 4, generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEALKIT_QUIET", "1")
    torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _fresh_device_choice() -> None:
    """Each test starts with no device resolved yet (a simulated cuda in one test must not leak into the next)."""
    import stealkit.device

    yield
    stealkit.device._resolved = None


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server tests' victim: :func:`tests.test_serve_support.make_victim`'s digits MLP, trained once per test
    module. A module that needs another victim defines its own ``victim`` fixture, which takes precedence."""
    from tests.test_serve_support import make_victim

    return make_victim(tmp_path_factory.mktemp("victim") / "model")


def load_benchmark(name: str) -> ModuleType:
    """The script ``benchmarks/<name>.py`` imported as a module (benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
