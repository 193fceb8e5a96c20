"""The CPU forward chunk (stealkit/chunking.py) and LocalOracle's use of it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stealkit.chunking import (
    DEFAULT_CHUNK,
    MAX_CPU_CHUNK,
    MIN_CPU_CHUNK,
    cpu_chunk,
    forward_chunk,
    largest_activation_bytes,
)
from stealkit.errors import InputError
from stealkit.models import build_model
from stealkit.oracle import LocalOracle


def test_cpu_chunk_keeps_the_largest_layer_output_under_the_cache_budget() -> None:
    assert cpu_chunk(100_352) == 256  # Fashion-MNIST conv2 / cnn4: 32 x 28 x 28 floats per image
    assert cpu_chunk(131_072) == 256  # 32 x 32 x 32 floats (CIFAR-sized conv2)
    assert cpu_chunk(8_192) == MAX_CPU_CHUNK  # digits conv2: would fit 4,096
    assert cpu_chunk(10**9) == MIN_CPU_CHUNK
    assert cpu_chunk(None) == DEFAULT_CHUNK
    assert cpu_chunk(0) == DEFAULT_CHUNK


def test_largest_activation_is_measured_from_the_leaf_outputs() -> None:
    model = build_model("conv2", input_shape=(1, 28, 28), num_classes=10).eval()
    assert largest_activation_bytes(model, (1, 28, 28), torch.device("cpu")) == 32 * 28 * 28 * 4
    assert forward_chunk(model, (1, 28, 28), "cpu") == 256


def test_a_model_that_cannot_be_probed_keeps_the_default_chunk() -> None:
    class Picky(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] == 1:
                raise ValueError("wants batches")
            return x.flatten(1)[:, :3]

    assert forward_chunk(Picky(), (1, 4, 4), "cpu") == DEFAULT_CHUNK


@pytest.mark.parametrize("arch", ["conv2", "cnn4"])
def test_answers_do_not_depend_on_the_chunk(arch: str) -> None:
    torch.manual_seed(0)
    model = build_model(arch, input_shape=(1, 28, 28), num_classes=10).eval()
    x = torch.rand(600, 1, 28, 28)
    answers = []
    for bs in (None, 16, 64, 1024):
        oracle = LocalOracle(model, (1, 28, 28), mode="logits", batch_size=bs)
        answers.append(oracle.query(x))
        assert oracle.ledger.total == 600
    assert LocalOracle(model, (1, 28, 28), mode="logits").batch_size == 256
    # bitwise equality across chunks holds on some CPUs (AMD EPYC) and not on others (an Intel Xeon: a chunk
    # with an 8-image remainder differs by ~1e-8); what the code guarantees is the same labels, logits to rounding
    for other in answers[1:]:
        torch.testing.assert_close(other, answers[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(other.argmax(1), answers[0].argmax(1))


def test_a_bad_batch_size_is_one_clear_error() -> None:
    model = build_model("conv2", input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(InputError, match="batch_size"):
        LocalOracle(model, (1, 8, 8), batch_size=0)


def test_the_probe_leaves_batch_norm_and_the_training_mode_alone() -> None:
    from stealkit.metrics import predict_logits

    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 26 * 26, 3))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(40, 1, 28, 28)
    out = predict_logits(model, x)
    assert model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(out, predict_logits(model, x, batch_size=1024))
