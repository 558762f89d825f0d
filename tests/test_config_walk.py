"""Every key a job's config accepts is read by that job's code: the walk over every field of the registered jobs
whose keys no test proves to have an effect (sweeps, the demo); the training jobs' keys are proven to change their
plan by test_config_effect.py, data preparation's to change what it writes by test_config_effect_prepare.py, which
this name-matching walk cannot do.

The rule: a field `name` counts as read by a job when a module the job runs, outside the sections' validators, reads
`name` as an attribute (`cfg.train.name`), as a constant key (`config["name"]`, `.get("name")`,
`getattr(x, "name")`) or as one of a literal list of keys that code iterates (`for key in ("name", ...)`), the way
`model_dump()`ed sections are consumed (`ModelSection.overrides()` → AlbertConfig's attributes, `_masking_kwargs`).
The modules a job runs are its runner's and its config class's modules and, transitively, every albert_dist/jobs
module they import (at any depth, function-level imports included) or name in a "module:attr" string (the task
factories Ray Train imports). Logging every field (`flatten`, `dump_yaml`) is not a read. The rule sees names, not
owners (a job that reads `.seed` of one section counts for every `seed` it has), so what each job refuses is also
pinned by the unknown-key tests of test_config.py. No field needs an allow-list today: each one has a reader.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel, Field

from albert_dist.config import Section, TrainSection
from albert_dist.job_registry import JOBS

REPO = Path(__file__).resolve().parent.parent
VALIDATORS = {"field_validator", "model_validator"}
KEY_CALLS = {"get", "pop", "getattr", "hasattr"}


def section_fields(cls: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted path, field name) of every field of `cls` and, recursively, of its sections."""
    for name, field in cls.model_fields.items():
        path = f"{prefix}{name}"
        sections = [
            t for t in (field.annotation, *get_args(field.annotation)) if isinstance(t, type) and issubclass(t, Section)
        ]
        if sections:
            for section in sections:
                yield from section_fields(section, f"{path}.")
        else:
            yield path, name


def _is_validator(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", None)) in VALIDATORS
        for d in node.decorator_list
    )


def _constant(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _module_names(tree: ast.AST) -> set[str]:
    """The names `import x` / `import x.y as z` bind in `tree`: `functools.cache` reads no config."""
    return {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


def reads(tree: ast.AST) -> Iterator[str]:
    """The names `tree` reads in the rule's sense (validators and attributes of imported modules skipped)."""
    modules = _module_names(tree)
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_validator(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if not (isinstance(node.value, ast.Name) and node.value.id in modules):
                yield node.attr
        elif isinstance(node, ast.Subscript) and _constant(node.slice):
            yield _constant(node.slice)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in KEY_CALLS
        ):
            yield from filter(None, [_constant(node.args[0]), *map(_constant, node.args[1:2])])
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, (ast.Tuple, ast.List, ast.Set)):
            yield from filter(None, map(_constant, node.iter.elts))


REGISTRY = REPO / "albert_dist" / "job_registry.py"
#: the jobs whose keys are proven to have an effect: the training jobs' change their plan (test_config_effect.py),
#: data preparation's what it writes (test_config_effect_prepare.py)
PLANNED = {"pretrain", "finetune", "distill", "prepare_data"}
MODULE_REF = re.compile(r"^((?:albert_dist|jobs)(?:\.\w+)+)(?::\w+)?$")


def module_file(module: str) -> Path | None:
    base = REPO / module.replace(".", "/")
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def imported_files(tree: ast.AST) -> set[Path]:
    """The package's files that `tree` imports or names as "module:attr", with their packages' __init__.py."""
    modules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif (ref := MODULE_REF.match(_constant(node) or "")) is not None:
            modules.append(ref.group(1))
    parts = [m.split(".") for m in modules]
    return {f for p in parts for i in range(1, len(p) + 1) if (f := module_file(".".join(p[:i]))) is not None}


@functools.cache
def scan(path: Path) -> tuple[frozenset[str], frozenset[Path]]:
    """(names read, files imported) of one file, parsed once for all jobs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(reads(tree)), frozenset(imported_files(tree))


def names_read_by(*modules: str) -> set[str]:
    """What the files of `modules` and of everything they import read."""
    todo, seen, read = [module_file(m) for m in modules], set(), set()
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            names, imports = scan(path)
            read |= names
            todo.extend(imports - {REGISTRY})  # the list of every job: following it would make each job read all
    return read


def unread_fields(config_class: type[BaseModel], read: set[str]) -> list[str]:
    return [path for path, name in section_fields(config_class) if name not in read]


@pytest.mark.parametrize("job", [job for job in JOBS.values() if job.name not in PLANNED], ids=lambda job: job.name)
def test_every_field_of_every_job_config_is_read_by_the_job(job):
    declaration = job.load()
    kind = getattr(declaration.config_class, "kind", None)  # a sweep's trials run the job registered as its kind
    trials = [JOBS[kind].declaration.partition(":")[0]] if kind else []
    read = names_read_by(job.declaration.partition(":")[0], declaration.config_class.__module__, *trials)
    assert unread_fields(declaration.config_class, read) == []


def test_the_walk_finds_a_field_the_job_does_not_read():
    """The check can fail: a field nothing reads, in a section nested in a job config, is reported by its path;
    and data preparation does not read pretraining's data.cache (which its config once accepted)."""
    read = names_read_by("albert_dist.pretrain", "albert_dist.config")
    assert "cache" in read and "cache" not in names_read_by("albert_dist.data.prepare", "albert_dist.config")

    class Unread(TrainSection):
        never_read_by_any_job: int = 1

    class Job(Section):
        train: Unread = Field(default_factory=Unread)

    assert unread_fields(Job, read) == ["train.never_read_by_any_job"]
    assert unread_fields(Job, read | {"never_read_by_any_job"}) == []


def test_a_read_in_a_validator_alone_does_not_count():
    source = """
class S(Section):
    @model_validator(mode="after")
    def _check(self):
        return self.only_checked
def use(cfg):
    return cfg.used, cfg.settings["keyed"], [s[k] for k in ("iterated",)]
"""
    assert set(reads(ast.parse(source))) >= {"used", "keyed", "iterated"}
    assert "only_checked" not in set(reads(ast.parse(source)))


def test_an_attribute_of_an_imported_module_is_not_a_read():
    source = """
import functools
import re as regex
@functools.cache
def use(cfg):
    return regex.compile(cfg.pattern)
"""
    assert set(reads(ast.parse(source))) == {"pattern"}
