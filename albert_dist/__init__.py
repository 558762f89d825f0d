"""albert-dist: pretrain, fine-tune and distill ALBERT models on Ray, tracked in MLflow (`albert-dist --help`).

The Python API (`albert_dist.api`): `pretrain`, `finetune`, `distill`, `prepare`, `predict` and `sweep`, each imported
when first used, so that `import albert_dist` loads neither torch nor Ray.
"""

from __future__ import annotations

import sys
import types

API = ("pretrain", "finetune", "distill", "prepare", "predict", "sweep")
__all__ = [*API, "__version__"]


class _Package(types.ModuleType):
    """The package's module. `albert_dist.pretrain` and `albert_dist.finetune` are subpackages too: importing one
    would bind its module over the API's function of that name, so the import system's binding is declined for
    those names. The subpackages stay importable by their full names (`from albert_dist.pretrain.config import
    PretrainJobConfig`, `from albert_dist.finetune import job`), though not as `import albert_dist.finetune.job as
    job`, which reads the attribute."""

    def __setattr__(self, name: str, value) -> None:
        if name in API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
