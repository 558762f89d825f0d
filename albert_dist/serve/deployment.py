"""The Ray Serve deployment: each replica loads the model once (`albert-dist predict`'s `Predictor`) and answers
`POST /` with the predictions of the texts sent. Requests that arrive together are predicted together (Ray Serve's
`@serve.batch`): a batch holds up to `max_batch_size` texts, gathered for at most `batch_wait_s` after its first
request. `GET /` describes the model and the batches this replica has run."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from albert_dist.serve import auth, protocol

TEXT, TEXT_PAIR = "text", "text_pair"  # the Predictor's input columns


@dataclass(frozen=True)
class ReplicaSettings:
    """What each replica is built from: plain values (they travel to every replica)."""

    model_dir: str
    pair: bool
    token_digest: str
    max_batch_size: int
    batch_wait_s: float
    threads: int
    precision: str


Requests = list[tuple[list[str], list[str] | None]]  # each request's texts, and its pairs for a pair model


class BatchPredictor:
    """Several requests' texts through the model at once, each request's predictions back to it; counts the
    requests of each batch."""

    def __init__(self, settings: ReplicaSettings):
        from albert_dist.finetune.predict import Predictor

        self.pair = settings.pair
        self.predictor = Predictor(
            settings.model_dir,
            TEXT,
            TEXT_PAIR if settings.pair else None,
            settings.max_batch_size,
            settings.precision,
        )
        self.requests_per_batch: Counter[int] = Counter()

    def __call__(self, requests: Requests) -> list[list[dict]]:
        self.requests_per_batch[len(requests)] += 1
        rows = {TEXT: np.array([text for texts, _ in requests for text in texts], dtype=object)}
        if self.pair:
            rows[TEXT_PAIR] = np.array([pair for _, pairs in requests for pair in pairs], dtype=object)
        out = self.predictor(rows)
        columns = {name: values for name, values in out.items() if name not in rows}
        answers, start = [], 0
        for texts, _ in requests:
            answers.append(protocol.predictions(columns, start, start + len(texts)))
            start += len(texts)
        return answers


def _text_count(items: Requests) -> int:
    """A batch's size for `@serve.batch`: its texts, not its requests."""
    return sum(len(texts) for texts, _ in items)


@serve.deployment
class ServedModel:
    def __init__(self, settings: ReplicaSettings):
        import torch

        _keep_replica_grpc_on_node_address()
        torch.set_num_threads(settings.threads)
        self.settings = settings
        self.model = BatchPredictor(settings)
        self.predict_batch.set_max_batch_size(settings.max_batch_size)
        self.predict_batch.set_batch_wait_timeout_s(settings.batch_wait_s)

    async def __call__(self, request: Request) -> Response:
        if not auth.authorized(request.headers.get("authorization"), self.settings.token_digest):
            return _answer(
                401,
                {"error": "a bearer token is required: Authorization: Bearer <token>"},
                {"WWW-Authenticate": "Bearer"},
            )
        if request.url.path[len(request.scope.get("root_path", "")) :].strip("/"):  # below the route's own path
            return _answer(404, {"error": f'no {request.url.path}: POST / with {{"texts": [...]}}'})
        if request.method == "GET":
            return _answer(200, self.describe())
        if request.method != "POST":
            return _answer(405, {"error": f"{request.method} is not served: POST / or GET /"}, {"Allow": "GET, POST"})
        try:
            texts, pairs = protocol.parse_request(
                await request.body(), self.settings.pair, self.settings.max_batch_size
            )
        except protocol.BadRequest as err:
            return _answer(400, {"error": str(err)})
        return _answer(200, {"predictions": await self.predict_batch((texts, pairs)) if texts else []})

    def describe(self) -> dict:
        settings = {k: v for k, v in asdict(self.settings).items() if k != "token_digest"}
        batches = sorted(self.model.requests_per_batch.items())
        return {**settings, "requests_per_batch": {str(size): count for size, count in batches}}

    @serve.batch(batch_size_fn=_text_count)
    async def predict_batch(self, requests: Requests) -> list[list[dict]]:
        return await asyncio.to_thread(self.model, requests)  # the event loop keeps taking requests meanwhile


def _keep_replica_grpc_on_node_address() -> None:
    """Ray Serve (2.60) starts a gRPC server in every replica, for calls between deployments, right after the
    deployment's constructor, and binds it to every interface ("[::]:0": plaintext, no auth, no setting to change
    it; ray-project/ray#64544). Bind it to the node's own address instead: 127.0.0.1 for a local Ray, the address
    Serve gives its callers on a cluster."""
    import ray
    from ray.serve._private import replica

    node_ip = ray.util.get_node_ip_address()
    bind = replica.add_port_to_grpc_server

    def bind_on_node(server, address: str):
        if address.startswith("[::]:"):
            address = f"{f'[{node_ip}]' if ':' in node_ip else node_ip}:{address.rsplit(':', 1)[1]}"
        return bind(server, address)

    replica.add_port_to_grpc_server = bind_on_node


def _answer(status: int, body: dict, headers: dict[str, str] | None = None) -> Response:
    return Response(protocol.encode(body), status_code=status, headers=headers, media_type="application/json")
