"""`albert-dist config`: the job configs shipped in the package (list, show, copy one out to edit) and the JSON
schema of each job's config, generated from its pydantic model, for editors that complete and check YAML keys."""

from __future__ import annotations

import json
from pathlib import Path

from albert_dist.config import config_path, packaged_configs
from albert_dist.errors import ConfigError
from albert_dist.jobs.registry import get
from albert_dist.storage import publish_text


def listing() -> list[tuple[str, str]]:
    """(name, the first line of its leading comment) of every packaged config."""
    return [(name, _summary(path.read_text(encoding="utf-8"))) for name, path in packaged_configs().items()]


def _summary(text: str) -> str:
    first = text.splitlines()[0] if text.strip() else ""
    return first.removeprefix("#").strip() if first.startswith("#") else ""


def show(name: str) -> str:
    """The text of the packaged config `name` (or of a YAML file at that path)."""
    return config_path(name).read_text(encoding="utf-8")


def init(name: str, target: str | Path, force: bool = False) -> Path:
    """Copy the packaged config `name` to `target` to edit it; an existing file is kept unless `force`."""
    target = Path(target)
    if target.is_dir():
        target = target / f"{Path(name).name.removesuffix('.yaml')}.yaml"
    if target.exists() and not force:
        raise ConfigError(f"{target} exists; pass --force to replace it")
    return Path(publish_text(target, show(name), error=ConfigError))


def schema(job: str) -> dict:
    """The JSON schema of the config of the job `job` (a name of `albert-dist submit`), titled after it."""
    document = get(job).config_class().model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **document, "title": f"albert-dist {job}"}


def schema_text(job: str) -> str:
    return json.dumps(schema(job), indent=2, ensure_ascii=False) + "\n"
