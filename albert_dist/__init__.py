"""albert-dist: pretrain, fine-tune and distill ALBERT models on Ray, tracked in MLflow (`albert-dist --help`).

The Python API (`albert_dist.api`): `pretrain`, `finetune`, `distill`, `prepare`, `predict` and `sweep`, each imported
when first used, so that `import albert_dist` loads neither torch nor Ray.
"""

from __future__ import annotations

API = ("pretrain", "finetune", "distill", "prepare", "predict", "sweep")
__all__ = [*API, "__version__"]


def __getattr__(name: str):
    if name in API:
        from albert_dist import api

        return getattr(api, name)
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("albert-dist")
        except PackageNotFoundError:  # the sources alone, e.g. as a Ray job's working_dir on a cluster
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
