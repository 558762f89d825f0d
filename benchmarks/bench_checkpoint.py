"""How long a drain notice's checkpoint takes to become durable, and how long the training step waits for it:
stored synchronously (`ALBERT_DIST_CHECKPOINT_UPLOAD=sync`, the step waits for the upload) against in the
background (the default: Ray Train's asynchronous upload, `train/ray_runner._report`), at the pretraining shapes
(ALBERT base and large, vocabulary 21128, LAMB's state), into a local directory and into a real S3-compatible
server (moto's, `tests/s3_server.py`, on loopback).

In one Ray Train worker: the model and LAMB after one step, then for each mode a drain notice
(`CheckpointManager.notice`) and the checkpoint of the step (`CheckpointManager.report`, the loop's own path); the
worker trains on until the checkpoint is durable. Printed per row:

- stall: how long `report` held the step (staging, checksums, and for sync the upload);
- durable: notice to durable, from the upload's own signal (`drain_checkpoint_durable_s`);
- seen: notice to the checkpoint's manifest being listed in the run's storage by a thread that polls it every
  0.1 s, an independent measure of the same moment (the manifest is stored last);
- steps: the training steps taken while the upload went on;
- the windows (GKE spot 15 s, GCE 30 s, AWS 120 s) the notice-to-durable fits, with the 2.5 s drain check of
  `train.drain_check_every` and Ray's 5 s poll added as the notice's own delay (`--notice-delay`).

    nice -n 10 .venv/bin/python benchmarks/bench_checkpoint.py                 # base and large, local and S3
    nice -n 10 .venv/bin/python benchmarks/bench_checkpoint.py --shapes base --stores local --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

WINDOWS = {"GKE spot": 15.0, "GCE": 30.0, "AWS": 120.0}
VOCAB = 21128  # albert_zh
SEQ, BATCH = 64, 2


class BenchTask:
    """What `CheckpointManager` asks of a task, for a bare pretraining model: its weights in the transformers
    layout, nothing training-only, no state of its own."""

    def save_model(self, model, directory: Path) -> None:
        model.save_pretrained(directory)

    def save_training_only(self, model, directory: Path) -> None:
        pass

    def state(self) -> dict:
        return {}


def _manifests(fs, path: str) -> set[str]:
    import pyarrow.fs as pafs

    return {
        info.path
        for info in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        if info.base_name == "manifest.json"
    }


def _worker(config: dict) -> None:
    import ray.train
    import torch

    from albert_dist.model import AlbertConfig, AlbertForPreTraining
    from albert_dist.train import optim
    from albert_dist.train.checkpointing import CheckpointManager
    from albert_dist.train.loop import WorkerEnv
    from albert_dist.train.ray_runner import CHECKPOINT_UPLOAD, _report

    torch.set_num_threads(config["threads"])
    torch.manual_seed(0)
    model = AlbertForPreTraining(AlbertConfig.from_preset(config["shape"], vocab_size=VOCAB))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optim.build_optimizer("lamb", [{"params": params}], 1e-3, (0.9, 0.999), 1e-6, 0.01)
    ids = torch.randint(5, VOCAB, (BATCH, SEQ))

    def step() -> None:
        out = model(input_ids=ids, labels=ids, sentence_order_label=torch.zeros(BATCH, dtype=torch.long))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    storage = ray.train.get_context().get_storage()
    fs, experiment = storage.storage_filesystem, storage.experiment_fs_path
    size = sum(p.numel() for p in params) * 4 * 3 / 1e6  # weights and LAMB's two moments, fp32
    rows = []
    for repeat in range(config["repeats"]):
        for mode in ("sync", "async"):
            os.environ[CHECKPOINT_UPLOAD] = mode
            lines: list[str] = []
            manager = CheckpointManager(BenchTask(), WorkerEnv(report=_report, print_fn=lines.append), every=1)
            before = _manifests(fs, experiment)
            seen: list[float] = []
            stop = threading.Event()

            def watch(before=before, seen=seen, stop=stop) -> None:
                while not stop.wait(0.1):
                    if _manifests(fs, experiment) - before:
                        seen.append(time.perf_counter())
                        return

            watcher = threading.Thread(target=watch, daemon=True)
            number = len(rows) + 1
            started = time.perf_counter()
            watcher.start()
            manager.notice(None)
            manager.report({"step": number}, model, {"step": number, "epoch": 0, "optimizer": optimizer.state_dict()})
            stall = time.perf_counter() - started
            steps = 0
            while manager._drain.durable_s is None:
                step()
                steps += 1
            durable = manager._drain.durable_s
            watcher.join(timeout=60)
            stop.set()
            rows.append(
                {
                    "shape": config["shape"],
                    "store": config["store"],
                    "mode": mode,
                    "repeat": repeat,
                    "state_mb": round(size),
                    "stall_s": stall,
                    "durable_s": durable,
                    "seen_s": seen[0] - started if seen else None,
                    "steps": steps,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    Path(config["out"]).write_text(json.dumps(rows))
    ray.train.report({"done": 1})


def run(shape: str, store: str, location: str, repeats: int, threads: int, out: Path) -> list[dict]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from albert_dist.storage import filesystem, is_uri

    fs, path = filesystem(location) if is_uri(location) else (None, location)
    TorchTrainer(
        _worker,
        train_loop_config={
            "shape": shape,
            "store": store,
            "repeats": repeats,
            "threads": threads,
            "out": str(out),
        },
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": threads}),
        run_config=RunConfig(name=f"bench-{shape}-{store}", storage_path=path, storage_filesystem=fs),
    ).fit()
    return json.loads(out.read_text())


def fits(notice_to_durable: float, notice_delay: float) -> str:
    total = notice_to_durable + notice_delay
    return ", ".join(name for name, window in WINDOWS.items() if total < window) or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["base", "large"])
    parser.add_argument("--stores", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--notice-delay",
        type=float,
        default=7.5,
        help="seconds between the cloud's notice and the loop's (Ray's 5 s poll, then up to a drain check)",
    )
    args = parser.parse_args()
    from s3_server import moto_server

    from albert_dist.cluster import ray_init

    rows: list[dict] = []
    with moto_server() as env, tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        import boto3

        os.environ.update(env)  # before Ray starts: its workers reach the server through the same variables
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="albert-bench")
        ray_init.start_local_ray(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
        locations = {"local": str(Path(tmp) / "runs"), "s3": "s3://albert-bench/runs"}
        for shape in args.shapes:
            for store in args.stores:
                rows += run(shape, store, locations[store], args.repeats, args.threads, Path(tmp) / "rows.json")
    print(
        f"\n{'shape':6} {'store':6} {'mode':6} {'state MB':>8} {'stall s':>8} {'durable s':>10} {'seen s':>7} "
        f"{'steps':>5}  fits (with {args.notice_delay:.1f} s to the loop's notice)"
    )
    for r in rows:
        seen = f"{r['seen_s']:.2f}" if r["seen_s"] is not None else "-"
        print(
            f"{r['shape']:6} {r['store']:6} {r['mode']:6} {r['state_mb']:8d} {r['stall_s']:8.2f} "
            f"{r['durable_s']:10.2f} {seen:>7} {r['steps']:5d}  {fits(r['durable_s'], args.notice_delay)}"
        )


if __name__ == "__main__":
    main()
