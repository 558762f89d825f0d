"""A checkpoint stored in the background: training goes on while it is uploaded, the final model is published only
once its checkpoint is durable, the drain's checkpoint says when it became durable, and an upload cut off by the
uploader's death is never resumed from (its manifest goes last).

The Ray test runs `python tests/test_checkpoint_upload.py ROOT` (a local Ray of its own, its S3 client pointed at
`fault_proxy.FaultProxy` in front of a moto server: the variables must reach Ray's workers when Ray starts).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_s3
from cluster_helpers import run_own_cluster
from fault_proxy import FaultProxy
from process_helpers import train_workers_of, wait_until_gone
from test_loop import Checkpoints, KeywordTask, settings
from test_s3 import BUCKET, s3_client
from test_s3_faults import checkpoint_names, objects, verified_checkpoints

from albert_dist.storage import RETRY_ENV
from albert_dist.train.loop import TaskSpec, Trainer, WorkerEnv

s3_env = test_s3.s3_env  # the moto server (a module's fixture: this module gets its own)

UPLOAD_DELAY_S = 4.0
MAX_STEPS = 30


class BackgroundUpload(Checkpoints):
    """Stands in for Ray's asynchronous report: copies each checkpoint in a thread and hands back the future that
    is done then. A slow store: a checkpoint of a step in `held` is stored only once the loop has taken 3 more
    training steps (or after 30 s: a loop that waited for the store would have taken none)."""

    def __init__(self, root: Path, held: tuple[int, ...] = (), delay_s: float = 0.0):
        super().__init__(root)
        self.held, self.delay_s = held, delay_s
        self.steps, self.reported_at_step, self.stored_at_step = 0, {}, {}

    def __call__(self, metrics, directory):
        if directory is None:
            return super().__call__(metrics, None)
        done: Future = Future()
        step = metrics["step"]
        self.reported_at_step[step] = self.steps

        def upload() -> None:
            give_up = time.monotonic() + 30
            while step in self.held and self.steps < self.reported_at_step[step] + 3 and time.monotonic() < give_up:
                time.sleep(0.01)
            time.sleep(self.delay_s)
            super(BackgroundUpload, self).__call__(metrics, directory)
            self.stored_at_step[step] = self.steps
            done.set_result(None)

        threading.Thread(target=upload, daemon=True).start()
        return done


class CountingTask(KeywordTask):
    def __init__(self, upload: BackgroundUpload):
        super().__init__()
        self.upload = upload

    def loss(self, model, batch):
        if model.training:
            self.upload.steps += 1
        return super().loss(model, batch)


def test_training_goes_on_during_the_upload_and_waits_for_the_drains_and_the_final_checkpoint(tmp_path):
    """The periodic checkpoint of step 10 is uploaded in the background by a store that holds it until the loop
    has taken 3 more steps: the loop trains on meanwhile. The drain's (notice at step 5, stored in 1 s) is waited
    for, its steps being lost with the node: logged durable with the time since its notice. The final model is
    published only once the last checkpoint (1 s) is stored."""
    upload = BackgroundUpload(tmp_path / "stored", held=(10,), delay_s=1.0)
    upload.root.mkdir()
    logged, lines = [], []
    trainer = Trainer(
        CountingTask(upload),
        settings(max_steps=20, checkpoint_every=10, eval_every=10, drain_check_every=5, publish="last"),
        WorkerEnv(
            report=upload,
            publish_to=tmp_path / "home",
            draining=lambda: trainer.position.step >= 5,
            log_metrics=lambda metrics, step: logged.append((metrics, step)),
            print_fn=lines.append,
        ),
    )
    result = trainer.fit()
    assert result["step"] == 20
    # step 10's checkpoint was stored after the loop had gone on several steps, the drain's before it took one
    reported, stored = upload.reported_at_step, upload.stored_at_step
    assert sorted(stored) == [5, 10, 20], stored
    assert stored[10] >= reported[10] + 3 and stored[5] == reported[5], (reported, stored)
    durable = [(m["drain_checkpoint_durable_s"], step) for m, step in logged if "drain_checkpoint_durable_s" in m]
    assert len(durable) == 1 and durable[0][1] == 5 and 1.0 <= durable[0][0] < 30, logged
    assert any(re.search(r"step 5 \| drain checkpoint durable [\d.]+ s after the notice", line) for line in lines)
    # the model published at the end is the stored step-20 checkpoint's (published after it was stored)
    published = tmp_path / "home" / "model" / "model.safetensors"
    assert published.read_bytes() == (upload.root / "step20" / "model" / "model.safetensors").read_bytes()
    assert published.stat().st_mtime >= (upload.root / "step20" / "manifest.json").stat().st_mtime


def test_a_drain_checkpoint_still_uploading_at_the_deadline_is_said_not_durable(tmp_path):
    """A notice whose deadline (1 s away) passes before the drain's checkpoint is stored (3 s): said at the
    deadline, and the checkpoint, stored later, is logged durable after it."""
    upload = BackgroundUpload(tmp_path / "stored", delay_s=3.0)
    upload.root.mkdir()
    lines = []
    deadline = []

    def draining():
        if trainer.position.step < 5:
            return False
        deadline[:] = deadline or [time.time() + 1.0]
        return deadline[0]

    trainer = Trainer(
        KeywordTask(),
        settings(max_steps=10, checkpoint_every=10, eval_every=10, drain_check_every=5),
        WorkerEnv(report=upload, draining=draining, print_fn=lines.append),
    )
    trainer.fit()
    late = [i for i, line in enumerate(lines) if "not durable at the deadline" in line]
    durable = [i for i, line in enumerate(lines) if "drain checkpoint durable" in line]
    assert len(late) == 1 and len(durable) == 1 and late[0] < durable[0], lines
    assert re.search(r"durable [\d.]+ s after the notice, [\d.]+ s after the deadline", lines[durable[0]]), lines


@dataclass(frozen=True)
class TimedKeywordTask(TaskSpec):
    """test_loop's KeywordTask, writing the time.monotonic() of each training step to ROOT/steps (the proxy's
    record of the requests uses the same clock; one micro-batch a step)."""

    root: str

    def build(self, rank, world_size, dataset):
        steps = Path(self.root) / "steps"

        class Timed(KeywordTask):
            def loss(self, model, batch):
                if model.training:  # not the evaluation's
                    with open(steps, "a") as out:
                        out.write(f"{time.monotonic()}\n")
                return super().loss(model, batch)

        return Timed()


def main(root: Path) -> None:
    """The run (`MAX_STEPS` steps, a checkpoint every 10, `max_failures=0`), then its relaunch; prints each one's
    end as `RUN {...}`."""
    import ray
    from checkpoint_helpers import training_plan

    from albert_dist.cluster import ray_init
    from albert_dist.config import ScalingSection, TrainSection
    from albert_dist.train.ray_runner import run_training

    tests = str(Path(__file__).resolve().parent)
    ray_init.start_local_ray(
        num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": tests}}
    )
    train = TrainSection(
        max_steps=MAX_STEPS,
        warmup_steps=2,
        log_every=10,
        eval_every=10,
        checkpoint_every=10,
        precision="fp32",
        max_failures=0,
    )
    for _ in range(2):
        try:
            result = run_training(
                training_plan(
                    "async",
                    f"s3://{BUCKET}/runs/async/ray",  # as test_s3_faults lays out its runs
                    TimedKeywordTask(str(root)),
                    train,
                    ScalingSection(num_workers=1, cpus_per_worker=1),
                )
            )
            print("RUN " + json.dumps({"step": result.metrics["step"], "resumed": result.metrics["resumed_from_step"]}))
        except Exception as err:  # the first run's worker is killed: Ray's error, whatever its class
            print("RUN " + json.dumps({"error": type(err).__name__}), flush=True)
    ray.shutdown()


@pytest.mark.slow
def test_steps_go_on_while_the_store_is_slow_and_a_cut_off_upload_is_never_resumed(s3_env, tmp_path):
    """Real Ray Train, real S3 (moto behind the fault proxy). The first checkpoint's first upload request is held
    `UPLOAD_DELAY_S` by the proxy: the steps after it are counted until its manifest reached the server (a
    synchronous upload allows none). The worker, which uploads, is SIGKILLed once the server has stored the first
    file of the next checkpoint: that one is on the server without its manifest (stored last), and the relaunch
    resumes from the one before, which verifies, and ends the run."""
    s3_client(s3_env).create_bucket(Bucket=BUCKET)
    proxy = FaultProxy(s3_env["AWS_ENDPOINT_URL"], delay_s=UPLOAD_DELAY_S)
    checkpoint_file = re.compile(rf"/{BUCKET}/runs/async/ray/async/(checkpoint_[^/]+)/")
    uploads: list[str] = []  # the checkpoints, in the order their first file was stored
    cut: list[dict] = []

    def first_file_of_a_checkpoint(method: str, path: str) -> bool:
        match = checkpoint_file.search(path)
        if method == "POST" and match and match[1] not in uploads:
            uploads.append(match[1])
            return True
        return False

    def kill_the_uploader() -> None:
        if len(uploads) < 2:  # the first checkpoint's: wait for the next one
            proxy.after(first_file_of_a_checkpoint, kill_the_uploader, body_has=b"CompleteMultipartUpload")
            return
        workers = train_workers_of(os.getpid())
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert not wait_until_gone(workers), "the uploader outlived its SIGKILL"
        cut.append(objects(s3_client(s3_env), "runs/async/"))

    proxy.force(lambda method, path: bool(checkpoint_file.search(path)), "delayed")
    proxy.after(first_file_of_a_checkpoint, kill_the_uploader, body_has=b"CompleteMultipartUpload")
    try:
        out = run_own_cluster(
            __file__,
            [str(tmp_path)],
            tmp_path,
            "cu-",
            **{**s3_env, "AWS_ENDPOINT_URL": proxy.url, RETRY_ENV: "10"},
            ALBERT_DIST_STAGING=str(tmp_path / "staging"),
        )
    finally:
        proxy.close()
    runs = [json.loads(line[4:]) for line in out.splitlines() if line.startswith("RUN ")]
    assert len(runs) == 2 and "error" in runs[0], out[-6000:]
    assert runs[1] == {"step": MAX_STEPS, "resumed": 10}, out[-6000:]

    # the steps taken while the first checkpoint was on its way: from the held request to its manifest stored
    # (its upload's requests: the relaunch reads the manifest again)
    manifests = [
        r
        for r in proxy.requests
        if r.method == "POST" and r.path.endswith(f"{uploads[0]}/manifest.json") and r.status == 200
    ]
    held = [r for r in proxy.requests if r.outcome == "delayed"]
    assert manifests and len(held) == 1, proxy.requests
    steps = [float(t) for t in (tmp_path / "steps").read_text().split()]
    during = [t for t in steps[10:] if t < manifests[-1].at]
    assert len(during) >= 5, (len(during), held[0].at, manifests[-1].at, steps[8:14])

    # what the kill left: the first checkpoint whole, the second's files in part and no manifest
    assert len(cut) == 1 and len(uploads) >= 2, uploads
    assert set(verified_checkpoints(cut[0], "async").values()) == {10}, cut[0].keys()
    assert uploads[1] in checkpoint_names(cut[0], "async")
    assert f"ray/async/{uploads[1]}/manifest.json" not in cut[0], sorted(cut[0])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
