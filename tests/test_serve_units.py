"""Unit tests of the serving pieces: defences, keys file, SQLite store, PRADA."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stealkit.errors import BudgetExhausted, InputError
from stealkit.oracle import LocalOracle
from stealkit.serve.defences import (
    gaussian_noise,
    label_only,
    parse_defence,
    reverse_sigmoid,
    rounding,
    top_k,
)
from stealkit.serve.detection import Prada, PradaConfig
from stealkit.serve.keys import load_keys, parse_keys
from stealkit.serve.store import Store

# -- defences -------------------------------------------------------------------------------------------


def probs_strategy():
    return st.integers(1, 6).flatmap(lambda b: st.integers(2, 12).flatmap(
        lambda k: st.lists(st.floats(-8, 8), min_size=b * k, max_size=b * k).map(
            lambda v: torch.softmax(torch.tensor(v, dtype=torch.float32).reshape(b, k), dim=1))))


def art_reverse_sigmoid(preds: np.ndarray, beta: float, gamma: float) -> np.ndarray:
    """ART 1.20's ReverseSigmoid.__call__, transcribed (the reference for Lee et al.'s Eq. 3)."""
    p = np.clip(preds, 1e-9, 1 - 1e-9)
    r = beta * (1.0 / (1.0 + np.exp(gamma * np.log((1.0 - p) / p))) - 0.5)
    out = np.clip(preds - r, 0.0, 1.0)
    return out / out.sum(axis=-1, keepdims=True)


@given(probs_strategy(), st.floats(0.1, 2.0), st.floats(0.05, 1.0))
@settings(max_examples=60, deadline=None)
def test_reverse_sigmoid_matches_reference(probs, beta, gamma):
    got = reverse_sigmoid(beta, gamma)(probs, probs.log()).numpy()
    want = art_reverse_sigmoid(probs.double().numpy(), beta, gamma)
    if np.isfinite(want).all():
        assert np.allclose(got, want, atol=1e-6)
    assert np.allclose(got.sum(1), 1, atol=1e-5) and (got >= 0).all()


@given(probs_strategy())
@settings(max_examples=60, deadline=None)
def test_defences_give_valid_outputs(probs):
    logits = probs.log()
    lab = label_only()(probs, logits)
    assert torch.equal(lab.argmax(1), probs.argmax(1)) and torch.equal(lab.sum(1), torch.ones(len(probs)))
    rounded = rounding(2)(probs, logits)
    assert (rounded - probs).abs().max() <= 0.005 + 1e-6
    tk = top_k(2)(probs, logits)
    assert ((tk > 0).sum(1) <= 2).all() and torch.equal(tk.max(1).values, probs.max(1).values)
    noisy = gaussian_noise(0.05, seed=1)(probs, logits)
    assert (noisy >= 0).all() and torch.allclose(noisy.sum(1), torch.ones(len(probs)), atol=1e-5)


def test_label_only_rows_with_different_top_classes():
    """ART's ClassLabels is wrong on such batches (anchors.md); ours answers each row."""
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.2, 0.5, 0.3]])
    assert label_only()(probs, probs.log()).argmax(1).tolist() == [0, 2, 1]


def test_noise_is_seeded():
    p = torch.full((4, 5), 0.2)
    assert torch.equal(gaussian_noise(0.1, seed=3)(p, p), gaussian_noise(0.1, seed=3)(p, p))
    assert not torch.equal(gaussian_noise(0.1, seed=3)(p, p), gaussian_noise(0.1, seed=4)(p, p))


def test_parse_defence_specs():
    assert parse_defence("round:decimals=3") == rounding(3)
    assert parse_defence({"name": "reverse_sigmoid", "beta": 0.5}) == reverse_sigmoid(0.5, 0.1)
    assert parse_defence("topk:k=2") == top_k(2)
    for bad in ("blur", "round:decimals=-1", "round:digits=2", "topk:k", 3):
        with pytest.raises(InputError):
            parse_defence(bad)  # type: ignore[arg-type]


def test_defences_work_as_local_oracle_defences(tiny_model, tiny_batch):
    oracle = LocalOracle(tiny_model, (1, 4, 4), defences=[reverse_sigmoid(), rounding(3)])
    out = oracle.query(tiny_batch)
    assert torch.equal(out, torch.round(out, decimals=3))


# -- keys -----------------------------------------------------------------------------------------------

K = "a-secret-Zx81QpLw6RtV3mNb7Yc4"  # a key of enough entropy


def test_keys_file_minimal_form(tmp_path: Path):
    p = tmp_path / "keys.toml"
    p.write_text(f'[[key]]\nkey = "{K}"\nmode = "probs"\nbudget = 5000\nexplain = true\n')
    cfg = load_keys(p)
    (key,) = cfg.keys.values()
    assert key.key_id == "key1" and K not in repr(key) and K not in repr(cfg) and cfg.lookup(K) is key
    assert key.budget == 5000 and key.explain and [m.value for m in key.allowed_modes] == ["probs", "topk", "label"]


@pytest.mark.parametrize("data,match", [
    ({}, "no keys"),
    ({"key": [{"mode": "probs"}]}, "'key' must be"),
    ({"key": [{"key": K, "mode": "scores"}]}, "unknown output mode"),
    ({"key": [{"key": K, "budget": -1}]}, "budget"),
    ({"key": [{"key": K, "budget": 1.5}]}, "budget"),
    ({"key": [{"key": K, "colour": 1}]}, "unknown fields"),
    ({"key": [{"key": K}, {"key": K}]}, "twice"),
    ({"key": [{"key": K, "mode": "logits", "defences": ["round"]}]}, "defences act on probabilities"),
    ({"key": [{"key": K, "prada": {"delta": 2}}]}, "prada"),
    ({"model": {"max_batch": 0}, "key": [{"key": K}]}, "max_batch"),
    ({"keys": [], "key": [{"key": K}]}, "unknown sections"),
])
def test_keys_file_errors(data, match):
    with pytest.raises(InputError, match=match):
        parse_keys(data)


