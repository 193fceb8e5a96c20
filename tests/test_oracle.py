from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from stealkit.errors import BudgetExhausted, InputError
from stealkit.oracle import LocalExplanationOracle, LocalOracle, OutputMode, QueryLedger, check_explain_args
from stealkit.oracle.ledger import budget_left


def make(model, mode="probs", **kw):
    return LocalOracle(model, (1, 4, 4), mode=mode, **kw)


class TestModes:
    def test_label(self, tiny_model, tiny_batch):
        out = make(tiny_model, "label").query(tiny_batch)
        assert out.dtype == torch.int64 and out.shape == (12,)
        assert torch.equal(out, tiny_model(tiny_batch).argmax(1))

    def test_logits(self, tiny_model, tiny_batch):
        out = make(tiny_model, "logits").query(tiny_batch)
        assert torch.allclose(out, tiny_model(tiny_batch))

    def test_probs(self, tiny_model, tiny_batch):
        out = make(tiny_model, "probs").query(tiny_batch)
        assert out.shape == (12, 3)
        assert torch.allclose(out.sum(1), torch.ones(12), atol=1e-6)
        assert torch.allclose(out, torch.softmax(tiny_model(tiny_batch), 1), atol=1e-6)

    def test_temperature(self, tiny_model, tiny_batch):
        out = make(tiny_model, "probs", temperature=3.0).query(tiny_batch)
        assert torch.allclose(out, torch.softmax(tiny_model(tiny_batch) / 3.0, 1), atol=1e-6)

    @pytest.mark.parametrize("k", [1, 2, 3])
    def test_topk(self, tiny_model, tiny_batch, k):
        out = make(tiny_model, "topk", top_k=k).query(tiny_batch)
        probs = torch.softmax(tiny_model(tiny_batch), 1)
        assert ((out > 0).sum(1) == k).all()
        kept = out > 0
        assert torch.allclose(out[kept], probs[kept], atol=1e-6)
        assert torch.equal(out.argmax(1), probs.argmax(1))

    def test_unknown_mode(self, tiny_model):
        with pytest.raises(InputError, match="unknown output mode"):
            make(tiny_model, "scores")

    def test_parse(self):
        assert OutputMode.parse("PROBS") is OutputMode.PROBS

    def test_defence_applies_before_mode(self, tiny_model, tiny_batch):
        def flip(probs, logits):
            return probs.flip(1)

        out = make(tiny_model, "label", defences=[flip]).query(tiny_batch)
        assert torch.equal(out, 2 - tiny_model(tiny_batch).argmax(1))


class TestValidation:
    @pytest.mark.parametrize(
        "bad, msg",
        [
            (torch.rand(1, 4, 4), "add a batch dimension"),
            (torch.rand(2, 1, 4, 5), "must have shape"),
            (torch.rand(0, 1, 4, 4), "empty batch"),
            (torch.full((2, 1, 4, 4), float("nan")), "NaN"),
            (torch.full((2, 1, 4, 4), float("inf")), "NaN or Inf"),
            (torch.full((2, 1, 4, 4), 1.5), r"\[0, 1\]"),
            (torch.full((2, 1, 4, 4), -0.2), r"\[0, 1\]"),
            (torch.ones(2, 1, 4, 4, dtype=torch.uint8), "divide integer images"),
            (np.ones((2, 1, 4, 4), dtype=np.int64), "divide integer images"),
            ([[0.0]], "torch.Tensor or numpy"),
        ],
    )
    def test_refused_and_not_charged(self, tiny_model, bad, msg):
        oracle = make(tiny_model, budget=100)
        with pytest.raises(InputError, match=msg):
            oracle.query(bad)
        assert oracle.ledger.total == 0

    def test_numpy_and_float64_accepted(self, tiny_model, tiny_batch):
        oracle = make(tiny_model)
        a = oracle.query(tiny_batch.double().numpy())
        assert torch.allclose(a, oracle.query(tiny_batch))

    def test_rounding_noise_clipped(self, tiny_model):
        # pixels a rounding error outside [0, 1] are accepted, clipped, and charged; the model sees the clipped batch
        seen = []
        handle = tiny_model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
        x = torch.full((2, 1, 4, 4), 1.0 + 1e-6)
        x[1] = -1e-6
        assert float(x.max()) > 1.0 and float(x.min()) < 0.0
        oracle = make(tiny_model, "logits")
        seen.clear()  # construction may run one forward pass to count the classes
        try:
            out = oracle.query(x)
        finally:
            handle.remove()
        assert oracle.ledger.total == 2
        assert len(seen) == 1 and float(seen[0].max()) == 1.0 and float(seen[0].min()) == 0.0
        assert torch.equal(seen[0][0], torch.ones(1, 4, 4)) and torch.equal(seen[0][1], torch.zeros(1, 4, 4))
        assert torch.allclose(out, tiny_model(x.clamp(0, 1)))


