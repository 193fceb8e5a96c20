"""Exact two-layer recovery (Milli et al. 2019, Sec. 3, App. B-C, footnote 2): equivalence, failure, ledger."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stealkit.errors import InputError
from stealkit.extract.explanations.exact import (
    ExactConfig,
    RecoveryFailure,
    recover_two_layer,
    relative_error,
    search_line,
)
from stealkit.extract.explanations.exact_mq import recover_two_layer_mq
from stealkit.extract.explanations.logistic_exact import identify_logistic
from stealkit.models import build_model
from stealkit.oracle import LocalExplanationOracle, LocalOracle
from stealkit.oracle.float64 import Float64ExplanationOracle, TwoLayerReLU


def _oracle(d: int, h: int, k: int, *, bias: bool, seed: int = 0, domain: str = "real"):
    net = TwoLayerReLU.random(d, h, k, bias=bias, seed=seed)
    return net, Float64ExplanationOracle(net, (1, 1, d), domain=domain)  # type: ignore[arg-type]


def _err(net: TwoLayerReLU, rec: torch.nn.Module, d: int, seed: int = 1) -> float:
    x = torch.randn(2000, 1, 1, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return relative_error(net, rec, x)


@pytest.mark.parametrize("search", ["bisect", "secant"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paper_model_recovered_to_1e9(search: str, seed: int) -> None:
    d, h = 16, 6
    net, oracle = _oracle(d, h, 1, bias=False, seed=seed)
    rec = recover_two_layer(oracle, h, ExactConfig(bias=False, search=search, lines=1, seed=seed))
    assert rec.hidden_found == h and rec.signs is not None and rec.signs.shape == (2 * h, 1)
    assert _err(net, rec.model, d) < 1e-9
    # s is the paper's sign vector: in {-1, 0, 1} up to the scale |w_i| carried by the rows of Z
    nonzero = (np.abs(rec.signs[:, 0]) > 1e-9).sum()
    assert nonzero == h


def test_recovered_rows_are_plus_minus_w_a() -> None:
    d, h = 12, 4
    net, oracle = _oracle(d, h, 1, bias=False, seed=3)
    rec = recover_two_layer(oracle, h, ExactConfig(bias=False, lines=1, seed=3))
    truth = (net.fc2.weight.detach().numpy()[0][:, None] * net.fc1.weight.detach().numpy())
    for row in rec.rows:
        dist = np.minimum(np.abs(truth - row).max(1), np.abs(truth + row).max(1))
        assert dist.min() < 1e-9


@pytest.mark.parametrize("seed", [0, 1])
def test_biased_multi_output_recovered_to_1e9(seed: int) -> None:
    d, h, k = 24, 8, 5
    net, oracle = _oracle(d, h, k, bias=True, seed=seed)
    rec = recover_two_layer(oracle, h, ExactConfig(seed=seed))
    assert _err(net, rec.model, d) < 1e-9
    assert rec.model.num_classes == k


def test_box_domain_on_float64_oracle() -> None:
    torch.manual_seed(0)
    model = build_model("mlp2", input_shape=(1, 4, 4), num_classes=3, hidden=6)
    net = TwoLayerReLU.from_classifier(model)
    x = torch.rand(500, 1, 4, 4)
    assert relative_error(model.double(), net, x) < 1e-12
    oracle = Float64ExplanationOracle(net, (1, 4, 4), domain="box")
    rec = recover_two_layer(oracle, 6, ExactConfig(lines=30))
    assert relative_error(net, rec.model, torch.rand(2000, 1, 4, 4, dtype=torch.float64)) < 1e-9
    assert relative_error(net, rec.model.to_mlp2().double(), x.double()) < 1e-5


def test_gradient_and_membership_counts_in_ledger() -> None:
    d, h = 16, 5
    _, oracle = _oracle(d, h, 2, bias=True)
    rec = recover_two_layer(oracle, h, ExactConfig(check_points=4))
    assert rec.queries == oracle.ledger.as_dict()
    assert rec.queries["explain"] > 0 and rec.queries["predict"] >= 2 * h + 1 + 4
    # the paper's variant: bisection spends only gradients on Algorithm 1a, 2h values on Algorithm 1b
    _, oracle = _oracle(d, h, 1, bias=False)
    rec = recover_two_layer(oracle, h, ExactConfig(bias=False, search="bisect", lines=1, check_points=0))
    assert rec.queries["predict"] == 2 * h
    assert rec.queries["explain"] == oracle.ledger.as_dict()["explain"] > h


def test_membership_query_variant_exact_and_predict_only() -> None:
    d, h = 10, 4
    net, oracle = _oracle(d, h, 3, bias=True, seed=4)
    rec = recover_two_layer_mq(oracle, h)
    assert rec.queries["explain"] == 0 and rec.queries["predict"] > d * h
    assert _err(net, rec.model, d) < 1e-6


def test_failure_is_notified_when_crossings_lie_outside_the_range() -> None:
    net, oracle = _oracle(8, 4, 1, bias=False, seed=0)
    with pytest.raises(RecoveryFailure, match="found .* of 4 hidden units"):
        recover_two_layer(oracle, 4, ExactConfig(bias=False, length=1e-6, lines=1))


def test_failure_when_hidden_width_is_understated() -> None:
    _, oracle = _oracle(12, 6, 2, bias=True, seed=5)
    # told h = 3 the search stops early; the fit cannot reproduce the oracle, and no line finds more
    with pytest.raises(RecoveryFailure):
        recover_two_layer(oracle, 3, ExactConfig(lines=1, search="secant", length=1e-3))


def test_failure_when_paper_algorithm_meets_a_biased_network() -> None:
    _, oracle = _oracle(12, 4, 1, bias=True, seed=6)
    with pytest.raises(RecoveryFailure):
        recover_two_layer(oracle, 4, ExactConfig(bias=False, lines=2))


def test_search_line_finds_every_crossing_exactly() -> None:
    from stealkit.extract.explanations.exact import GradientAccess

    net, oracle = _oracle(6, 3, 1, bias=True, seed=7)
    access = GradientAccess(oracle)
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal(6), rng.standard_normal(6)
    w1, b1 = net.fc1.weight.detach().numpy(), net.fc1.bias.detach().numpy()
    t_true = np.sort(-(w1 @ u + b1) / (w1 @ v))
    found = search_line(access, u, v, -1e4, 1e4, eps=1e-9, tol=1e-9)
    t_found = np.sort([float((p - u) @ v / (v @ v)) for _, p in found])
    np.testing.assert_allclose(t_found, t_true, rtol=1e-9, atol=1e-9)


def test_user_errors_are_input_errors() -> None:
    net, oracle = _oracle(8, 2, 2, bias=True)
    probs = Float64ExplanationOracle(net, (1, 1, 8), mode="probs")
    with pytest.raises(InputError, match="--mode logits"):
        recover_two_layer(probs, 2)
    with pytest.raises(InputError, match="hidden"):
        recover_two_layer(oracle, 0)
    plain = LocalOracle(build_model("mlp2", input_shape=(1, 2, 4), num_classes=2, hidden=2), (1, 2, 4), mode="logits")
    with pytest.raises(InputError, match="explanations"):
        recover_two_layer(plain, 2)
    box = Float64ExplanationOracle(net, (1, 1, 8), domain="box")
    with pytest.raises(InputError, match="Algorithm 1b"):
        recover_two_layer(box, 2, ExactConfig(bias=False))
    with pytest.raises(InputError):
        ExactConfig(search="newton")  # type: ignore[arg-type]


def test_stock_float32_oracle_recovers_mlp2_closely() -> None:
    torch.manual_seed(1)
    model = build_model("mlp2", input_shape=(1, 4, 4), num_classes=3, hidden=5)
    oracle = LocalExplanationOracle(model, (1, 4, 4), mode="logits")
    rec = recover_two_layer(oracle, 5, ExactConfig(lines=30))
    x = torch.rand(1000, 1, 4, 4)
    assert relative_error(model.double(), rec.model, x) < 1e-4
    assert rec.queries == oracle.ledger.as_dict()


@pytest.mark.parametrize("k", [2, 4])
def test_logistic_identified_from_one_gradient_and_one_membership_query(k: int) -> None:
    torch.manual_seed(k)
    victim = build_model("logistic", input_shape=(1, 4, 4), num_classes=k)
    oracle = Float64ExplanationOracle(victim, (1, 4, 4), mode="probs", domain="box")
    ident = identify_logistic(oracle)
    assert ident.queries == {"predict": 1, "explain": k - 1}
    x = torch.rand(500, 1, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        p_victim = torch.softmax(victim.double()(x), 1)
        p_model = torch.softmax(ident.model.double()(x), 1)
    assert float((p_victim - p_model).abs().max()) < 1e-6
    # weights exact up to softmax's shift invariance (class 0 pinned to zero)
    w = victim.net[1].weight.detach().double().numpy() / 0.5
    np.testing.assert_allclose(ident.weight, w - w[0], atol=1e-9)
