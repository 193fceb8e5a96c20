"""Issue 18, items 6, 8 (key material) and 10: the keys file is type-checked strictly, keys are hard to guess,
guessing is throttled, and budgets follow a stable key id, not the secret."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from stealkit.cli import main
from stealkit.errors import InputError
from stealkit.serve import limits
from stealkit.serve.app import create_app
from stealkit.serve.keys import legacy_hash, parse_keys
from tests.test_serve_support import make_victim, write_keys

K = "tenant-Zx81QpLw6RtV3mNb7Yc4"
K2 = "rotated-Qw3eR5tY7uI9oP1aS2"


def entry(**fields: object) -> dict:
    return {"key": [{"key": K, "name": "alice"} | fields]}


# -- item 6: strict types, bounded numbers, one line naming the entry and field ----------------------------


@pytest.mark.parametrize("data,field", [
    (entry(explain="false"), "'explain'"),
    (entry(explain=1), "'explain'"),
    ({"model": {"max_body_mb": float("inf")}} | entry(), "'max_body_mb'"),
    (entry(prada={"min_samples": "x"}), "'prada.min_samples'"),
    (entry(prada={"block": "yes"}), "'prada.block'"),
    (entry(seed="abc"), "'seed'"),
    (entry(temperature=float("inf")), "'temperature'"),
    (entry(temperature=1e-300), "'temperature'"),
    (entry(rate=float("inf")), "'rate'"),
    (entry(image_rate=float("nan")), "'image_rate'"),
    (entry(defences="round:decimals=2"), "'defences'"),
    (entry(name=["a"]), "'name'"),
    (entry(budget=True), "'budget'"),
    (entry(top_k=2.0), "'top_k'"),
    (entry(mode=3), "'mode'"),
    (entry(mode="scores"), "'mode'"),
])
def test_every_field_is_type_checked(data, field):
    with pytest.raises(InputError) as info:
        parse_keys(data)
    message = str(info.value)
    assert "key #1" in message or "[model]" in message
    assert field in message and "\n" not in message


def test_a_bad_keys_file_is_one_line_at_start_up(victim: Path, tmp_path: Path, capsys):
    keys = write_keys(tmp_path / "keys.toml", [{"key": K, "name": "alice", "explain": "false"}])
    code = main(["serve", "--model", str(victim), "--keys", str(keys), "--db", str(tmp_path / "db.sqlite")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err
    assert "key #1 ('alice'): 'explain' must be true or false" in err and len(err.splitlines()) == 1


def test_a_bad_defence_names_the_key(tmp_path: Path):
    with pytest.raises(InputError, match=r"key #1 \('alice'\): defences: unknown defence"):
        parse_keys(entry(defences=["blur"]))


# -- item 10: entropy, throttling, stable ids --------------------------------------------------------------


@pytest.mark.parametrize("secret", ["probs-key", "a" * 40, "abababababababababababab", "short-Zx81Q"])
def test_guessable_keys_are_refused_saying_why(secret):
    with pytest.raises(InputError, match=r"too easy to guess .* bits.*secrets.token_urlsafe"):
        parse_keys({"key": [{"key": secret}]})


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_victim(tmp_path_factory.mktemp("victim") / "model")


def app(victim: Path, tmp_path: Path, secret: str = K, **model: object) -> TestClient:
    keys = write_keys(tmp_path / "keys.toml", [{"key": secret, "name": "alice", "budget": 100}],
                      model=model or None)
    return TestClient(create_app(victim, keys, tmp_path / "db.sqlite"))


def test_failed_keys_are_throttled_per_address(victim: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limits, "_now", lambda: 1000.0)  # no refill between requests, however slow the machine
    client = app(victim, tmp_path)
    codes = [client.get("/v1/info", headers={"Authorization": f"Bearer guess-{i}"}).status_code for i in range(30)]
    assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}
    r = client.get("/v1/info", headers={"Authorization": f"Bearer {K}"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1  # even the right key: no oracle for guesses


def test_rotating_a_secret_keeps_the_budget(victim: Path, tmp_path: Path):
    x = np.zeros((3, 1, 8, 8)).tolist()
    client = app(victim, tmp_path)
    assert client.post("/v1/predict", json={"inputs": x}, headers={"Authorization": f"Bearer {K}"}).status_code == 200
    client = app(victim, tmp_path, secret=K2)  # same name, new secret
    info = client.get("/v1/info", headers={"Authorization": f"Bearer {K2}"}).json()
    assert info["queries_used"]["predict"] == 3 and info["queries_left"] == 97 and info["key"] == "alice"
    assert client.get("/v1/info", headers={"Authorization": f"Bearer {K}"}).status_code == 401


def test_database_of_an_older_version_is_migrated_to_key_ids(victim: Path, tmp_path: Path):
    db = tmp_path / "db.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(f"""
        CREATE TABLE keys (key_hash TEXT PRIMARY KEY, name TEXT NOT NULL, budget INTEGER, explain_budget INTEGER,
            predict_used INTEGER NOT NULL DEFAULT 0, explain_used INTEGER NOT NULL DEFAULT 0,
            flagged INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL);
        CREATE TABLE query_log (id INTEGER PRIMARY KEY AUTOINCREMENT, key_hash TEXT NOT NULL, time REAL NOT NULL,
            kind TEXT NOT NULL, n INTEGER NOT NULL, mode TEXT NOT NULL, input_digest TEXT NOT NULL,
            output_digest TEXT NOT NULL);
        INSERT INTO keys VALUES ('{legacy_hash(K)}', 'key-old', 100, NULL, 9, 0, 0, 0);
        INSERT INTO query_log (key_hash, time, kind, n, mode, input_digest, output_digest)
            VALUES ('{legacy_hash(K)}', 0, 'predict', 9, 'probs', 'a', 'b');""")
    conn.commit()
    conn.close()
    client = app(victim, tmp_path)
    info = client.get("/v1/info", headers={"Authorization": f"Bearer {K}"}).json()
    assert info["queries_used"]["predict"] == 9 and info["key"] == "alice"
    store = client.app.state.service.store
    assert store.audit()["alice"]["consistent"] and [r["n"] for r in store.log_rows("alice")] == [9]


# -- item 8: no key material stored; the database readable by its owner only -------------------------------


def test_database_holds_no_key_material_and_is_private(victim: Path, tmp_path: Path):
    client = app(victim, tmp_path)
    client.post("/v1/predict", json={"inputs": np.zeros((1, 1, 8, 8)).tolist()},
                headers={"Authorization": f"Bearer {K}"})
    db = tmp_path / "db.sqlite"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("db.sqlite*"))
    assert K.encode() not in raw and legacy_hash(K).encode() not in raw and legacy_hash(K)[:8].encode() not in raw