class TestLedger:
    def test_exact_counts(self, tiny_model, tiny_batch):
        oracle = make(tiny_model, budget=100)
        for n in (1, 5, 12):
            oracle.query(tiny_batch[:n])
        assert oracle.ledger.as_dict() == {"predict": 18, "explain": 0}
        assert oracle.ledger.remaining() == 82

    def test_batch_crossing_budget_refused_whole(self, tiny_model, tiny_batch):
        oracle = make(tiny_model, budget=10)
        oracle.query(tiny_batch[:8])
        with pytest.raises(BudgetExhausted) as err:
            oracle.query(tiny_batch[:3])
        assert err.value.remaining == 2 and err.value.requested == 3
        assert oracle.ledger.total == 8
        oracle.query(tiny_batch[:2])
        assert oracle.ledger.total == 10
        with pytest.raises(BudgetExhausted):
            oracle.query(tiny_batch[:1])

    def test_per_kind_budget(self):
        ledger = QueryLedger(budgets={"explain": 3})
        ledger.charge("predict", 100)
        ledger.charge("explain", 3)
        with pytest.raises(BudgetExhausted):
            ledger.charge("explain", 1)
        assert ledger.remaining("predict") is None and ledger.remaining("explain") == 0

    def test_refund_on_failure(self):
        ledger = QueryLedger(budget=5)
        with pytest.raises(RuntimeError), ledger.reserve("predict", 4):
            raise RuntimeError("model crashed")
        assert ledger.total == 0

    def test_threads_never_exceed_budget(self, tiny_model, tiny_batch):
        import threading

        oracle = make(tiny_model, budget=101)
        answered = []

        def worker():
            for _ in range(20):
                with contextlib.suppress(BudgetExhausted):
                    answered.append(oracle.query(tiny_batch[:3]).shape[0])

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(answered) == oracle.ledger.total <= 101
        assert oracle.ledger.total == 99  # 33 batches of 3 fit; the 34th would cross

    def test_log_and_state(self, tiny_model, tiny_batch, tmp_path):
        ledger = QueryLedger(budget=50, log=True, log_path=tmp_path / "q.jsonl")
        oracle = make(tiny_model, ledger=ledger)
        oracle.query(tiny_batch[:4])
        assert len(ledger.records) == 1 and ledger.records[0].n == 4
        assert (tmp_path / "q.jsonl").read_text().count("\n") == 1
        fresh = QueryLedger(budget=50)
        fresh.load_state_dict(ledger.state_dict())
        assert fresh.as_dict() == ledger.as_dict() and fresh.remaining() == 46

    @pytest.mark.parametrize("bad", [-1, 2.5])
    def test_bad_budget(self, bad):
        with pytest.raises(InputError):
            QueryLedger(budget=bad)

    def test_unknown_kind(self):
        with pytest.raises(InputError, match="unknown query kind"):
            QueryLedger().charge("gradient", 1)


