"""A corpus present on every machine that no one here wrote: the docstrings of the Python standard library.

Each module, class or function docstring becomes one document (paragraphs joined), so the text has real document
structure and real sentence order for sentence-order prediction.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
import warnings
from pathlib import Path

from albert_dist.storage import publish_text

# Modules that print, open windows or have import-time side effects.
_SKIP = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "test",
    "lib2to3",
    "ensurepip",
    "venv",
    "pydoc_data",
    "xxsubtype",
    "xxlimited",
    "_xxtestfuzz",
    "__main__",
    "__phello__",
}


def _stdlib_module_names() -> list[str]:
    names = sorted(getattr(sys, "stdlib_module_names", ()))
    if not names:  # Python < 3.10
        names = sorted(m.name for m in pkgutil.iter_modules() if not m.name.startswith("_"))
    return [n for n in names if n not in _SKIP and not n.startswith("_")]


def _own_members(namespace: dict, module_name: str):
    for _, member in sorted(namespace.items()):
        if (inspect.isclass(member) or inspect.isfunction(member)) and getattr(member, "__module__", "") == module_name:
            yield member


def _docstrings(module) -> list[str]:
    """The module's docstring, then each of its classes and functions, each class followed by its methods."""
    docs = [module.__doc__ or ""]
    for member in _own_members(vars(module), module.__name__):
        docs.append(member.__doc__ or "")
        if inspect.isclass(member):
            docs.extend(m.__doc__ or "" for m in _own_members(vars(member), module.__name__))
    return [inspect.cleandoc(d) for d in docs if isinstance(d, str) and len(d) > 80]


def _to_prose(doc: str) -> str:
    """Keep prose paragraphs; drop code examples (doctest lines, indented blocks) and collapse whitespace."""
    lines = [ln for ln in doc.splitlines() if not ln.startswith((">>>", "...", "    ", "\t"))]
    return re.sub(r"\s+", " ", " ".join(lines)).strip()


def stdlib_documents(max_chars: int | None = None) -> list[str]:
    """Docstrings of the standard library as documents of prose, deterministic order."""
    documents: list[str] = []
    total = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _stdlib_module_names():
            try:
                module = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - platform-specific modules simply are not part of the corpus
                continue
            for doc in _docstrings(module):
                text = _to_prose(doc)
                if len(text) < 80:
                    continue
                documents.append(text)
                total += len(text)
                if max_chars is not None and total >= max_chars:
                    return documents
    return documents


def write_stdlib_corpus(path: str | Path, max_chars: int | None = 2_000_000) -> Path:
    """Write the documents, one per blank-line separated block (format `blocks`), atomically."""
    return publish_text(path, "\n\n".join(stdlib_documents(max_chars)) + "\n")
