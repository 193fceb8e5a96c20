"""The API keys file (TOML): who may query, in which output mode, with which budget, limits and defences.

```toml
[model]                       # optional, applies to every key
defences = ["round:decimals=3"]
max_batch = 4096              # images per request
max_body_mb = 64              # request body limit
prada = { delta = 0.9, block = false }   # PRADA detection for every key (Juuti et al. 2019)

[[key]]
key = "a-secret"              # the secret itself; only its SHA-256 is kept by the server
name = "alice"                # shown in logs and /metrics (default: "key-" + first 8 hex digits of the hash)
mode = "probs"                # label | topk | probs | logits: the most the key may see
budget = 5000                 # images, all kinds together (omit for unlimited)
explain = true                # may call /v1/explain
explain_budget = 100          # optional cap on explanation queries
top_k = 3                     # classes a topk answer reveals
temperature = 1.0
rate = 50                     # requests per second (token bucket, burst = 1 s)
image_rate = 20000            # images per second
defences = ["reverse_sigmoid:beta=1.0,gamma=0.1"]
prada = { delta = 0.9, block = true }
```

Keys should be long random strings (``python -c "import secrets; print(secrets.token_urlsafe(24))"``): they
are stored as unsalted SHA-256 digests, which is safe for high-entropy secrets only.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stealkit.errors import InputError
from stealkit.oracle import OutputMode
from stealkit.serve.defences import Defence, parse_defences

#: the modes each key mode may also ask for (each is computable from the one before it)
ALLOWED: dict[OutputMode, tuple[OutputMode, ...]] = {
    OutputMode.LOGITS: (OutputMode.LOGITS, OutputMode.PROBS, OutputMode.TOPK, OutputMode.LABEL),
    OutputMode.PROBS: (OutputMode.PROBS, OutputMode.TOPK, OutputMode.LABEL),
    OutputMode.TOPK: (OutputMode.TOPK, OutputMode.LABEL),
    OutputMode.LABEL: (OutputMode.LABEL,),
}

_KEY_FIELDS = {"key", "name", "mode", "budget", "explain", "explain_budget", "top_k", "temperature", "rate",
               "image_rate", "defences", "prada", "seed"}
_MODEL_FIELDS = {"defences", "max_batch", "max_body_mb", "prada", "rate", "image_rate"}


def hash_key(secret: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PradaConfig:
    """PRADA settings: ``delta`` is the Shapiro-Wilk threshold, ``min_samples`` the distances needed first."""

    delta: float = 0.9
    min_samples: int = 100
    block: bool = False
    max_growing: int = 20000

    @classmethod
    def parse(cls, value: Any, where: str) -> PradaConfig | None:
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise InputError(f"{where}: prada must be true/false or a table like {{delta = 0.9, block = false}}")
        unknown = set(value) - {"delta", "min_samples", "block", "max_growing"}
        if unknown:
            raise InputError(f"{where}: unknown prada fields {sorted(unknown)}")
        cfg = cls(**dict(value))
        if not 0 < cfg.delta < 1 or cfg.min_samples < 3 or cfg.max_growing < 1:
            raise InputError(f"{where}: prada needs 0 < delta < 1, min_samples >= 3, max_growing >= 1")
        return cfg


@dataclass(frozen=True)
class KeyConfig:
    """One API key's permissions. ``key_hash`` identifies it; the secret itself is never kept."""

    key_hash: str
    name: str
    mode: OutputMode = OutputMode.PROBS
    budget: int | None = None
    explain: bool = False
    explain_budget: int | None = None
    top_k: int = 1
    temperature: float = 1.0
    rate: float | None = None
    image_rate: float | None = None
    defences: tuple[Defence, ...] = ()
    defence_specs: tuple[Any, ...] = ()
    prada: PradaConfig | None = None
    seed: int = 0

    @property
    def allowed_modes(self) -> tuple[OutputMode, ...]:
        return ALLOWED[self.mode]


@dataclass(frozen=True)
class ServerConfig:
    """The whole keys file: keys by hash plus model-wide limits."""

    keys: dict[str, KeyConfig]
    max_batch: int = 4096
    max_body_bytes: int = 64 * 2**20
    model_defences: tuple[Any, ...] = field(default=())


