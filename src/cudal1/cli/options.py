"""Command-line options generated from config fields (as TRL's HfArgumentParser does for its dataclasses).

A command lists the fields it offers (`Field`); `config_options` adds one Typer option per field to the
command's signature (name `--timeout-s` from `timeout_s`, the field's type and default, the help of its
`metadata`) and hands the command their values as one dict, keyed by field name. The help text therefore has
one source, the config; `options_of` tells tests which options were generated from which field.

    @config_options(EvalConfig, EVAL_FIELDS, into="evaluation")
    def eval_command(candidate: Path = ..., evaluation: dict[str, Any] = None) -> None:
        cfg = EvalConfig(**evaluation)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import typer

from cudal1.core.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Field:
    """One config field offered as an option: `decls` its names (default `--field-name`), `settings` click's
    (`min`, `callback`, ...); a float option is checked to be finite unless it has its own callback."""

    name: str
    decls: tuple[str, ...] = ()
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def flags(self) -> tuple[str, ...]:
        return self.decls or ("--" + self.name.replace("_", "-"),)


def opt(name: str, *decls: str, **settings: Any) -> Field:
    """`Field(name, decls, settings)`: `opt("correctness_trials", "--trials", min=1)`."""
    return Field(name, tuple(decls), settings)


def field_help(cls: type, name: str) -> str:
    """The help text of one config field (its `metadata["help"]`)."""
    found = {f.name: f for f in dataclasses.fields(cls)}[name]
    return str(found.metadata.get("help", ""))


def finite(value: float | None) -> float | None:
    """A callback for every float option: `nan` and `inf` parse as floats, and pass a `min=` bound (inf) or
    every later comparison (nan)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value:g} is not a finite number")
    return value


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _option(cls: type, spec: Field, hints: dict[str, Any]) -> tuple[Any, Any]:
    """(annotation, typer.Option) of one field."""
    field = {f.name: f for f in dataclasses.fields(cls)}[spec.name]
    annotation = hints[spec.name]
    settings = dict(spec.settings)
    if float in typing.get_args(annotation) or annotation is float:
        settings.setdefault("callback", finite)
    default = settings.pop("default", _default(field))
    return annotation, typer.Option(default, *spec.flags, help=field_help(cls, spec.name), **settings)


def config_options(cls: type, fields: Sequence[Field], *, into: str) -> Callable[[F], F]:
    """Decorate a command: add an option per field of `cls` in `fields`, and pass their values to the command's
    parameter `into` as {field name: value}. Stacks (one decorator per config)."""
    hints = typing.get_type_hints(cls)

    def decorate(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != into]
        if len(own) == len(signature.parameters):
            raise TypeError(f"{func.__name__} has no parameter {into!r} for the options of {cls.__name__}")
        added = {f"{into}__{spec.name}": (spec.name, *_option(cls, spec, hints)) for spec in fields}
        params = [*own, *(inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=option,
                                            annotation=annotation)
                          for param, (_, annotation, option) in added.items())]

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(param) for param, (name, _, _) in added.items()}
            return func(*args, **kwargs, **{into: values})

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        generated = getattr(func, "__config_options__", {})
        command.__config_options__ = {**generated, **{param: (cls, name) for param, (name, _, _) in  # type: ignore[attr-defined]
                                                     added.items()}}
        return command  # type: ignore[return-value]

    return decorate


def options_of(callback: Callable[..., Any]) -> dict[str, tuple[type, str]]:
    """The generated options of a command: {click parameter name: (config class, field name)}."""
    return dict(getattr(callback, "__config_options__", {}))


def parse_sets(cls: type, items: Iterable[str], option: str = "--set") -> dict[str, Any]:
    """`KEY=VALUE` strings -> overrides of `cls`'s scalar fields, each value converted to the field's type
    (`none`/`null` for a field that may be None). `ConfigError` naming `option` for a bad one."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if _scalar(hints[f.name]) is not None}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key, raw = key.strip().replace("-", "_"), raw.strip()
        if not sep or key not in fields:
            raise ConfigError(f"bad {option} {item!r}: use KEY=VALUE with KEY one of {', '.join(sorted(fields))}")
        kind, optional = _scalar(hints[key]) or (str, False)
        try:
            if raw.lower() in ("none", "null") and optional:
                value: Any = None
            elif kind is bool:
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                value = raw.lower() in ("true", "1", "yes")
            else:
                value = kind(raw)
        except ValueError:
            raise ConfigError(f"bad value for {option} {key}: {raw!r}") from None
        out[key] = value
    return out


def _scalar(annotation: Any) -> tuple[type, bool] | None:
    """(bool, int, float or str; whether None is allowed) of a field's type, None for any other type."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, _union_type()) else ()
    kinds = [a for a in args if a is not type(None)] if args else [annotation]
    if len(kinds) == 1 and kinds[0] in (bool, int, float, str):
        return kinds[0], type(None) in args
    return None


def _union_type() -> Any:
    import types

    return types.UnionType
