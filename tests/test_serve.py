"""`albert-dist serve`: one real command (its own local Ray, Ray Serve, a tiny classifier) started once for the
module and asked over real HTTP: its predictions are the `Predictor`'s (what `albert-dist predict` writes), in the
order sent, also for requests that arrive together and are predicted in one batch; no token or a wrong one is 401,
a bad body 400 with one line saying why; everything it listens on is on 127.0.0.1 (the OS's socket table); Ctrl-C
takes every process down. The request format, the listening address and the token's checks without Ray, and a
pair model's requests through the deployment's own code, are checked in-process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow_server import free_port
from process_helpers import is_loopback, listeners_of, process_tree, require_mark, wait_until_gone

from albert_dist.errors import ConfigError
from albert_dist.finetune import inference
from albert_dist.finetune.predict import Predictor
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
from albert_dist.serve import auth, protocol
from albert_dist.serve.server import ServeOptions, require_free_port
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_sentencepiece

MAX_BATCH = 16
TEXTS = [
    "the function returns a value",
    "",
    "a socket and a thread are read from the archive of names in this module " * 4,  # past the saved length
    "中文的文本也可以",
    "error",
]


def classifier_dir(directory: Path, corpus: Path) -> Path:
    """A randomly initialised classifier with its tokenizer, saved as fine-tuning saves one (large random weights:
    outputs that depend on every token)."""
    train_sentencepiece(corpus, directory, 600, progress=lambda _: None)
    torch.manual_seed(0)
    names = ["neg", "neutral", "pos"]
    config = AlbertConfig(
        vocab_size=load_tokenizer(directory).vocab_size,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=len(names),
        max_position_embeddings=128,
        id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)},
        initializer_range=0.5,
    )
    AlbertForSequenceClassification(config).save_pretrained(directory)
    load_tokenizer(directory).save(directory)
    inference.save_reading(directory, 24)
    return directory


def reference(model_dir: Path, texts: list[str], pairs: list[str] | None = None, precision: str = "fp32") -> list[dict]:
    """What `albert-dist predict` adds to each row, one object per text."""
    rows = {"text": np.array(texts, dtype=object)}
    if pairs is not None:
        rows["text_pair"] = np.array(pairs, dtype=object)
    out = Predictor(model_dir, "text", "text_pair" if pairs is not None else None, 64, precision)(rows)
    return protocol.predictions({k: v for k, v in out.items() if k not in rows}, 0, len(texts))


def assert_same_predictions(served: list[dict], expected: list[dict]) -> None:
    assert len(served) == len(expected)
    for got, want in zip(served, expected):
        assert got.keys() == want.keys()
        for name, value in want.items():
            if isinstance(value, str):
                assert got[name] == value
            else:
                assert got[name] == pytest.approx(value, abs=1e-5)


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    port: int
    token: str
    token_file: Path
    model_dir: Path
    output: list[str] = field(default_factory=list)

    def request(self, body: bytes | None = None, token: str | None = "", method: str | None = None, path: str = ""):
        """(status, decoded JSON answer) of one request; `token` "" sends the right one, None none."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token or self.token}"
        request = urllib.request.Request(self.url + path, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def predict(self, texts: list[str]) -> list[dict]:
        status, answer = self.request(json.dumps({"texts": texts}).encode())
        assert status == 200, answer
        return answer["predictions"]


@pytest.fixture(scope="module")
def server(stdlib_corpus, tmp_path_factory):
    """`albert-dist serve` in its own session (a terminal's Ctrl-C reaches its whole process group), up once its
    line says where the token is."""
    require_mark("slow", "Ray Serve")
    model_dir = classifier_dir(tmp_path_factory.mktemp("served"), stdlib_corpus)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in (auth.TOKEN_ENV, "RAY_ADDRESS")}
    process = subprocess.Popen(
        [sys.executable, "-m", "albert_dist.cli", "serve", "--model", str(model_dir), "--port", str(port)]
        + ["--precision", "fp32", "--max-batch-size", str(MAX_BATCH), "--batch-wait-ms", "300", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    output: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in process.stdout:
            output.append(line)
            if line.startswith("serving "):
                ready.set()
        ready.set()  # it ended

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(300) or process.poll() is not None:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("albert-dist serve did not come up:\n" + "".join(output)[-4000:])
    announced = next(line for line in output if line.startswith("serving "))
    token_file = Path(re.search(r"the token in (\S+) ", announced).group(1))
    yield Server(process, f"http://127.0.0.1:{port}/", port, token_file.read_text(), token_file, model_dir, output)
    if process.poll() is None:  # the Ctrl-C test did not run or failed: stop it as it stops, else kill it
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow
def test_predictions_are_predicts_in_the_order_sent(server):
    assert_same_predictions(server.predict(TEXTS), reference(server.model_dir, TEXTS))
    assert_same_predictions(server.predict(TEXTS[::-1]), reference(server.model_dir, TEXTS)[::-1])
    status, answer = server.request(b'{"texts": []}')
    assert (status, answer) == (200, {"predictions": []})


@pytest.mark.slow
def test_every_request_needs_the_token(server):
    body = json.dumps({"texts": ["a"]}).encode()
    assert server.request(body, token=None)[0] == 401
    assert server.request(body, token="not-" + server.token)[0] == 401
    assert server.request(None, token=None, method="GET")[0] == 401  # the model's description too
    assert server.request(body)[0] == 200
    # handed over in a file only its user reads, never printed
    assert server.token_file.stat().st_mode & 0o777 == 0o600
    assert server.token_file.parent.stat().st_mode & 0o777 == 0o700
    assert server.token not in "".join(server.output)


@pytest.mark.slow
def test_a_bad_request_is_a_400_saying_why_in_one_line(server):
    for body, said in [
        (b"{not json", "not JSON"),
        (b'["a", "b"]', "JSON object"),
        (b'{"text": ["a"]}', 'no "texts"'),
        (b'{"texts": "a"}', "list of strings"),
        (b'{"texts": ["a", 3]}', '"texts"[1] is int'),
        (b'{"texts": ["a"], "text_pairs": ["b"]}', "single texts"),
        (json.dumps({"texts": ["a"] * (MAX_BATCH + 1)}).encode(), f"at most {MAX_BATCH}"),
    ]:
        status, answer = server.request(body)
        assert status == 400, body
        assert said in answer["error"] and "\n" not in answer["error"]
    assert server.request(b'{"texts": ["a"]}', path="predict")[0] == 404
    assert server.request(None, method="DELETE")[0] == 405


@pytest.mark.slow
def test_requests_sent_together_are_predicted_together(server):
    requests = [[f"{TEXTS[i % len(TEXTS)]} {i}", f"socket {i}"][: 1 + i % 2] for i in range(24)]
    before = server.request(None, method="GET")[1]["requests_per_batch"]
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(server.predict, requests))
    for texts, answer in zip(requests, answers):
        assert_same_predictions(answer, reference(server.model_dir, texts))
    after = server.request(None, method="GET")[1]["requests_per_batch"]
    new = {int(size): count - before.get(size, 0) for size, count in after.items() if count > before.get(size, 0)}
    assert sum(size * count for size, count in new.items()) == len(requests)
    assert max(new) > 1, new  # a batch held several requests


@pytest.mark.slow
def test_it_listens_on_loopback_only(server):
    listeners = listeners_of(process_tree(server.process.pid))
    assert ("127.0.0.1", server.port) in {(ip, port) for ip, port, _ in listeners}
    assert [listener for listener in listeners if not is_loopback(listener[0])] == []
    # Ray Serve's replica opens a gRPC server of its own, on every interface unless kept on the node's address
    assert any("ServeReplica" in name for _, _, name in listeners)


@pytest.mark.slow
def test_ctrl_c_stops_every_process(server):
    processes = process_tree(server.process.pid)
    os.killpg(server.process.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    assert server.process.wait(timeout=120) == 0, "".join(server.output)[-4000:]
    assert wait_until_gone(processes, timeout=60) == set()
    assert "albert-dist serve: stopped" in "".join(server.output)
    assert not server.token_file.exists()
    with pytest.raises(urllib.error.URLError):
        server.request(b'{"texts": ["a"]}')


def test_the_request_format():
    assert protocol.parse_request(b'{"texts": ["a", "b"]}', pair=False, max_texts=2) == (["a", "b"], None)
    assert protocol.parse_request(b'{"texts": ["a"], "text_pairs": ["b"]}', True, 2) == (["a"], ["b"])
    for body, pair, said in [
        (b"\xff", False, "not JSON"),
        (b'{"texts": ["a"]}', True, 'no "text_pairs"'),
        (b'{"texts": ["a"], "text_pairs": "b"}', True, "list of strings"),
        (b'{"texts": ["a", "b"], "text_pairs": ["c"]}', True, "2 texts but 1 text_pairs"),
        (b'{"texts": ["a", "b", "c"]}', False, "3 texts in one request; at most 2"),
    ]:
        with pytest.raises(protocol.BadRequest, match=re.escape(said)):
            protocol.parse_request(body, pair, max_texts=2)
    columns = {"label": np.array(["x", "y"], dtype=object), "tags": np.array([np.array([1, 2]), [3]], dtype=object)}
    assert json.loads(protocol.encode({"p": protocol.predictions(columns, 0, 2)})) == {
        "p": [{"label": "x", "tags": [1, 2]}, {"label": "y", "tags": [3]}]
    }


def test_the_token_and_the_listening_address(monkeypatch):
    digest = auth.digest("secret")
    assert auth.authorized("Bearer secret", digest) and auth.authorized("bearer  secret ", digest)
    assert not any(auth.authorized(h, digest) for h in (None, "", "secret", "Basic secret", "Bearer other"))
    monkeypatch.setenv(auth.TOKEN_ENV, "given")
    assert auth.serving_token() == ("given", None)
    monkeypatch.delenv(auth.TOKEN_ENV)
    made, path = auth.serving_token()
    assert path.read_text() == made and len(made) >= 40 and auth.serving_token()[0] != made

    assert ServeOptions("m").listen_host() == "127.0.0.1"
    assert ServeOptions("m", open=True).listen_host() == "0.0.0.0"
    assert ServeOptions("m", host="::1").listen_host() == "::1"
    assert ServeOptions("m", host="10.1.2.3", open=True).listen_host() == "10.1.2.3"
    with pytest.raises(ConfigError, match="add --open"):
        ServeOptions("m", host="0.0.0.0").listen_host()
    with pytest.raises(ConfigError, match="--max-batch-size must be at least 1"):
        ServeOptions("m", max_batch_size=0).check()
    with socket.create_server(("127.0.0.1", 0)) as taken, pytest.raises(ConfigError, match="pick --port"):
        require_free_port("127.0.0.1", taken.getsockname()[1])
    with pytest.raises(ConfigError, match="--threads must be at least 1, not 0"):
        ServeOptions("m", threads=0).check()
    assert ServeOptions("m", replicas=2).replica_threads() == max(1, os.cpu_count() // 2)


def test_a_pair_model_reads_its_pairs_in_a_batch(stdlib_corpus, tmp_path):
    """A replica's batch outside Ray: a pair model's texts and pairs reach the model together, and requests
    batched together get their own rows back."""
    from albert_dist.serve.deployment import BatchPredictor, ReplicaSettings

    model_dir = classifier_dir(tmp_path / "pair", stdlib_corpus)
    model = BatchPredictor(ReplicaSettings(str(model_dir), True, auth.digest("t"), MAX_BATCH, 0.05, 1, "fp32"))
    requests = [(["socket", "thread"], ["the archive", "the parser of names"]), (["socket"], ["a value"])]
    answers = model(requests)
    for (texts, pairs), answer in zip(requests, answers):
        assert_same_predictions(answer, reference(model_dir, texts, pairs))
    assert model.requests_per_batch == {2: 1}
    swapped = reference(model_dir, ["the archive"], ["socket"])[0]["prob_pos"]
    assert swapped != pytest.approx(answers[0][0]["prob_pos"], abs=1e-4)  # the pair is read, and in its place


def test_the_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    """Before any Ray starts: a model directory that is not one, an address beyond loopback without --open."""
    from albert_dist.cli import main

    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2
    assert (
        capsys.readouterr().err == f"albert-dist: error: checkpoint directory {tmp_path / 'missing'} does not exist\n"
    )
    assert main(["serve", "--model", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "add --open" in capsys.readouterr().err
