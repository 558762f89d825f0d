"""`albert-dist push --model DIR --repo ORG/NAME`: a published model or an export uploaded to the Hugging Face Hub
in one commit, through huggingface_hub (`HF_ENDPOINT` names another Hub). The token is huggingface_hub's own
(`HF_TOKEN`, else the one `hf auth login` saved): it goes to the Hub in a header and nowhere else."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from albert_dist.errors import ConfigError, HubError
from albert_dist.hub.card import CARD_NAME, MODEL_PLACEHOLDER

CONFIG_NAME = "config.json"
# what stays home: albert-dist's own bookkeeping of a published directory, an export's build leftovers
LOCAL_ONLY = ("published.json", ".build")


@dataclass
class PushPlan:
    repo: str
    private: bool
    files: dict[str, Path]  # path in the repo -> local file
    card: str | None  # README.md with the repo id in its snippets; None when the directory has no card

    def lines(self) -> list[str]:
        size = sum(path.stat().st_size for path in self.files.values())
        return [
            f"{self.repo} ({'private' if self.private else 'public'}): {len(self.files)} files, {size / 1e6:.1f} MB"
            + ("" if self.card is not None else f"; no {CARD_NAME} (model card) to describe it"),
            *(f"  {name}" for name in sorted(self.files)),
        ]


def plan_push(model_dir: str | os.PathLike, repo: str, private: bool = False) -> PushPlan:
    """What `push` uploads: every file of `model_dir` but albert-dist's bookkeeping, the card naming `repo`."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise ConfigError(f"--repo {repo!r} is not a Hugging Face Hub repo id (org/name): {err}") from None
    if "/" not in repo:
        raise ConfigError(f"--repo {repo!r}: give the namespace too (your user or organization), as org/name")
    model_dir = Path(model_dir)
    if not (model_dir / CONFIG_NAME).is_file():
        raise ConfigError(f"--model {model_dir}: not a model directory (no {CONFIG_NAME})")
    files = {
        path.relative_to(model_dir).as_posix(): path
        for path in sorted(model_dir.rglob("*"))
        if path.is_file() and not set(path.relative_to(model_dir).parts) & set(LOCAL_ONLY)
    }
    card_file = files.get(CARD_NAME)
    card = card_file.read_text(encoding="utf-8").replace(MODEL_PLACEHOLDER, repo) if card_file else None
    return PushPlan(repo, private, files, card)


def push(plan: PushPlan) -> str:
    """Create the repo if needed and upload the plan's files in one commit; returns the commit's URL."""
    from huggingface_hub import CommitOperationAdd, HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    token = get_token()
    if not token:
        raise HubError("no Hugging Face token: set HF_TOKEN, or log in once with `hf auth login`")
    api = HfApi(token=token)
    operations = [
        CommitOperationAdd(
            path_in_repo=name,
            path_or_fileobj=plan.card.encode("utf-8") if name == CARD_NAME and plan.card else str(path),
        )
        for name, path in plan.files.items()
    ]
    try:
        api.create_repo(plan.repo, private=plan.private, exist_ok=True)
        info = api.create_commit(plan.repo, operations=operations, commit_message="Upload with albert-dist push")
    except HfHubHTTPError as err:
        raise HubError(f"pushing to {plan.repo} failed: {_first_line(err)}") from None
    return info.commit_url


def _first_line(err: BaseException) -> str:
    return next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
