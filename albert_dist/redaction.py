"""Secrets kept out of what the project shows and stores: parameter names that look like secrets, the user info
and secret query parameters of URLs, and URIs that carry credentials (refused, since configs are logged)."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

# Values of parameters and tags whose names look like these are never logged.
_SECRET_NAME = re.compile(r"(token|password|passwd|secret|credential|api[_-]?key|access[_-]?key)", re.I)
# The user info of a URL (`https://user:password@host`): written as *** wherever a URL is shown or logged.
_URL_USER_INFO = re.compile(r"(?P<scheme>\b[a-zA-Z][\w+.-]*://)[^/@\s]+@")
# A URL's query parameter (`?secret_key=...`): its value is written as *** when the name looks like a secret's.
_URL_QUERY_PARAM = re.compile(r"(?P<key>[?&](?P<name>[^=&#\s]+)=)[^&#\s'\"]*")


def is_secret_name(name: str) -> bool:
    """Whether a parameter or environment variable name looks like it holds a secret (token, password, key)."""
    return bool(_SECRET_NAME.search(name))


def redact(params: dict[str, Any]) -> dict[str, Any]:
    """Drop values whose key names a secret (tokens, passwords, keys) and the user info of URLs in the others."""
    return {k: ("***" if is_secret_name(k) else redact_url(v) if isinstance(v, str) else v) for k, v in params.items()}


def redact_url(text: str, mask: str = "***@") -> str:
    """`text` with the user info (`user:password@`) of every URL in it replaced by `mask`, and the values of its
    query parameters named like secrets (`?secret_key=...`) by ***."""
    text = _URL_USER_INFO.sub(lambda match: match["scheme"] + mask, text)
    return _URL_QUERY_PARAM.sub(lambda m: m["key"] + "***" if is_secret_name(m["name"]) else m[0], text)


#: pyarrow's URI options that carry credentials (`s3://bucket/x?secret_key=...`)
_URI_SECRETS = {"access_key", "secret_key", "session_token"}


def refuse_uri_credentials(location: str) -> None:
    """Refuse a URI that carries credentials: config values are logged to MLflow, stored in checkpoints and in
    the prepared data's manifest. Credentials come from the environment (AWS_ACCESS_KEY_ID, ...)."""
    if "://" not in str(location):
        return
    parts = urllib.parse.urlsplit(location)
    secrets = _URI_SECRETS & set(urllib.parse.parse_qs(parts.query))
    if "@" in parts.netloc or secrets:
        what = ", ".join(sorted(secrets)) or "user info"
        raise ValueError(
            f"the URI carries credentials ({what}): they would be logged with the config; set them "
            f"in the environment instead (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
            f"GOOGLE_APPLICATION_CREDENTIALS)"
        )
