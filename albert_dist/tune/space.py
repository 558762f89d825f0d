"""Search spaces: `{dotted.field: {distribution: args}}` checked against the job config before any trial runs.

A space is valid when every key names a field of the job config, every distribution is known and well formed,
and the job config accepts the extreme values of each distribution (both bounds, every choice), so that no trial
can fail on a sampled value the config rejects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_origin

from pydantic import BaseModel, ValidationError

from albert_dist.config import format_validation_error

KINDS = ("loguniform", "uniform", "choice", "randint")


@dataclass(frozen=True)
class Distribution:
    kind: str
    args: tuple

    def to_tune(self):
        from ray import tune

        if self.kind == "choice":
            return tune.choice(list(self.args))
        return getattr(tune, self.kind)(*self.args)

    def probes(self) -> list[Any]:
        """Values that must all be valid: the bounds (randint's upper bound is exclusive) or every choice."""
        if self.kind == "choice":
            return list(self.args)
        lo, hi = self.args
        return [lo, hi - 1] if self.kind == "randint" else [lo, hi]


def parse(name: str, spec: Any) -> Distribution:
    """One distribution; ValueError names the parameter and what is wrong."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ValueError(f"{name}: expected one distribution as {{kind: args}}, e.g. {{loguniform: [1e-5, 1e-4]}}")
    ((kind, args),) = spec.items()
    if kind not in KINDS:
        raise ValueError(f"{name}: unknown distribution {kind!r} (use {', '.join(KINDS)})")
    if not isinstance(args, list) or not args:
        raise ValueError(f"{name}: {kind} takes a list, got {args!r}")
    if kind == "choice":
        return Distribution(kind, tuple(args))
    number = int if kind == "randint" else (int, float)
    if len(args) != 2 or not all(isinstance(a, number) and not isinstance(a, bool) for a in args):
        raise ValueError(f"{name}: {kind} takes [lo, hi] {'integers' if kind == 'randint' else 'numbers'}, got {args}")
    lo, hi = args
    if lo >= hi:
        raise ValueError(f"{name}: {kind} needs lo < hi, got [{lo}, {hi}]")
    if kind == "loguniform" and lo <= 0:
        raise ValueError(f"{name}: loguniform bounds must be > 0, got [{lo}, {hi}]")
    return Distribution(kind, (lo, hi))


def is_field(model: type[BaseModel], path: str) -> bool:
    """Whether `path` ("section.field", or "section.mapping.key" for a dict field) is a leaf of `model`."""
    node: Any = model
    parts = path.split(".")
    for i, part in enumerate(parts):
        if node is dict:
            return i == len(parts) - 1
        if not (isinstance(node, type) and issubclass(node, BaseModel)) or part not in node.model_fields:
            return False
        annotation = node.model_fields[part].annotation
        node = get_origin(annotation) or annotation
    return not (isinstance(node, type) and issubclass(node, BaseModel))


def with_values(job: BaseModel, values: dict[str, Any], **sections: dict[str, Any]) -> BaseModel:
    """A copy of `job` with dotted fields set to `values` and sections updated by `sections`; raises
    pydantic's ValidationError when the job config rejects the result."""
    raw = job.model_dump()
    for section, updates in sections.items():
        raw[section].update(updates)
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = raw
        for part in parents:
            node = node[part]
        node[leaf] = value
    return type(job).model_validate(raw)


def check(job: BaseModel, search_space: dict[str, Any]) -> dict[str, Distribution]:
    """The parsed space; ValueError lists every problem (unknown field, bad distribution, rejected value)."""
    problems, space = [], {}
    for name, spec in search_space.items():
        if not is_field(type(job), name):
            problems.append(f"{name}: not a field of {type(job).__name__}")
            continue
        try:
            space[name] = parse(name, spec)
        except ValueError as err:
            problems.append(str(err))
            continue
        for value in space[name].probes():
            try:
                with_values(job, {name: value})
            except ValidationError as err:
                problems.append(f"{name}={value!r} is rejected by the job config: {format_validation_error(err)}")
                break
    if not search_space:
        problems.append("empty: give at least one parameter")
    if problems:
        raise ValueError("; ".join(problems))
    return space
