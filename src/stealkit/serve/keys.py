"""The API keys file (TOML): who may query, in which output mode, with which budget, limits and defences.

```toml
[model]                       # optional, applies to every key
defences = ["round:decimals=3"]
max_batch = 4096              # images per request
max_body_mb = 64              # request body limit
prada = { delta = 0.9, block = false }   # PRADA detection for every key (Juuti et al. 2019)

metrics_key = "..."           # the credential of GET /metrics (without it /metrics answers 403)

[[key]]
key = "Zk3...random..."       # the secret (>= 16 characters, >= 96 bits); only an HMAC of it is kept in memory
name = "alice"                # the key's stable id: budget, log and /metrics series (default: "key<N>", N = its
                              # position in the file); rotating the secret under the same name keeps the budget
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

Keys must be long random strings (``python -c "import secrets; print(secrets.token_urlsafe(24))"``); a
guessable one is refused at start-up, saying why. The server keeps only an HMAC of each secret under a random
per-process key and never writes key material to the database, logs or metrics. Every field is type-checked
strictly (:mod:`stealkit.serve.keyfields`); a problem is one line naming the key entry and the field.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stealkit.errors import InputError
from stealkit.oracle import OutputMode
from stealkit.serve import keyfields as kf
from stealkit.serve.defences import Defence, parse_defences
from stealkit.serve.detection import PradaConfig

#: the modes each key mode may also ask for (each is computable from the one before it)
ALLOWED: dict[OutputMode, tuple[OutputMode, ...]] = {
    OutputMode.LOGITS: (OutputMode.LOGITS, OutputMode.PROBS, OutputMode.TOPK, OutputMode.LABEL),
    OutputMode.PROBS: (OutputMode.PROBS, OutputMode.TOPK, OutputMode.LABEL),
    OutputMode.TOPK: (OutputMode.TOPK, OutputMode.LABEL),
    OutputMode.LABEL: (OutputMode.LABEL,),
}

_KEY_FIELDS = {"key", "name", "mode", "budget", "explain", "explain_budget", "top_k", "temperature", "rate",
               "image_rate", "defences", "prada", "seed"}
_MODEL_FIELDS = {"defences", "max_batch", "max_body_mb", "prada", "rate", "image_rate", "metrics_key"}
#: settings the server can honour: beyond these a number is a typo or an attack on the server
MAX_BUDGET = 2**62
MAX_RATE = 1e9
TEMPERATURE_RANGE = (0.01, 100.0)  # softmax(logits / T) stays finite in float32 inside this range
MAX_BATCH = 1_000_000
MAX_BODY_MB = 4096.0
#: tables and arrays a keys file may nest: the file, [[key]], the key's table, defences, a defence table
MAX_NESTING = 6


def legacy_hash(secret: str) -> str:
    """The unsalted SHA-256 older databases used as a key's id (only to migrate them to :attr:`KeyConfig.key_id`)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class KeyConfig:
    """One API key's permissions. ``key_id`` (its name) identifies it; the secret itself is never kept."""

    key_id: str
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
    legacy_id: str = field(default="", repr=False)

    @property
    def allowed_modes(self) -> tuple[OutputMode, ...]:
        return ALLOWED[self.mode]


