"""Guarantees of the oracle's checks before anything is charged (issue 38; docs/mutation.md).

:func:`check_explain_args` bounds what one explanation may cost (``n_samples`` in ``[1, 256]``, ``sigma`` in
``[0, 10]``), :func:`explain_price` is what a served explanation charges per image, and :func:`validate_images`
refuses a batch before it reaches the ledger. The edges are exact: each test pins both sides of one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stealkit.errors import InputError
from stealkit.oracle.base import (
    MAX_SMOOTHGRAD_SAMPLES,
    MAX_SMOOTHGRAD_SIGMA,
    check_explain_args,
    explain_price,
    validate_images,
)


def test_n_samples_edges_are_inclusive() -> None:
    assert check_explain_args("smoothgrad", n_samples=1).n_samples == 1
    assert check_explain_args("smoothgrad", n_samples=MAX_SMOOTHGRAD_SAMPLES).n_samples == MAX_SMOOTHGRAD_SAMPLES
    for bad in (0, MAX_SMOOTHGRAD_SAMPLES + 1, True, 2.0):
        with pytest.raises(InputError):
            check_explain_args("smoothgrad", n_samples=bad)
    assert check_explain_args("smoothgrad", n_samples=np.int64(3)).n_samples == 3


def test_sigma_edges_are_inclusive_and_non_finite_is_refused() -> None:
    assert check_explain_args(sigma=0).sigma == 0.0
    assert check_explain_args(sigma=MAX_SMOOTHGRAD_SIGMA).sigma == MAX_SMOOTHGRAD_SIGMA
    for bad in (-1e-9, MAX_SMOOTHGRAD_SIGMA + 1e-9, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(InputError):
            check_explain_args(sigma=bad)


def test_method_and_output_are_checked() -> None:
    args = check_explain_args("smoothgrad", "prob", 4, 0.5)
    assert (args.method, args.output, args.n_samples, args.sigma) == ("smoothgrad", "prob", 4, 0.5)
    with pytest.raises(InputError):
        check_explain_args("integrated-gradients")
    with pytest.raises(InputError):
        check_explain_args(output="loss")


def test_the_price_is_one_per_gradient_and_one_per_noise_sample() -> None:
    assert explain_price(check_explain_args("gradient", n_samples=50)) == 1
    assert explain_price(check_explain_args("smoothgrad", n_samples=50)) == 50
    assert explain_price(check_explain_args("smoothgrad", n_samples=1)) == 1


def test_validate_images_accepts_the_unit_range_and_clips_only_within_tolerance() -> None:
    x = torch.tensor([0.0, 1.0, 0.5, 0.25]).reshape(1, 1, 2, 2)
    out = validate_images(x, (1, 2, 2))
    assert out.dtype == torch.float32 and torch.equal(out, x)
    tiny = torch.tensor([-1e-6, 1 + 1e-6, 0.5, 0.5]).reshape(1, 1, 2, 2)
    clipped = validate_images(tiny, (1, 2, 2))
    assert float(clipped.min()) == 0.0 and float(clipped.max()) == 1.0
    low_only = validate_images(torch.tensor([-1e-6, 0.5, 0.5, 0.5]).reshape(1, 1, 2, 2), (1, 2, 2))
    assert float(low_only.min()) == 0.0
    high_only = validate_images(torch.tensor([1 + 1e-6, 0.5, 0.5, 0.5]).reshape(1, 1, 2, 2), (1, 2, 2))
    assert float(high_only.max()) == 1.0
    for bad in (-1e-3, 1 + 1e-3):
        with pytest.raises(InputError):
            validate_images(torch.full((1, 1, 2, 2), bad), (1, 2, 2))


def test_validate_images_refuses_before_any_charge() -> None:
    shape = (1, 2, 2)
    with pytest.raises(InputError):
        validate_images(torch.zeros(1, 2, 2), shape)  # a single image without batch dimension
    with pytest.raises(InputError):
        validate_images(torch.zeros(2, 1, 2, 3), shape)
    with pytest.raises(InputError, match="must have shape"):
        validate_images(torch.zeros(1, 2, 3), shape)  # as many dimensions as one image, but not its shape
    with pytest.raises(InputError):
        validate_images(torch.zeros(0, 1, 2, 2), shape)
    with pytest.raises(InputError):
        validate_images(torch.zeros(2, 1, 2, 2, dtype=torch.int64), shape)
    with pytest.raises(InputError):
        validate_images(np.zeros((2, 1, 2, 2), dtype=np.uint8), shape)
    with pytest.raises(InputError):
        validate_images(np.full((2, 1, 2, 2), "a"), shape)  # a dtype torch cannot even convert
    with pytest.raises(InputError):
        validate_images([[0.0]], shape)
    nan = torch.zeros(3, 1, 2, 2)
    nan[1, 0, 0, 0] = float("nan")
    nan[1, 0, 1, 1] = float("inf")  # two bad pixels of one image: one image to repair
    with pytest.raises(InputError, match="1 image"):
        validate_images(nan, shape)
    ok = validate_images(np.full((2, 1, 2, 2), 0.5, dtype=np.float64), shape)
    graded = validate_images(torch.full((1, 1, 2, 2), 0.5, requires_grad=True), shape)
    assert not graded.requires_grad  # the oracle answers pixels, it does not join the caller's graph
    assert ok.dtype == torch.float32 and ok.shape == (2, 1, 2, 2) and ok.is_contiguous()


@pytest.mark.parametrize("field", ["method", "output"])
@pytest.mark.parametrize("bad", [[[]], {"a": 1}, ["gradient"]])
def test_explain_arguments_of_the_wrong_json_type_are_input_errors(field: str, bad: object) -> None:
    """The schema fuzz sent ``"method": [[]]`` to /v1/explain and got a 500: a list is unhashable, so the
    membership test raised TypeError; it is now a one-line 400 like any other bad argument."""
    from stealkit.oracle.base import check_explain_args

    with pytest.raises(InputError, match=f"unknown explanation {field}"):
        check_explain_args(**{field: bad})
