"""One small registry per component kind (encoders, output layers, objectives, ...).

A registry maps a config ``kind`` to a class. ``build`` checks the user's options
against the constructor's signature *before* anything is built, so a typo, a wrong type
or a value out of range is one clear error naming the key and what is allowed.

Every numeric option declares its valid values next to the argument, as a :class:`Range`
in its annotation (``dropout: Annotated[float, Range(0, 1, high_open=True)]``, or one of
the aliases below: ``Size``, ``Probability``, ...); NaN is in no range and ±inf only in
one that says so.

Builders may pass *context* arguments (already-built submodules, the vocabulary
size, ...). A context argument is only given to constructors that accept it, and a
user may not set it from a config.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """Invalid configuration: an unknown key, a wrong type or an invalid value."""


class RangeError(ConfigError):
    """A number of the right type outside its option's :class:`Range`."""


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric option: the interval from ``low`` to ``high``.

    An end is included unless ``low_open`` / ``high_open`` says otherwise; an infinite end is
    excluded unless it says so (``Range(0)`` is [0, inf): +inf is refused). NaN is in no range.
    Written as ``[0, 1)``; a value outside is one line: ``train.lr: nan is not in (0, inf)``.
    """

    low: float = -math.inf
    high: float = math.inf
    low_open: bool | None = None  # None: open exactly when low is -inf
    high_open: bool | None = None  # None: open exactly when high is +inf
    note: str = field(default="", compare=False)  # what a special value means: "0: off"

    def __post_init__(self) -> None:
        if math.isnan(self.low) or math.isnan(self.high) or self.low > self.high:
            raise ValueError(f"not an interval: low {self.low}, high {self.high}")
        if self.low_open is None:
            object.__setattr__(self, "low_open", self.low == -math.inf)
        if self.high_open is None:
            object.__setattr__(self, "high_open", self.high == math.inf)

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        return (
            f"{'(' if self.low_open else '['}{_number(self.low)}, "
            f"{_number(self.high)}{')' if self.high_open else ']'}"
        )

    def check(self, key: str, value: float) -> None:
        """Raise :class:`RangeError` (one line naming ``key``, the value, the range) unless
        ``value`` is in this range."""
        if value not in self:
            note = f" ({self.note})" if self.note else ""
            raise RangeError(f"{key}: {value!r} is not in {self}{note}")


def _number(value: float) -> str:
    """1.0 -> "1", 2**20 -> "1048576", nan -> "nan", 1e-08 -> "1e-08"."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value)) if abs(value) < 1e16 else repr(value)
    return repr(value) if isinstance(value, float) else str(value)


MAX_SIZE = 2**20  # a width, a number of layers or positions: far beyond a model that fits memory
MAX_VOCAB = 2**24  # symbols of a vocabulary (the subword trainers abort far above it)
MAX_COUNT = 2**40  # steps, tokens, sentences: beyond any run
MAX_SEED = 2**63 - 1  # torch.manual_seed and numpy take 64-bit seeds

# the ranges most options have, named for what they are
Size = Annotated[int, Range(1, MAX_SIZE)]  # a width, a number of layers, heads, steps, ...
Count = Annotated[int, Range(0, MAX_SIZE)]  # the same where 0 is allowed (often: "off")
Seed = Annotated[int, Range(0, MAX_SEED)]
Probability = Annotated[float, Range(0, 1)]  # [0, 1]
Fraction = Annotated[float, Range(0, 1, high_open=True)]  # [0, 1): dropout, label smoothing
NonNegative = Annotated[float, Range(0)]  # [0, inf): a loss weight
Positive = Annotated[float, Range(0, low_open=True)]  # (0, inf): a scale, a temperature


def option_range(annotation: Any) -> Range | None:
    """The :class:`Range` a (possibly ``X | None`` or ``tuple[X, ...]``) annotation declares."""
    if typing.get_origin(annotation) is Annotated:
        return next((m for m in annotation.__metadata__ if isinstance(m, Range)), None)
    for arg in typing.get_args(annotation):
        found = option_range(arg)
        if found is not None:
            return found
    return None


def is_numeric(annotation: Any) -> bool:
    """Whether an annotation admits a number (int or float; bool is not a number here),
    alone, in a union or as the items of a list."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return False
    return any(is_numeric(arg) for arg in typing.get_args(annotation))


def check_type(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a type ``annotation``; return it (ints widen to floats).

    Supports the annotations configs use: bool, int, float, str, None, Literal,
    unions (``X | None``), ``list[X]`` / ``tuple[X, ...]`` / ``Sequence[X]``, ``dict`` and
    ``Annotated[X, Range(...)]`` (the value is then checked against the range too).
    """
    if annotation is Any or annotation is inspect.Parameter.empty:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        value = check_type(key, value, args[0])
        for metadata in annotation.__metadata__:
            if isinstance(metadata, Range):
                metadata.check(key, value)
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(
                f"{key}: invalid value {value!r}; allowed: {', '.join(map(repr, args))}"
            )
        return value
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return check_type(key, value, option)
            except RangeError:
                raise  # the right type, the wrong value: say which values are allowed
            except ConfigError:
                continue
        names = " or ".join(_type_name(a) for a in args)
        raise ConfigError(f"{key}: expected {names}, got {_describe(value)}")
    if origin in (list, tuple, Sequence):
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
    if typing.get_origin(annotation) is Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if annotation is type(None):
        return "none"
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(map(repr, typing.get_args(annotation)))
    return getattr(annotation, "__name__", str(annotation))


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


# a constructor's signature and annotations, read once: every config check asks for them
# (a model's components' several times), and inspect and typing take milliseconds each time
@functools.cache
def _signature(target: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(target)


@functools.cache
def _hints(target: Callable[..., Any]) -> dict[str, Any]:
    function = target.__init__ if inspect.isclass(target) else target
    return typing.get_type_hints(function, include_extras=True)


class Registry(Generic[T]):
    """Maps names to component classes of one kind."""

    instances: typing.ClassVar[list[Registry]] = []  # every registry (contract tests)

    def __init__(self, kind: str, context: tuple[str, ...] = ()) -> None:
        Registry.instances.append(self)
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
        signature = _signature(self.get(name))
        return {
            key: p
            for key, p in signature.parameters.items()
            if key not in self.context and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }

    def hints(self, name: str) -> dict[str, Any]:
        """The constructor's annotations of ``name``, with their declared ranges."""
        return _hints(self.get(name))

    def validate(self, name: str, options: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """Check ``options`` against the constructor of ``name``; return them typed."""
        allowed = self.options(name)
        hints = self.hints(name)
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
        accepted = _signature(self.get(name)).parameters
        passed = {k: v for k, v in context.items() if k in accepted}
        try:
            return self.get(name)(**passed, **checked)
        except ValueError as error:  # constructors check value ranges
            raise ConfigError(f"{prefix or self.kind}: {error}") from None
