"""`albert-dist serve`'s deployment against a transformers `pipeline("text-classification")`, both behind the same
HTTP server: one Ray Serve (started as every command starts Ray: 127.0.0.1, a token), one route each, the same
JSON in and out, the same bearer-token check, the same request batching (`@serve.batch`, the same batch size and
wait), the same torch threads per replica and the same weights: a randomly initialised classifier of
albert_chinese_tiny's shape (our `tiny` preset) with a WordPiece vocabulary trained on the corpus, saved by us and
loaded by transformers from that directory.

    apt-get install manpages-zh                     # the request texts: Chinese manual-page paragraphs
    pip install -e .[bench]                         # transformers
    python benchmarks/bench_serve.py                # 3 rounds of load; --quick: 1 short round

Latency one request at a time (one text each; p50 and p99 of `--requests` requests a side), the sides taking turns
request by request; throughput at saturation (`--clients` client threads, each sending `--texts-per-request` texts
per request on its own keep-alive connection, for `--seconds`), the sides taking turns round by round, the median of
the rounds. Throughput is cross-checked against Little's law: texts in flight over the mean latency the clients saw.
The ratios read "ours is N times better": theirs' latency over ours, ours' throughput over theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import os
import platform
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

MAX_LENGTH = 128  # the truncation length saved with the model; transformers' pipeline truncates at the same
LABELS = ("neg", "pos")


def request_texts(count: int) -> list[str]:
    """Chinese paragraphs of Debian's manual pages, cut to 10-120 characters: short texts, as classified online."""
    from corpora import documents

    texts = []
    for document in documents("zh-manpages"):
        for line in document.splitlines():
            line = line.strip()
            if len(line) >= 10:
                texts.append(line[: 10 + (len(texts) * 37) % 111])
            if len(texts) == count:
                return texts
    return texts


def build_model(work: Path) -> Path:
    """The classifier, its WordPiece vocabulary trained on every page of the corpus."""
    import torch
    from corpora import documents

    from albert_dist.finetune import inference
    from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_wordpiece

    model_dir = work / "model"
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(documents("zh-manpages")), encoding="utf-8")
    train_wordpiece(corpus, model_dir, 8000, progress=lambda _: None)
    torch.manual_seed(0)
    config = AlbertConfig.from_preset(
        "tiny",
        vocab_size=load_tokenizer(model_dir).vocab_size,
        max_position_embeddings=512,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={name: i for i, name in enumerate(LABELS)},
    )
    AlbertForSequenceClassification(config).save_pretrained(model_dir)
    load_tokenizer(model_dir).save(model_dir)
    inference.save_reading(model_dir, MAX_LENGTH)
    return model_dir


def pipeline_deployment():
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    from albert_dist.serve import auth, protocol

    @serve.deployment
    class PipelineModel:
        """transformers' pipeline behind the same request handling as ours: token, JSON, batching, answers."""

        def __init__(self, model_dir: str, token_digest: str, max_batch_size: int, batch_wait_s: float, threads: int):
            import torch
            import transformers

            torch.set_num_threads(threads)
            self.pipe = transformers.pipeline(
                "text-classification", model=model_dir, device="cpu", top_k=None, truncation=True
            )
            self.pipe.tokenizer.model_max_length = MAX_LENGTH
            self.token_digest, self.max_batch_size = token_digest, max_batch_size
            self.predict_batch.set_max_batch_size(max_batch_size)
            self.predict_batch.set_batch_wait_timeout_s(batch_wait_s)

        async def __call__(self, request: Request) -> Response:
            if not auth.authorized(request.headers.get("authorization"), self.token_digest):
                return Response(protocol.encode({"error": "token"}), status_code=401)
            try:
                texts, _ = protocol.parse_request(await request.body(), False, self.max_batch_size)
            except protocol.BadRequest as err:
                return Response(protocol.encode({"error": str(err)}), status_code=400)
            body = {"predictions": await self.predict_batch(texts) if texts else []}
            return Response(protocol.encode(body), media_type="application/json")

        @serve.batch(batch_size_fn=lambda items: sum(len(texts) for texts in items))
        async def predict_batch(self, requests: list[list[str]]) -> list[list[dict]]:
            flat = [text for texts in requests for text in texts]
            scores = await asyncio.to_thread(self.pipe, flat, batch_size=len(flat))
            rows = [
                {
                    "predicted_label": max(row, key=lambda s: s["score"])["label"],
                    **{f"prob_{s['label']}": s["score"] for s in row},
                }
                for row in scores
            ]
            answers, start = [], 0
            for texts in requests:
                answers.append(rows[start : start + len(texts)])
                start += len(texts)
            return answers

    return PipelineModel