def _positive(value: Any, what: str, *, allow_none: bool = True, integer: bool = False) -> Any:
    if value is None and allow_none:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or value < 0 or value != value:
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise InputError(f"{what} must be {kind}, got {value!r}")
    return value


def parse_keys(data: Mapping[str, Any], *, source: str = "keys file") -> ServerConfig:
    """Validate a parsed keys file; every problem is an :class:`InputError` naming the key and field."""
    model = data.get("model", {})
    if not isinstance(model, Mapping):
        raise InputError(f"{source}: [model] must be a table")
    unknown = set(model) - _MODEL_FIELDS
    if unknown:
        raise InputError(f"{source}: unknown [model] fields {sorted(unknown)}; expected {sorted(_MODEL_FIELDS)}")
    top_unknown = set(data) - {"model", "key"}
    if top_unknown:
        raise InputError(f"{source}: unknown sections {sorted(top_unknown)}; expected [model] and [[key]]")
    model_defences = tuple(model.get("defences", ()))
    parse_defences(model_defences)  # validate early
    entries = data.get("key", [])
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{source}: no keys; add at least one [[key]] table with key = \"...\"")
    keys: dict[str, KeyConfig] = {}
    names: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{source}: key #{i + 1}"
        if not isinstance(entry, Mapping):
            raise InputError(f"{where} must be a table")
        unknown = set(entry) - _KEY_FIELDS
        if unknown:
            raise InputError(f"{where}: unknown fields {sorted(unknown)}; expected some of {sorted(_KEY_FIELDS)}")
        secret = entry.get("key")
        if not isinstance(secret, str) or not secret.strip():
            raise InputError(f"{where}: 'key' must be a non-empty string")
        h = hash_key(secret)
        if h in keys:
            raise InputError(f"{where}: the same key appears twice")
        name = str(entry.get("name", f"key-{h[:8]}"))
        if name in names:
            raise InputError(f"{where}: name {name!r} is used twice")
        names.add(name)
        mode = OutputMode.parse(entry.get("mode", "probs"))
        specs = model_defences + tuple(entry.get("defences", ()))
        defences = parse_defences(specs)
        if defences and mode is OutputMode.LOGITS:
            raise InputError(f"{where}: defences act on probabilities; give this key mode probs, topk or label")
        top_k = _positive(entry.get("top_k", 1), f"{where}: top_k", allow_none=False, integer=True)
        temperature = _positive(entry.get("temperature", 1.0), f"{where}: temperature", allow_none=False)
        if top_k < 1 or temperature <= 0:
            raise InputError(f"{where}: top_k must be >= 1 and temperature > 0")
        prada = PradaConfig.parse(entry.get("prada", model.get("prada")), where)
        keys[h] = KeyConfig(
            key_hash=h,
            name=name,
            mode=mode,
            budget=_positive(entry.get("budget"), f"{where}: budget", integer=True),
            explain=bool(entry.get("explain", False)),
            explain_budget=_positive(entry.get("explain_budget"), f"{where}: explain_budget", integer=True),
            top_k=top_k,
            temperature=float(temperature),
            rate=_positive(entry.get("rate", model.get("rate")), f"{where}: rate"),
            image_rate=_positive(entry.get("image_rate", model.get("image_rate")), f"{where}: image_rate"),
            defences=defences,
            defence_specs=specs,
            prada=prada,
            seed=int(entry.get("seed", 0)),
        )
    max_batch = _positive(model.get("max_batch", 4096), f"{source}: max_batch", allow_none=False, integer=True)
    body_mb = _positive(model.get("max_body_mb", 64), f"{source}: max_body_mb", allow_none=False)
    if max_batch < 1 or body_mb <= 0:
        raise InputError(f"{source}: max_batch and max_body_mb must be positive")
    return ServerConfig(keys=keys, max_batch=int(max_batch), max_body_bytes=int(body_mb * 2**20),
                        model_defences=model_defences)


def load_keys(path: str | Path) -> ServerConfig:
    """Read and validate a TOML keys file."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"keys file {p} does not exist; write one with [[key]] tables (see stealkit serve --help)")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"keys file {p} is not valid TOML: {exc}") from None
    return parse_keys(data, source=str(p))