def test_keys_file_not_toml(tmp_path: Path):
    p = tmp_path / "k.toml"
    p.write_text("[[key]\nkey=")
    with pytest.raises(InputError, match="not valid TOML"):
        load_keys(p)
    with pytest.raises(InputError, match="does not exist"):
        load_keys(tmp_path / "missing.toml")


# -- store ----------------------------------------------------------------------------------------------


def store_with_key(path: Path, budget: int | None, explain_budget: int | None = None) -> tuple[Store, str]:
    cfg = parse_keys({"key": [{"key": K, "budget": budget, "explain_budget": explain_budget}
                              if explain_budget is not None else {"key": K, "budget": budget}]})
    store = Store(path)
    store.sync_keys(cfg.keys.values())
    return store, "key1"


def test_store_charges_atomically_across_threads(tmp_path: Path):
    store, h = store_with_key(tmp_path / "db.sqlite", 100)
    ok, refused = [], []

    def client(i: int) -> None:
        for j in range(20):
            try:
                store.charge(h, "predict", 3, mode="probs", input_digest=f"{i}-{j}", output_digest="o")
                ok.append(3)
            except BudgetExhausted:
                refused.append(1)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(ok) == 99 and len(refused) == 16 * 20 - 33
    u = store.usage(h)
    assert u.predict == 99 and u.left == 1
    assert sum(r["n"] for r in store.log_rows(h)) == 99 and store.audit()[h]["consistent"]


def _charge_many(path: str, h: str, n: int) -> int:
    store = Store(path)
    done = 0
    for _ in range(n):
        try:
            store.charge(h, "predict", 1, mode="label", input_digest="x", output_digest="y")
            done += 1
        except BudgetExhausted:
            pass
    return done


def test_store_charges_atomically_across_processes(tmp_path: Path):
    store, h = store_with_key(tmp_path / "db.sqlite", 150)
    ctx = mp.get_context("fork")
    with ctx.Pool(4) as pool:
        done = pool.starmap(_charge_many, [(str(tmp_path / "db.sqlite"), h, 60)] * 4)
    assert sum(done) == 150 and store.usage(h).predict == 150 and len(store.log_rows(h)) == 150


def test_store_explain_budget_and_append_only(tmp_path: Path):
    store, h = store_with_key(tmp_path / "db.sqlite", 10, explain_budget=2)
    store.charge(h, "explain", 2, mode="gradient", input_digest="a", output_digest="b")
    with pytest.raises(BudgetExhausted):
        store.charge(h, "explain", 1, mode="gradient", input_digest="a", output_digest="b")
    store.charge(h, "predict", 8, mode="probs", input_digest="a", output_digest="b")
    assert store.usage(h).left == 0
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM query_log")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE query_log SET n = 0")


def test_store_keeps_counters_across_restarts_and_budget_changes(tmp_path: Path):
    store, h = store_with_key(tmp_path / "db.sqlite", 10)
    store.charge(h, "predict", 4, mode="probs", input_digest="a", output_digest="b")
    store.close()
    store, _ = store_with_key(tmp_path / "db.sqlite", 20)
    assert store.usage(h).predict == 4 and store.usage(h).left == 16


def test_store_refuses_a_non_database(tmp_path: Path):
    p = tmp_path / "x.sqlite"
    p.write_bytes(b"hello, this is not sqlite" * 100)
    with pytest.raises(InputError, match="not a usable SQLite"):
        Store(p)
    with pytest.raises(InputError, match="does not exist"):
        Store(tmp_path / "no" / "db.sqlite")


# -- PRADA ----------------------------------------------------------------------------------------------


def run_prada(x: torch.Tensor, labels: torch.Tensor, delta: float = 0.95, batch: int = 16) -> Prada:
    det = Prada(PradaConfig(delta=delta))
    for i in range(0, len(x), batch):
        det.update(x[i : i + batch], labels[i : i + batch])
    return det


@pytest.fixture(scope="module")
def digits():
    from stealkit.data import load_splits

    return load_splits("digits")


def test_prada_natural_queries_not_flagged(digits):
    """Benign traffic: the digits test split in order (450 natural images); W stays above 0.95."""
    det = run_prada(digits.test.x, digits.test.y)
    assert not det.flagged and det.statistic is not None and det.statistic > 0.95


def test_prada_flags_jacobian_style_synthesis(digits):
    """Papernot-style synthesis: 10 seeds, then rounds of x + 0.1 sign(direction) (320 queries)."""
    g = torch.Generator().manual_seed(0)
    xs = digits.attacker_pool.x[:10]
    queries = [xs]
    for _ in range(5):
        new = (xs + 0.1 * torch.sign(torch.randn(xs.shape, generator=g))).clamp(0, 1)
        queries.append(new)
        xs = torch.cat([xs, new])
    q = torch.cat(queries)
    labels = torch.cat([digits.attacker_pool.y[:10].repeat(2**i) for i in range(6)])
    det = run_prada(q, labels)
    assert det.flagged and det.statistic < 0.95


def test_prada_batch_equals_one_by_one(digits):
    """Algorithm 1 is sequential; processing a batch at once must give the same state as one by one."""
    x, y = digits.test.x[:200], digits.test.y[:200]
    a, b = run_prada(x, y, batch=1), run_prada(x, y, batch=64)
    assert a.statistic == pytest.approx(b.statistic)
    assert sorted(a._distances) == pytest.approx(sorted(b._distances))
