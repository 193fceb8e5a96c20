"""``--set KEY=VALUE``: settings of a config dataclass by name, checked against the dataclass's fields.

:func:`parse_value` reads a command-line value (``true``/``false``, integers, floats, else the string);
:func:`typed_settings` checks every name against the dataclass and converts every value to its field's type
(``bool``, ``int``, ``float``, ``str``, ``Literal`` choices, enums, ``X | None`` with ``none``, and tuples
written ``a/b/c``); :func:`apply_settings` returns a config with the settings replaced, where a dotted name
(``train.epochs=5``, ``knockoff.alpha=0.2``) reaches a nested config. A wrong name or value is an
:class:`~stealkit.errors.InputError` that names the setting and says what it takes.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from stealkit.errors import InputError

T = TypeVar("T")


def parse_int_list(text: str) -> tuple[int, ...]:
    """``"50,100,200"`` -> ``(50, 100, 200)``; anything else is a one-line error."""
    try:
        values = tuple(int(float(t)) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise InputError("expected at least one integer")
    return values


def parse_value(text: str) -> Any:
    """``"true"`` -> True, ``"3"`` -> 3, ``"0.5"`` -> 0.5, anything else stays a string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def typed_settings(cls: type, settings: Mapping[str, Any], *, who: str,
                   exclude: Collection[str] = ()) -> dict[str, Any]:
    """``settings`` (flat names) converted to the types of ``cls``'s fields; unknown names are an error."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}  # type: ignore[arg-type]
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        prefixed = [k for k in unknown if "." in k and k.split(".", 1)[1] in fields]
        hint = (f" (write --set {prefixed[0].split('.', 1)[1]}=..., without the "
                f"'{prefixed[0].split('.', 1)[0]}.' prefix)" if prefixed else "")
        raise InputError(f"{who} has no setting {', '.join(unknown)}{hint}; "
                         f"valid settings: {', '.join(sorted(fields))}")
    hints = _hints(cls)
    return {k: _convert(who, k, v, hints.get(k, Any), fields[k]) for k, v in settings.items()}


def apply_settings(config: T, settings: Mapping[str, Any], *, who: str) -> T:
    """``config`` with ``settings`` replaced; ``a.b=v`` sets field ``b`` of the nested config ``a``."""
    if not settings:
        return config
    flat = {k: v for k, v in settings.items() if "." not in k}
    nested: dict[str, dict[str, Any]] = {}
    for k, v in settings.items():
        if "." in k:
            head, rest = k.split(".", 1)
            nested.setdefault(head, {})[rest] = v
    changes = typed_settings(type(config), flat, who=who)
    for head, sub in nested.items():
        inner = getattr(config, head, None)
        if not dataclasses.is_dataclass(inner) or isinstance(inner, type):
            raise InputError(f"{who} has no group of settings {head!r}; write {head}=VALUE, not {head}.NAME=VALUE")
        changes[head] = apply_settings(inner, sub, who=f"{who} {head}")
    return dataclasses.replace(config, **changes)  # type: ignore[type-var]


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation only a type checker can resolve: fall back to the defaults
        return {}


def _convert(who: str, key: str, value: Any, hint: Any, field: dataclasses.Field[Any]) -> Any:
    """``value`` as type ``hint``, or an InputError naming the setting and what it takes."""
    default = field.default if field.default is not dataclasses.MISSING else None
    if hint is Any and default is not None:
        hint = type(default)
    origin, args = typing.get_origin(hint), typing.get_args(hint)

    def bad(kind: str) -> InputError:
        example = _example(default, hint)
        tail = f" (e.g. --set {key}={example})" if example else ""
        return InputError(f"{who} setting {key} takes {kind}, got {value!r}{tail}")

    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if isinstance(value, str) and value.lower() in ("none", "null") and len(inner) < len(args):
            return None
        return _convert(who, key, value, inner[0] if len(inner) == 1 else Any, field)
    if dataclasses.is_dataclass(hint):
        raise InputError(f"{who} setting {key} is a group of settings: write {key}.NAME=VALUE")
    if hint is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise bad("a whole number")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        return float(value)
    if origin is typing.Literal:
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if text not in [str(a) for a in args]:
            raise bad(f"one of {', '.join(str(a) for a in args)}")
        return next(a for a in args if str(a) == text)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        names = [str(m.value) for m in hint]
        if str(value) not in names:
            raise bad(f"one of {', '.join(names)}")
        return hint(str(value))
    if origin is tuple:
        item = args[0] if args else Any
        kind = "numbers" if item in (int, float) else "values"
        try:
            return tuple(_convert(who, key, parse_value(t), item, field) for t in str(value).split("/"))
        except InputError:
            raise bad(f"{kind} separated by '/'") from None
    if hint is str:
        return str(value)
    return value


def _example(default: Any, hint: Any) -> str:
    if isinstance(default, tuple):
        return "/".join(str(t) for t in default)
    if isinstance(default, enum.Enum):
        return str(default.value)
    if default is not None and not dataclasses.is_dataclass(default):
        return str(default).lower() if isinstance(default, bool) else str(default)
    if typing.get_origin(hint) is typing.Literal:
        return str(typing.get_args(hint)[0])
    return ""
