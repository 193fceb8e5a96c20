"""Logit recovery from probabilities (DFME appendix B): exact up to the per-sample constant."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stealkit.errors import InputError
from stealkit.extract.logit_recovery import (
    centre_logits,
    probability_floor,
    recover_logits,
    recovery_error,
    underflow_mask,
)

logit_rows = st.lists(
    st.lists(st.floats(-30, 30, allow_nan=False, width=64), min_size=2, max_size=12), min_size=1, max_size=6
).filter(lambda rows: len({len(r) for r in rows}) == 1)


@settings(max_examples=80, deadline=None)
@given(logit_rows, st.floats(-50, 50))
def test_exact_up_to_the_per_sample_constant(rows: list[list[float]], shift: float) -> None:
    z = torch.tensor(rows, dtype=torch.float64)
    rec = recover_logits(torch.softmax(z + shift, dim=1))  # any constant shift of the logits is invisible
    assert torch.allclose(rec, centre_logits(z), atol=1e-9)
    assert torch.allclose(rec.mean(dim=1), torch.zeros(z.shape[0], dtype=torch.float64), atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(logit_rows)
def test_float32_probabilities_close(rows: list[list[float]]) -> None:
    z = torch.tensor(rows, dtype=torch.float32) / 3  # range [-10, 10]: no float32 underflow
    rec = recover_logits(torch.softmax(z, dim=1))
    assert torch.allclose(rec, centre_logits(z), atol=2e-4)


@settings(max_examples=50, deadline=None)
@given(logit_rows, st.floats(150, 1000))
def test_survives_underflow(rows: list[list[float]], gap: float) -> None:
    z = torch.tensor(rows, dtype=torch.float32) / 3
    z[:, 0] += gap  # every other class underflows to probability 0 in float32
    p = torch.softmax(z, dim=1)
    assert bool((p[:, 1:] == 0).all())
    rec = recover_logits(p)
    assert bool(torch.isfinite(rec).all())
    assert torch.equal(rec.argmax(dim=1), z.argmax(dim=1))
    assert bool(underflow_mask(p)[:, 1:].all()) and not bool(underflow_mask(p)[:, 0].any())
    # an underflowed class gets an upper bound of its true logit (relative to the top class)
    top = rec[:, :1]
    assert bool(((rec[:, 1:] - top) >= (z[:, 1:] - z[:, :1]).double().float() - 1e-3).all())


def test_partial_underflow_keeps_exact_differences() -> None:
    z = torch.tensor([[0.0, -1.0, -2.5, -500.0]])
    rec = recover_logits(torch.softmax(z, dim=1))
    d = rec[0, :3] - rec[0, 0]
    assert torch.allclose(d, z[0, :3] - z[0, 0], atol=1e-5)
    p0 = torch.softmax(z, dim=1)[0, 0]
    floor = torch.tensor(probability_floor(torch.float32))
    assert float(rec[0, 3] - rec[0, 0]) == pytest.approx(float(floor.log() - p0.log()), rel=1e-6)


def test_recovery_error_reports_the_hidden_mean() -> None:
    z = torch.randn(64, 10, generator=torch.Generator().manual_seed(0)) * 4 + 3.0
    stats = recovery_error(z, torch.softmax(z, dim=1))
    assert stats["abs_mean"] == pytest.approx(float(z.mean(1).abs().mean()), rel=1e-5)
    assert stats["l1_error"] == pytest.approx(stats["abs_mean"], rel=1e-3)
    assert stats["centred_error"] < 1e-4 and stats["underflow_rows"] == 0.0


@pytest.mark.parametrize("bad", [torch.ones(3), -torch.ones(2, 3), torch.tensor([[float("nan"), 1.0]]),
                                 torch.ones(2, 3, dtype=torch.long)])
def test_refuses_bad_input(bad: torch.Tensor) -> None:
    with pytest.raises(InputError):
        recover_logits(bad)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