class Client:
    """One keep-alive HTTP connection to a route."""

    def __init__(self, port: int, route: str, token: str):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.route, self.headers = route, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def predict(self, texts: list[str]) -> list[dict]:
        self.connection.request("POST", self.route, json.dumps({"texts": texts}), self.headers)
        response = self.connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{self.route}: {response.status} {body[:200]!r}")
        return json.loads(body)["predictions"]


def latencies(port: int, routes: dict[str, str], token: str, texts: list[str], requests: int) -> dict[str, list[float]]:
    """Seconds of each side's requests, one at a time, the sides taking turns request by request: whatever else
    loads the machine meanwhile slows both alike."""
    clients = {side: Client(port, route, token) for side, route in routes.items()}
    seconds: dict[str, list[float]] = {side: [] for side in routes}
    for i in range(requests):
        for side, client in clients.items():
            start = time.perf_counter()
            client.predict([texts[i % len(texts)]])
            seconds[side].append(time.perf_counter() - start)
    return seconds


def throughput(
    port: int, route: str, token: str, texts: list[str], clients: int, duration: float, per_request: int
) -> dict:
    """Texts per second with `clients` threads sending `per_request` texts per request until `duration` ends."""
    done, latencies = [0] * clients, [[] for _ in range(clients)]
    start = time.perf_counter()
    stop_at = start + duration

    def work(i: int) -> None:
        client = Client(port, route, token)
        n = i * per_request
        while time.perf_counter() < stop_at:
            began = time.perf_counter()
            client.predict([texts[(n + k) % len(texts)] for k in range(per_request)])
            latencies[i].append(time.perf_counter() - began)
            done[i] += per_request
            n += clients * per_request

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    mean_latency = statistics.fmean([s for per_client in latencies for s in per_client])
    return {"texts_per_s": sum(done) / elapsed, "littles_law_per_s": clients * per_request / mean_latency}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_line() -> str:
    info = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    marks = [flag for flag in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if flag in flags]
    return f"{model}, {os.cpu_count()} CPUs, flags {' '.join(marks)}, load average {os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="of concurrent load per side, taking turns")
    parser.add_argument("--requests", type=int, default=300, help="a side, one at a time, for the latency")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients, for the throughput")
    parser.add_argument("--texts-per-request", type=int, default=1, help="of the concurrent clients")
    parser.add_argument("--seconds", type=float, default=10.0, help="of concurrent load per side and round")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each side's replica")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=10.0)
    parser.add_argument("--precision", default="fp32", help="ours (theirs computes in fp32): fp32, auto, bf16")
    parser.add_argument("--port", type=int, default=8231)
    parser.add_argument("--quick", action="store_true", help="1 round, 60 requests a side, 5 s of load")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests, args.seconds = 1, 60, 5.0

    import torch
    import transformers
    from ray import serve

    from albert_dist.cluster.ray_init import ensure_ray
    from albert_dist.serve import auth
    from albert_dist.serve.deployment import ReplicaSettings, ServedModel

    texts = request_texts(2000)
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    model_dir = build_model(work)
    token = secrets.token_urlsafe(32)
    digest, wait_s = auth.digest(token), args.batch_wait_ms / 1000
    print(f"machine: {cpu_line()}; torch {torch.__version__}, transformers {transformers.__version__}")
    print(
        f"model: tiny preset, vocab {json.loads((model_dir / 'config.json').read_text())['vocab_size']}, "
        f"texts of {min(map(len, texts))}-{max(map(len, texts))} characters, truncated at {MAX_LENGTH} tokens; "
        f"{args.threads} threads a side, batches of up to {args.max_batch_size} texts, {args.batch_wait_ms:g} ms wait; "
        f"ours in {args.precision}, theirs in fp32"
    )
    ensure_ray()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    # one CPU each in Ray's books, so both fit a 2-CPU machine; the torch threads are set in the replicas
    options = dict(num_replicas=1, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=2 * args.max_batch_size)
    settings = ReplicaSettings(str(model_dir), False, digest, args.max_batch_size, wait_s, args.threads, args.precision)
    serve.run(ServedModel.options(**options).bind(settings), name="ours", route_prefix="/ours")
    theirs = pipeline_deployment().options(**options)
    serve.run(
        theirs.bind(str(model_dir), digest, args.max_batch_size, wait_s, args.threads),
        name="theirs",
        route_prefix="/theirs",
    )
    routes = {"ours": "/ours", "theirs": "/theirs"}
    same = [Client(args.port, route, token).predict(texts[:8]) for route in routes.values()]
    agree = sum(a["predicted_label"] == b["predicted_label"] for a, b in zip(*same))
    gap = max(abs(a["prob_pos"] - b["prob_pos"]) for a, b in zip(*same))
    print(f"same answers: {agree}/8 labels agree, largest probability gap {gap:.2e}")

    latencies(args.port, routes, token, texts, 20)  # warm-up
    seconds = latencies(args.port, routes, token, texts, args.requests)
    results: dict[str, dict[str, list[float]]] = {side: {} for side in routes}
    for side, values in seconds.items():
        results[side] = {"p50_ms": [1000 * percentile(values, 0.5)], "p99_ms": [1000 * percentile(values, 0.99)]}
        print(
            f"{side:>6}, one request at a time: p50 {results[side]['p50_ms'][0]:.1f} ms, "
            f"p99 {results[side]['p99_ms'][0]:.1f} ms ({args.requests} requests)",
            flush=True,
        )
    for round_no in range(1, args.rounds + 1):
        for side, route in routes.items():
            load = throughput(args.port, route, token, texts, args.clients, args.seconds, args.texts_per_request)
            for name, value in load.items():
                results[side].setdefault(name, []).append(value)
            print(
                f"round {round_no} {side:>6}: {load['texts_per_s']:.1f} texts/s with {args.clients} clients x "
                f"{args.texts_per_request} text(s) "
                f"(Little's law: {load['littles_law_per_s']:.1f})",
                flush=True,
            )
    med = {side: {name: statistics.median(values) for name, values in r.items()} for side, r in results.items()}
    ours, theirs_ = med["ours"], med["theirs"]
    print(
        f"p50 {ours['p50_ms']:.1f} against {theirs_['p50_ms']:.1f} ms "
        f"(theirs/ours {theirs_['p50_ms'] / ours['p50_ms']:.2f}x), p99 {ours['p99_ms']:.1f} against "
        f"{theirs_['p99_ms']:.1f} ms ({theirs_['p99_ms'] / ours['p99_ms']:.2f}x), throughput "
        f"{ours['texts_per_s']:.1f} against {theirs_['texts_per_s']:.1f} texts/s "
        f"(median of {args.rounds} rounds, ours/theirs {ours['texts_per_s'] / theirs_['texts_per_s']:.2f}x; Little's law "
        f"{ours['littles_law_per_s'] / theirs_['littles_law_per_s']:.2f}x)"
    )
    print(f"command: python benchmarks/bench_serve.py {' '.join(sys.argv[1:])} ({platform.python_version()})")
    serve.shutdown()


if __name__ == "__main__":
    main()
