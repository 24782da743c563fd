"""One small registry per component kind (encoders, output layers, objectives, ...).

A registry maps a config ``kind`` to a class. ``build`` checks the user's options
against the constructor's signature *before* anything is built, so a typo or a
wrong type is one clear error naming the key and what is allowed.

Builders may pass *context* arguments (already-built submodules, the vocabulary
size, ...). A context argument is only given to constructors that accept it, and a
user may not set it from a config.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """Invalid configuration: an unknown key, a wrong type or an invalid value."""


def check_type(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a type ``annotation``; return it (ints widen to floats).

    Supports the annotations configs use: bool, int, float, str, None, Literal,
    unions (``X | None``), ``list[X]`` / ``tuple[X, ...]`` and ``dict``.
    """
    if annotation is Any or annotation is inspect.Parameter.empty:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(
                f"{key}: invalid value {value!r}; allowed: {', '.join(map(repr, args))}"
            )
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in args:
            try:
                return check_type(key, value, option)
            except ConfigError as error:
                errors.append(str(error))
        names = " or ".join(_type_name(a) for a in args)
        raise ConfigError(f"{key}: expected {names}, got {_describe(value)}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {_describe(value)}")
        item_type = args[0] if args else Any
        items = [check_type(f"{key}[{i}]", v, item_type) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or annotation is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a table, got {_describe(value)}")
        return dict(value)
    if annotation is type(None):
        if value is not None:
            raise ConfigError(f"{key}: expected none, got {_describe(value)}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {_describe(value)}")
        return float(value)
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_describe(value)}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {_describe(value)}")
        return value
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_describe(value)}")
        return value
    return value


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "none"
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(map(repr, typing.get_args(annotation)))
    return getattr(annotation, "__name__", str(annotation))


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


class Registry(Generic[T]):
    """Maps names to component classes of one kind."""

    def __init__(self, kind: str, context: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.context = context  # argument names builders supply; never user options
        self._entries: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(cls: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise ValueError(f"duplicate {self.kind} name {name!r}")
            self._entries[name] = cls
            return cls

        return decorator

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} kind {name!r}; available: {', '.join(self.names())}"
            ) from None

    def options(self, name: str) -> dict[str, inspect.Parameter]:
        """The user-settable constructor parameters of ``name`` (context excluded)."""
        signature = inspect.signature(self.get(name))
        return {
            key: p
            for key, p in signature.parameters.items()
            if key not in self.context and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }

    def validate(self, name: str, options: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """Check ``options`` against the constructor of ``name``; return them typed."""
        allowed = self.options(name)
        target = self.get(name)
        hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
        checked = {}
        for key, value in options.items():
            if key not in allowed:
                raise ConfigError(
                    f"unknown key {prefix}.{key} for {self.kind} {name!r}; "
                    f"allowed: kind, {', '.join(allowed) or '(none)'}"
                )
            checked[key] = check_type(f"{prefix}.{key}", value, hints.get(key, Any))
        missing = [k for k, p in allowed.items() if p.default is p.empty and k not in options]
        if missing:
            raise ConfigError(f"{prefix}: missing required key(s) {', '.join(missing)}")
        return checked

    def build(self, name: str, options: Mapping[str, Any], prefix: str = "", **context: Any) -> T:
        checked = self.validate(name, options, prefix or self.kind)
        accepted = inspect.signature(self.get(name)).parameters
        passed = {k: v for k, v in context.items() if k in accepted}
        try:
            return self.get(name)(**passed, **checked)
        except ValueError as error:  # constructors check value ranges
            raise ConfigError(f"{prefix or self.kind}: {error}") from None
