"""A tiny Chinese ALBERT as the Hugging Face Hub serves the albert_chinese_* models (config.json, pytorch_model.bin,
vocab.txt), laid out in huggingface_hub's own cache (models--org--name/refs/main, snapshots/<commit>/...) so that
hub ids resolve offline."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from chinese_helpers import ZH_SENTENCES

from albert_dist.model import AlbertConfig, AlbertForPreTraining

REPO = "tiny-org/albert_chinese_tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def zh_vocab() -> list[str]:
    """BERT's specials, every character of the test sentences, and Latin word pieces for the mixed text."""
    chars = sorted({c for s in ZH_SENTENCES for c in s if not c.isascii() and not c.isspace()})
    latin = ["deep", "learning", "ray", "data", "al", "##bert", "be", "##rt", "model", "1", "2", ",", ".", "!"]
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *latin, *chars]


def tiny_model(vocab_size: int) -> AlbertForPreTraining:
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=vocab_size,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        architectures=["AlbertForPreTraining"],
    )
    return AlbertForPreTraining(config).eval()


def hub_cache(root: Path, repo: str = REPO, commit: str = COMMIT) -> AlbertForPreTraining:
    """`repo` at `commit` (also its main branch) in the cache at `root` ($HF_HUB_CACHE); returns the model it holds."""
    vocab = zh_vocab()
    model = tiny_model(len(vocab))
    snapshot = cached_snapshot(root, repo, commit)
    model.config.to_json_file(snapshot / "config.json")
    state = model.state_dict()
    state["predictions.decoder.weight"] = state["albert.embeddings.word_embeddings.weight"]  # tied, as they ship
    torch.save(state, snapshot / "pytorch_model.bin")
    (snapshot / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    return model


def cached_snapshot(root: Path, repo: str, commit: str = COMMIT, files: Path | None = None) -> Path:
    """The snapshot directory of `repo` at `commit`, also its main branch, in the cache at `root`; holding the files
    of the directory `files` when given."""
    import shutil

    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / commit
    if files is None:
        snapshot.mkdir(parents=True)
    else:
        shutil.copytree(files, snapshot)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


class HubStandIn:
    """The Hub's upload API on 127.0.0.1, as huggingface_hub calls it (repo creation, preupload, commit): every file
    is told to go inline ("regular"), so a commit carries the files' bytes, which it records; it checks the token."""

    def __init__(self, token: str):
        import base64
        import http.server
        import threading

        self.token = token
        self.repos: list[dict] = []
        self.commits: list[dict] = []  # {"repo", "summary", "files": {path: bytes}}
        self.validated: list[str] = []
        self.unknown: list[str] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["api", "repos", "create"]:
                    request = json.loads(body)
                    hub.repos.append(request)
                    name = f"{request.get('organization')}/{request['name']}"
                    return self._reply(200, {"url": f"http://127.0.0.1/{name}", "name": name})
                if parts[:2] == ["api", "validate-yaml"]:  # the card's front matter, checked before the commit
                    hub.validated.append(json.loads(body)["content"])
                    return self._reply(200, {})
                if parts[:2] == ["api", "models"] and parts[4:5] == ["preupload"]:
                    files = json.loads(body)["files"]
                    modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                    return self._reply(200, {"files": modes, "commitOid": "0" * 40})
                if parts[:2] == ["api", "models"] and parts[4:5] == ["commit"]:
                    lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                    files = {
                        line["value"]["path"]: base64.b64decode(line["value"]["content"])
                        for line in lines
                        if line["key"] == "file"
                    }
                    header = next(line["value"] for line in lines if line["key"] == "header")
                    hub.commits.append({"repo": "/".join(parts[2:4]), "summary": header["summary"], "files": files})
                    url = f"http://127.0.0.1/{'/'.join(parts[2:4])}/commit/{'1' * 40}"
                    return self._reply(200, {"commitUrl": url, "commitOid": "1" * 40, "pullRequestUrl": None})
                hub.unknown.append(f"POST {self.path}")
                return self._reply(404, {"error": f"no route {self.path}"})

            def do_GET(self):  # noqa: N802
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"})
                hub.unknown.append(f"GET {self.path}")
                return self._reply(404, {"error": f"no route {self.path}"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