@dataclass(frozen=True)
class ServerConfig:
    """The whole keys file: keys by id, the HMAC digests that authenticate them, and model-wide limits.

    ``max_body_bytes`` is ``None`` when the file sets no ``max_body_mb``: the server then derives the limit
    from its model's largest legal batch.
    """

    keys: dict[str, KeyConfig]
    max_batch: int = 4096
    max_body_bytes: int | None = None
    model_defences: tuple[Any, ...] = field(default=())
    metrics_digest: str | None = field(default=None, repr=False)
    _digests: dict[str, str] = field(default_factory=dict, repr=False)
    _secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def digest(self, token: str) -> str:
        """HMAC-SHA256 of a presented secret under this process's random key."""
        return hmac.new(self._secret, token.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def lookup(self, token: str) -> KeyConfig | None:
        """The key whose secret is ``token``, or ``None``."""
        key_id = self._digests.get(self.digest(token))
        return None if key_id is None else self.keys[key_id]

    def is_metrics_key(self, token: str) -> bool:
        return self.metrics_digest is not None and hmac.compare_digest(self.digest(token), self.metrics_digest)


def _optional(value: Any, read: Any, *args: Any) -> Any:
    return None if value is None else read(value, *args)


def _parse_key(entry: Mapping[str, Any], where: str, index: int, model: Mapping[str, Any],
               model_defences: tuple[Any, ...]) -> tuple[KeyConfig, str]:
    """One ``[[key]]`` table: the key's config and its secret."""
    unknown = set(entry) - _KEY_FIELDS
    if unknown:
        raise InputError(f"{where}: unknown fields {sorted(unknown)}; expected some of {sorted(_KEY_FIELDS)}")
    secret = kf.secret(entry.get("key"), f"{where}: 'key'")
    name = kf.text(entry.get("name", f"key{index}"), f"{where}: 'name'", pattern_chars=kf.NAME_CHARS)
    where = f"{where} ({name!r})"
    try:
        mode = OutputMode.parse(kf.text(entry.get("mode", "probs"), f"{where}: 'mode'"))
    except InputError as exc:
        raise InputError(f"{where}: 'mode': {exc}" if "'mode'" not in str(exc) else str(exc)) from None
    specs = model_defences + kf.string_list(entry.get("defences", []), f"{where}: 'defences'")
    try:
        defences = parse_defences(specs)
    except InputError as exc:
        raise InputError(f"{where}: defences: {exc}") from None
    if defences and mode is OutputMode.LOGITS:
        raise InputError(f"{where}: defences act on probabilities; give this key mode probs, topk or label")
    lo, hi = TEMPERATURE_RANGE
    key = KeyConfig(
        key_id=name,
        name=name,
        mode=mode,
        budget=_optional(entry.get("budget"), kf.integer, f"{where}: 'budget'", 0, MAX_BUDGET),
        explain=kf.boolean(entry.get("explain", False), f"{where}: 'explain'"),
        explain_budget=_optional(entry.get("explain_budget"), kf.integer, f"{where}: 'explain_budget'", 0, MAX_BUDGET),
        top_k=kf.integer(entry.get("top_k", 1), f"{where}: 'top_k'", 1, 100_000),
        temperature=kf.number(entry.get("temperature", 1.0), f"{where}: 'temperature'", lo, hi),
        rate=_optional(entry.get("rate", model.get("rate")), kf.number, f"{where}: 'rate'", 0.0, MAX_RATE),
        image_rate=_optional(entry.get("image_rate", model.get("image_rate")), kf.number, f"{where}: 'image_rate'",
                             0.0, MAX_RATE),
        defences=defences,
        defence_specs=specs,
        prada=PradaConfig.parse(entry.get("prada", model.get("prada")), where),
        seed=kf.integer(entry.get("seed", 0), f"{where}: 'seed'", 0, 2**63 - 1),
        legacy_id=legacy_hash(secret),
    )
    return key, secret


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
    model_defences = kf.string_list(model.get("defences", []), f"{source}: [model] 'defences'")
    try:
        parse_defences(model_defences)  # validate early
    except InputError as exc:
        raise InputError(f"{source}: [model] defences: {exc}") from None
    entries = data.get("key", [])
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{source}: no keys; add at least one [[key]] table with key = \"...\"")
    config = ServerConfig(keys={})
    for i, entry in enumerate(entries):
        where = f"{source}: key #{i + 1}"
        if not isinstance(entry, Mapping):
            raise InputError(f"{where} must be a table")
        key, secret = _parse_key(entry, where, i + 1, model, model_defences)
        digest = config.digest(secret)
        if digest in config._digests:
            raise InputError(f"{where}: the same secret appears twice")
        if key.key_id in config.keys:
            raise InputError(f"{where}: name {key.name!r} is used twice")
        config.keys[key.key_id] = key
        config._digests[digest] = key.key_id
    max_batch = kf.integer(model.get("max_batch", 4096), f"{source}: [model] 'max_batch'", 1, MAX_BATCH)
    body_mb = _optional(model.get("max_body_mb"), kf.number, f"{source}: [model] 'max_body_mb'", 0.0, MAX_BODY_MB)
    if body_mb is not None and body_mb <= 0:
        raise InputError(f"{source}: [model] max_body_mb must be positive, got {body_mb:g}")
    metrics_key = model.get("metrics_key")
    metrics_digest = None
    if metrics_key is not None:
        metrics_digest = config.digest(kf.secret(metrics_key, f"{source}: [model] 'metrics_key'"))
        if metrics_digest in config._digests:
            raise InputError(f"{source}: [model] metrics_key must differ from every [[key]] secret")
    return ServerConfig(keys=config.keys, max_batch=max_batch,
                        max_body_bytes=None if body_mb is None else int(body_mb * 2**20),
                        model_defences=model_defences, metrics_digest=metrics_digest,
                        _digests=config._digests, _secret=config._secret)


def load_keys(path: str | Path) -> ServerConfig:
    """Read and validate a TOML keys file."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"keys file {p} does not exist; write one with [[key]] tables (see stealkit serve --help)")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"keys file {p} is not valid TOML: {exc}") from None
    except RecursionError:
        raise InputError(f"keys file {p} nests arrays or tables too deeply to read") from None
    depth = _depth(data)
    if depth > MAX_NESTING:
        raise InputError(f"keys file {p} nests arrays or tables {depth} levels deep; at most {MAX_NESTING} are "
                         "meaningful ([[key]] tables holding prada and defence tables)")
    return parse_keys(data, source=str(p))


def _depth(value: Any, level: int = 0) -> int:
    """How deeply ``value`` nests tables and arrays (stops counting past :data:`MAX_NESTING`)."""
    if level > MAX_NESTING or not isinstance(value, dict | list):
        return level
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(v, level + 1) for v in items), default=level + 1)