class TestExplanations:
    def make(self, model, **kw):
        return LocalExplanationOracle(model, (1, 4, 4), mode="probs", **kw)

    def test_gradient_equals_autograd(self, tiny_model, tiny_batch):
        oracle = self.make(tiny_model)
        g = oracle.explain(tiny_batch, "gradient", target=1)
        x = tiny_batch.clone().requires_grad_(True)
        tiny_model(x)[:, 1].sum().backward()
        assert torch.allclose(g, x.grad, atol=1e-6)
        assert oracle.ledger.as_dict() == {"predict": 0, "explain": 12}

    def test_default_target_is_prediction_and_prob_output(self, tiny_model, tiny_batch):
        oracle = self.make(tiny_model)
        g = oracle.explain(tiny_batch, output="prob")
        pred = tiny_model(tiny_batch).argmax(1)
        x = tiny_batch.clone().requires_grad_(True)
        torch.softmax(tiny_model(x), 1).gather(1, pred[:, None]).sum().backward()
        assert torch.allclose(g, x.grad, atol=1e-6)

    def test_smoothgrad_tends_to_gradient(self, tiny_model, tiny_batch):
        oracle = self.make(tiny_model, seed=3)
        g = oracle.explain(tiny_batch, target=0)
        errs = [
            float((oracle.explain(tiny_batch, "smoothgrad", target=0, sigma=s, n_samples=20) - g).abs().max())
            for s in (0.5, 0.05, 0.005, 0.0)
        ]
        assert errs[0] > errs[1] > errs[2] > errs[3] and errs[3] < 1e-6
        assert oracle.ledger.as_dict()["explain"] == 12 * 5

    def test_bad_arguments(self, tiny_model, tiny_batch):
        oracle = self.make(tiny_model)
        with pytest.raises(InputError, match="unknown explanation method"):
            oracle.explain(tiny_batch, "lime")  # type: ignore[arg-type]
        with pytest.raises(InputError, match="target classes"):
            oracle.explain(tiny_batch, target=7)
        with pytest.raises(InputError, match="one class or one per image"):
            oracle.explain(tiny_batch, target=torch.tensor([0, 1]))
        assert oracle.ledger.total == 0

    def test_explain_budget(self, tiny_model, tiny_batch):
        oracle = LocalExplanationOracle(tiny_model, (1, 4, 4), ledger=QueryLedger(budgets={"explain": 5}))
        oracle.query(tiny_batch)
        with pytest.raises(BudgetExhausted):
            oracle.explain(tiny_batch[:6])
        oracle.explain(tiny_batch[:5])
        assert oracle.ledger.as_dict() == {"predict": 12, "explain": 5}


class TestOneRule:
    """Issue 14.3: one explanation-argument check, one budget rule, public answer path."""

    @pytest.mark.parametrize("args,name", [
        (("saliency", "logit", 10, 0.1), "method"),
        (("smoothgrad", "probs", 10, 0.1), "output"),
        (("smoothgrad", "logit", 0, 0.1), "n_samples"),
        (("smoothgrad", "logit", 257, 0.1), "n_samples"),
        (("smoothgrad", "logit", 2.0, 0.1), "n_samples"),
        (("smoothgrad", "logit", 10, 3e38), "sigma"),
        (("smoothgrad", "logit", 10, float("nan")), "sigma"),
        (("smoothgrad", "logit", 10, -0.1), "sigma"),
    ])
    def test_explain_args_checked_in_one_place(self, tiny_model, args, name):
        with pytest.raises(InputError, match=name):
            check_explain_args(*args)
        oracle = LocalExplanationOracle(tiny_model, (1, 4, 4), budget=10)
        with pytest.raises(InputError, match=name):
            oracle.explain(torch.rand(2, 1, 4, 4), args[0], output=args[1], n_samples=args[2], sigma=args[3])
        assert oracle.ledger.total == 0

    def test_budget_left_is_the_ledgers_rule(self):
        assert budget_left({"predict": 3, "explain": 2}, 10, {"explain": 4}, "explain") == 2
        assert budget_left({"predict": 3, "explain": 2}, 10, {"explain": 4}, "predict") == 5
        assert budget_left({"predict": 3}, None, {}, None) is None
        ledger = QueryLedger(budget=100)
        ledger.charge("predict", 10)
        ledger.cap_budget(5, pending=2)  # a remote ledger has 5 left after the 2 still in flight here
        assert ledger.remaining() == 3 and ledger.budget == 13
        ledger.cap_budget(1000)
        assert ledger.budget == 13  # never raised

    def test_answer_from_logits_is_what_query_answers(self, tiny_model, tiny_batch):
        oracle = make(tiny_model, mode="topk", top_k=2)
        assert torch.equal(oracle.answer_from_logits(oracle.logits(tiny_batch)), oracle.query(tiny_batch))
