"""What the config-effect tests share: every leaf key of a job's config, another valid value for it, and the keys
whose other value leaves a resolved plan as it is."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from albert_dist.config import Section
from albert_dist.tune.space import with_values


class Together(dict):
    """Keys set together (a key whose other value needs others)."""


def leaf_keys(cls: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, field) of every field of `cls` and, recursively, of its sections (a list of sections, as
    train.phases, is one key)."""
    for name, field in cls.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, Section):
            yield from leaf_keys(annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def other_value(field, value: Any) -> Any:
    """A valid value other than `value` for `field`, by its type; None when the type does not say one."""
    options = [field.annotation, *typing.get_args(field.annotation)]
    choices = [c for o in options if typing.get_origin(o) is typing.Literal for c in typing.get_args(o)]
    choices += [True, False] if bool in options and choices else []  # `bool | Literal["auto"]`
    if choices:
        return next((choice for choice in choices if choice != value), None)
    if value is None:
        return None
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.1
    return None


def keys_without_effect(
    plan, cfg: BaseModel, alternatives: dict[str, Any], output_only: dict[str, str], only: set[str] | None = None
) -> list[str]:
    """The keys of `cfg` (those in `only`, when given) whose other value leaves `plan(cfg).resolved()` as it is (or
    that have no other value), each with why."""
    base = plan(cfg).resolved()
    problems = []
    for key, field in leaf_keys(type(cfg)):
        if key in output_only or (only is not None and key not in only):
            continue
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        changes = alternatives.get(key)
        if key not in alternatives:
            other = other_value(field, value)
            if other is None:
                problems.append(f"{key}: no other value (add one to ALTERNATIVES)")
                continue
            changes = {key: other}
        elif not isinstance(changes, Together):
            changes = {key: changes}
        if plan(with_values(cfg, changes)).resolved() == base:
            problems.append(f"{key}: {changes} leaves the plan as it is")
    return problems
