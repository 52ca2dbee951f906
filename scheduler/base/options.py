"""Plugin-owned option and settings classes: validation of JSON objects into attrs instances.

A plugin declares its per-job options (``options_class``) and its host settings
(``settings_class``) as frozen attrs classes. Field types are read from the
annotations; supported: ``str``, ``int``, ``float``, ``bool``, ``Literal[...]``,
``list[str]`` / ``tuple[str, ...]``, ``dict[str, str]``, ``dict[str, int]`` (each value within
``minimum``/``maximum``) and ``X | None`` (settings
classes also ``SecretRef``, see ``scheduler.settings``). Field metadata may carry
``doc``, ``minimum``, ``maximum``, ``secret`` (settings) and ``check``: a callable
given the converted value that returns an error message (``INVALID_VALUE``) or None,
for value rules beyond the type (an executable path). Problems come back as the
same per-field details a job spec has (``UNKNOWN_FIELD``, ``INVALID_TYPE``...), with
the field path prefixed (``executor_options.env_policy``).
"""

from __future__ import annotations

import functools
import typing
from typing import Any, Literal, get_args, get_origin

import attrs

from scheduler.base.errors import SchedulerError

_NoneType = type(None)


@functools.lru_cache(maxsize=256)
def _hints(cls: type) -> dict[str, Any]:
    """A class's resolved field types: resolved once, because options are validated at every run start."""
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return "choice"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [a for a in args if a is not _NoneType]
        return _describe(inner[0]) if len(inner) == 1 else "value"
    if origin in (list, tuple):
        return "list"
    if origin is dict:
        return "object"
    return getattr(tp, "__name__", str(tp))


def _check(tp: Any, value: Any, path: str, meta: Any, problems: list[dict[str, str]]) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and _NoneType in args:
            return None
        inner = [a for a in args if a is not _NoneType]
        return _check(inner[0], value, path, meta, problems)
    if value is None:
        problems.append({"field": path, "code": "INVALID_TYPE", "error": "must not be null"})
        return None
    if origin is Literal:
        if value not in args:
            problems.append({"field": path, "code": "INVALID_CHOICE", "error": f"must be one of {', '.join(map(str, args))}"})
            return None
        return value
    if origin in (list, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append({"field": path, "code": "INVALID_TYPE", "error": "must be a list of strings"})
            return None
        return tuple(value) if origin is tuple else list(value)
    if origin is dict:
        if len(args) == 2 and args[1] is int:  # each value an integer, checked as an int field is
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                problems.append({"field": path, "code": "INVALID_TYPE", "error": "must be an object of integers"})
                return None
            checked = {k: _check(int, v, f"{path}.{k}", meta, problems) for k, v in value.items()}
            return checked if all(v is not None for v in checked.values()) else None
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            problems.append({"field": path, "code": "INVALID_TYPE", "error": "must be an object of strings"})
            return None
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            problems.append({"field": path, "code": "INVALID_TYPE", "error": "must be true or false"})
            return None
        return value
    if tp in (int, float):
        ok = isinstance(value, int) if tp is int else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok:
            problems.append({"field": path, "code": "INVALID_TYPE", "error": f"must be {'an integer' if tp is int else 'a number'}"})
            return None
        lo, hi = meta.get("minimum"), meta.get("maximum")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            problems.append({"field": path, "code": "OUT_OF_RANGE", "error": f"must be between {lo} and {hi}"})
            return None
        return tp(value)
    if tp is str:
        if not isinstance(value, str):
            problems.append({"field": path, "code": "INVALID_TYPE", "error": "must be a string"})
            return None
        return value
    return value


def option_problems(cls: type, raw: Any, prefix: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Check ``raw`` against ``cls``: (converted keyword arguments, per-field problems)."""
    problems: list[dict[str, str]] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return {}, [{"field": prefix, "code": "INVALID_TYPE", "error": "must be an object"}]
    fields = {f.name: f for f in attrs.fields(cls)}
    hints = _hints(cls)
    for key in raw:
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            problems.append({"field": f"{prefix}.{key}", "code": "UNKNOWN_FIELD", "error": f"unknown option {key!r} (known: {known})"})
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in raw:
            value = _check(hints[name], raw[name], f"{prefix}.{name}", f.metadata, problems)
            check = f.metadata.get("check")
            message = check(value) if check is not None and value is not None else None
            if message:
                problems.append({"field": f"{prefix}.{name}", "code": "INVALID_VALUE", "error": message})
            elif value is not None or raw[name] is None:
                kwargs[name] = value
        elif f.default is attrs.NOTHING:
            problems.append({"field": f"{prefix}.{name}", "code": "REQUIRED", "error": "is required"})
    return kwargs, problems


def build_options(cls: type, raw: Any, prefix: str) -> Any:
    """An instance of ``cls`` from a JSON object; ``VALIDATION_FAILED`` listing every problem."""
    kwargs, problems = option_problems(cls, raw, prefix)
    if not problems:
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:  # the class's own attrs validators
            problems.append({"field": prefix, "code": "INVALID_VALUE", "error": str(exc)})
    raise SchedulerError("VALIDATION_FAILED", f"invalid {prefix}: " + ", ".join(p["field"] for p in problems), details=problems)


#: The class of ``attrs.Factory(...)`` defaults (attrs' stubs type ``Factory`` as a function, so it cannot be named).
_FACTORY: Any = type(attrs.Factory(list))


def field_default(field: attrs.Attribute[Any]) -> Any:
    """A field's default value, a factory's called: the one place that tests for ``attrs.Factory``."""
    default = field.default
    return default.factory() if isinstance(default, _FACTORY) else default


def options_to_json(instance: Any) -> dict[str, Any]:
    """The JSON object stored for an options instance: only values that differ from the defaults."""
    out: dict[str, Any] = {}
    for f in attrs.fields(type(instance)):
        value = getattr(instance, f.name)
        default = field_default(f)
        if value != default:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def catalogue(cls: type) -> list[dict[str, Any]]:
    """One row per option (name, type, default, constraints, description) for ``scheduler schema``."""
    hints = _hints(cls)
    rows = []
    for f in attrs.fields(cls):
        tp = hints[f.name]
        constraints: dict[str, Any] = {}
        choices = [a for a in get_args(tp) if get_origin(tp) is Literal]
        inner = [a for a in get_args(tp) if get_origin(a) is Literal]
        if inner:
            choices = list(get_args(inner[0]))
        if choices:
            constraints["choices"] = list(choices)
        for key in ("minimum", "maximum"):
            if f.metadata.get(key) is not None:
                constraints[key] = f.metadata[key]
        default = field_default(f)
        rows.append({
            "name": f.name,
            "type": _describe(tp),
            "required": f.default is attrs.NOTHING,
            "default": None if default is attrs.NOTHING else (list(default) if isinstance(default, tuple) else default),
            "constraints": constraints,
            "description": f.metadata.get("doc", ""),
            "secret": bool(f.metadata.get("secret")),
        })
    return rows
