"""The served model's bearer token: given in $ALBERT_DIST_SERVE_TOKEN, or made for each start and handed over in a
file only this user can read (never printed). Replicas get its SHA-256, not the token, so the secret stays in the
process that made it (Ray keeps a deployment's arguments in its control store)."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from albert_dist.storage import private_file

TOKEN_ENV = "ALBERT_DIST_SERVE_TOKEN"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def authorized(header: str | None, token_digest: str) -> bool:
    """Whether an `Authorization` header carries the bearer token whose digest is `token_digest`."""
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(digest(token.strip()), token_digest)


def serving_token() -> tuple[str, Path | None]:
    """The token, and the file it was written to (None when it came from $ALBERT_DIST_SERVE_TOKEN)."""
    given = os.environ.get(TOKEN_ENV, "").strip()
    if given:
        return given, None
    token = secrets.token_urlsafe(32)
    return token, private_file(token, "albert-serve-")
