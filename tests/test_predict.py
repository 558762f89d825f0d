"""`albert-dist predict`: in this process for a small input (columns kept, rows back in input order after the length
sort, truncation at the length saved with the model, the precision asked), and for a large one read in ranges by
Ray tasks, predicted by an actor pool and written as it comes: the same output and the same errors as in this
process, the actors' resources from the flags, and (slow: a command with its own Ray) loopback and a token only,
our lines only on the console, an input larger than Ray's object store predicted whole and in order without
spilling."""

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from finetune_helpers import sentence, write_csv, write_jsonl
from process_helpers import beyond_loopback, listeners_sampled, process_tree
from test_security import http_status

from albert_dist.cli import main
from albert_dist.errors import ConfigError, DataError
from albert_dist.finetune import data, inference, predict_input
from albert_dist.finetune.predict import ACTOR_THRESHOLD, ActorPool, actor_pool, run_predict
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_sentencepiece

REPO = Path(__file__).resolve().parent.parent

SAVED_LENGTH = 16


@pytest.fixture(scope="module")
def model_dir(stdlib_corpus, tmp_path_factory):
    """A randomly initialised 2-class classifier with its tokenizer, saved as fine-tuning saves one."""
    directory = tmp_path_factory.mktemp("classifier")
    train_sentencepiece(stdlib_corpus, directory, 600, progress=lambda _: None)
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=load_tokenizer(directory).vocab_size,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=2,
        max_position_embeddings=128,
        id2label={0: "neg", 1: "pos"},
        label2id={"neg": 0, "pos": 1},
        initializer_range=0.5,
    )  # large random weights: outputs that depend on every token
    AlbertForSequenceClassification(config).save_pretrained(directory)
    load_tokenizer(directory).save(directory)
    inference.save_reading(directory, SAVED_LENGTH)
    return directory


def row_probabilities(model_dir, texts, max_seq_length):
    """Each row alone through the model (no batching, no sorting): the reference."""
    model = AlbertForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    out = []
    with torch.no_grad():
        for text in texts:
            row = tokenizer.encode_pair(text, None, max_seq_length)
            logits = model(
                input_ids=torch.tensor([row["input_ids"]]), token_type_ids=torch.tensor([row["token_type_ids"]])
            ).logits
            out.append(torch.softmax(logits, -1)[0].numpy())
    return np.array(out)


def test_predict_keeps_columns_restores_order_and_truncates_at_the_saved_length(model_dir, tmp_path):
    rng = random.Random(0)
    rows = [
        {"id": i, "text": sentence(rng, [], 2 + 2 * i), "label": rng.choice(["neg", "pos"])} for i in range(24)
    ]  # 2 to 48 words: many beyond 16 tokens
    source = write_csv(tmp_path / "in.csv", rows)
    # fp32: the reference below runs in fp32, and `auto` picks bf16 on CPUs with native bf16 (1e-2 apart)
    assert run_predict(model_dir, source, tmp_path / "out.jsonl", batch_size=4, precision="fp32") == 24
    table = data.read_table(tmp_path / "out.jsonl").to_pydict()
    assert [table[k] for k in ("id", "text", "label")] == [[r[k] for r in rows] for k in ("id", "text", "label")]
    probabilities = np.array([table["prob_neg"], table["prob_pos"]]).T
    texts = [r["text"] for r in rows]
    np.testing.assert_allclose(probabilities, row_probabilities(model_dir, texts, SAVED_LENGTH), atol=1e-5)
    assert table["predicted_label"] == [["neg", "pos"][i] for i in probabilities.argmax(1)]
    untruncated = row_probabilities(model_dir, texts, 128)
    assert np.abs(probabilities - untruncated).max() > 1e-3  # the saved length did cut the long rows


def test_the_command_predicts_in_the_precision_it_is_given(model_dir, tmp_path, capsys):
    """`albert-dist predict --precision`: bf16 writes bf16's probabilities (off fp32's by up to ~1e-2, measured),
    fp32 fp32's to the last digit, whatever `auto` would pick on this CPU; fp16 on a CPU is refused in a line."""
    source = write_csv(tmp_path / "in.csv", [{"text": sentence(random.Random(i), [], 12)} for i in range(8)])
    probabilities = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.parquet"
        assert (
            main(
                [
                    "predict",
                    "--model",
                    str(model_dir),
                    "--input",
                    str(source),
                    "--output",
                    str(out),
                    "--precision",
                    precision,
                ]
            )
            == 0
        )
        probabilities[precision] = np.array(data.read_table(out).column("prob_pos").to_pylist())
    reference = row_probabilities(model_dir, [r["text"] for r in data.read_table(source).to_pylist()], SAVED_LENGTH)
    np.testing.assert_allclose(probabilities["fp32"], reference[:, 1], atol=1e-5)
    assert np.abs(probabilities["bf16"] - probabilities["fp32"]).max() > 1e-4
    assert (
        main(
            [
                "predict",
                "--model",
                str(model_dir),
                "--input",
                str(source),
                "--output",
                str(tmp_path / "fp16.csv"),
                "--precision",
                "fp16",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        "albert-dist: error: precision fp16 needs a GPU (training: scaling.use_gpu=true); use bf16 or fp32 on CPU\n"
    )
    assert not (tmp_path / "fp16.csv").exists()


def test_models_without_a_saved_length_truncate_at_512(tmp_path):
    assert inference.saved_max_seq_length(tmp_path) == 512  # no tokenizer_config.json (a foreign model dir)
    (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 1000000000000000019884624838656}')
    assert inference.saved_max_seq_length(tmp_path) == 512  # transformers' "no limit" placeholder
    inference.save_reading(tmp_path, 64)
    assert inference.saved_max_seq_length(tmp_path) == 64


def test_the_actor_pool_asks_ray_for_what_the_flags_and_the_cluster_give():
    """GPU actors (asked, or found by "auto") take a GPU and a CPU each, one per GPU by default; CPU actors share
    the CPUs that a quarter CPU per node for the read tasks leaves; what cannot run is refused in a line."""
    gpus = {"CPU": 16.0, "GPU": 2.0}
    assert actor_pool("auto", None, gpus) == ActorPool(2, num_cpus=1, num_gpus=1, device="cuda")
    assert actor_pool("cuda", 1, gpus) == ActorPool(1, num_cpus=1, num_gpus=1, device="cuda")
    assert actor_pool("cpu", None, gpus) == ActorPool(16, num_cpus=15.75 / 16, num_gpus=0, device="cpu")
    assert actor_pool("auto", None, {"CPU": 2.0}) == ActorPool(2, num_cpus=0.875, num_gpus=0, device="cpu")
    assert actor_pool("cpu", 3, {"CPU": 16.0}, nodes=2) == ActorPool(3, num_cpus=15.5 / 3, num_gpus=0, device="cpu")
    for flags, cluster, message in [
        (("cuda", None), {"CPU": 8.0}, "--device cuda: the Ray cluster has no GPU"),
        (("cuda", 3), gpus, "--num-actors 3: each actor takes a GPU, and the Ray cluster has 2"),
        (("auto", 2), {"CPU": 2.0, "GPU": 2.0}, "--num-actors 2: each GPU actor takes a CPU too"),
        (("cpu", 0), gpus, "--num-actors 0: at least 1"),
        (("tpu", None), gpus, "--device tpu: use one of auto, cpu, cuda"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            actor_pool(*flags, cluster)


def test_a_gpu_asked_where_torch_sees_none_is_refused_in_a_line(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    source = write_csv(tmp_path / "in.csv", [{"text": "a b c"}])
    out = tmp_path / "out.csv"
    argv = ["predict", "--model", str(model_dir), "--input", str(source), "--output", str(out), "--device", "cuda"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "albert-dist: error: --device cuda: this process sees no GPU (torch.cuda.is_available() is false)\n"
    )
    assert not out.exists()


def test_predict_help_names_the_size_from_which_inputs_are_streamed(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    assert f"Inputs under {ACTOR_THRESHOLD >> 20} MiB are predicted in this process" in capsys.readouterr().out


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` in the format of `path`'s extension."""
    kind = data.file_format(path)
    if kind == "csv":
        return write_csv(path, rows)
    if kind == "jsonl":
        return write_jsonl(path, rows)
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=max(1, len(rows) // 15))
        return path
    names = list(rows[0])
    lines = ["\t".join(names)] + ["\t".join(str(row[name]) for name in names) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def mixed_rows(n: int, seed: int = 0) -> list[dict]:
    """Rows of Chinese and English text, some long, some empty, with an id column."""
    rng = random.Random(seed)
    zh = "今天天气很好我们去公园散步吧这个模型的效果不错"
    return [
        {"id": i, "text": sentence(rng, [], 2 + i % 30) + " " + zh[: i % len(zh)] if i % 97 else "", "n": i * 0.5}
        for i in range(n)
    ]


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl", "parquet"])
def test_ranges_read_a_file_as_read_table_does(tmp_path, monkeypatch, kind):
    """Cut into ranges of a few kilobytes, every line (or row group) is read once, by the range it starts in,
    with the columns and types `read_table` gives the whole file, in file order."""
    monkeypatch.setattr(predict_input, "RANGE_BYTES", 4096)
    monkeypatch.setattr(predict_input, "HEAD_BYTES", 2048)
    path = write_rows(tmp_path / f"in.{kind}", mixed_rows(1500))
    size = path.stat().st_size
    table = predict_input.look(str(path), kind, size, ["text"])
    ranges = table.ranges()
    assert len(ranges) > 3
    read = pa.concat_tables(part for start, end in ranges for part in table.read(start, end))
    whole = data.read_table(path)
    assert read.column_names == whole.column_names
    assert read.to_pydict() == whole.cast(read.schema).to_pydict()
    if kind == "parquet":
        assert table.rows == 1500
    else:
        assert read.schema.field("text").type == pa.string()


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_an_undecodable_line_in_a_later_range_is_named_as_read_table_names_it(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(predict_input, "RANGE_BYTES", 4096)
    monkeypatch.setattr(predict_input, "HEAD_BYTES", 2048)
    path = write_rows(tmp_path / f"gbk.{kind}", mixed_rows(400))
    path.write_bytes(path.read_bytes() + (b"9,\xbd\xf1\xcc\xec,1\n" if kind == "csv" else b'{"text": "\xbd\xf1"}\n'))
    with pytest.raises(DataError) as whole:
        data.read_table(path)
    table = predict_input.look(str(path), kind, path.stat().st_size, ["text"])
    with pytest.raises(DataError) as ranged:
        for start, end in table.ranges():
            list(table.read(start, end))
    assert str(ranged.value) == str(whole.value)
    line = 400 + (2 if kind == "csv" else 1)  # after the header and 400 rows
    assert f"(line {line}, byte 0xbd)" in str(ranged.value)


@pytest.mark.parametrize("threshold", [ACTOR_THRESHOLD, 0], ids=["in-process", "streamed"])
def test_bad_input_is_refused_alike_read_whole_or_streamed(model_dir, tmp_path, threshold):
    """Missing text column, a column the prediction would write, a header naming a column twice, text in GBK, no
    rows: the same one line whether the file is read whole or streamed (checked before Ray starts)."""
    gbk = tmp_path / "gbk.csv"
    gbk.write_bytes("text,label\n今天天气很好,1\n".encode("gbk"))
    twice = tmp_path / "twice.csv"
    twice.write_text("text,label,text\na,0,b\n")
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n")
    cases = [
        (write_csv(tmp_path / "no_text.csv", [{"sentence": "a b"}]), "no column 'text' (text_column)"),
        (write_csv(tmp_path / "taken.csv", [{"text": "a b c", "prob_pos": 0.5}]), "'prob_pos' would be overwritten"),
        (twice, "column 'text' appears more than once in the header"),
        (gbk, "not UTF-8 text (line 2, byte 0xbd); it reads as Chinese in GB18030"),
        (header_only, "data file has no rows"),
    ]
    for source, message in cases:
        with pytest.raises(DataError, match=re.escape(message)):
            run_predict(model_dir, source, tmp_path / "out.csv", actor_threshold=threshold)
        assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_streamed_input_is_predicted_as_in_this_process(model_dir, tmp_path, ray_session, capsys, kind):
    """Read in ranges by Ray tasks and predicted by the actor pool (two actor calls of 1,024 rows and more), every
    row comes back in input order with its columns as read, and the same predictions as read whole here; progress
    and the pool are said. (Each format's ranges: test_ranges_read_a_file_as_read_table_does.)"""
    source = write_rows(tmp_path / f"in.{kind}", mixed_rows(2600))
    here, streamed = tmp_path / "here.parquet", tmp_path / "streamed.parquet"
    assert run_predict(model_dir, source, here, precision="fp32") == 2600
    capsys.readouterr()
    assert run_predict(model_dir, source, streamed, precision="fp32", actor_threshold=0, num_actors=1) == 2600
    out = capsys.readouterr().out
    assert f"predict: {source} streamed to 1 actor(s) on cpu" in out
    assert re.search(r"^predict: 2,600(/2,600)? rows \(", out, re.MULTILINE)
    expected, got = pq.read_table(here), pq.read_table(streamed)
    assert got.column_names == expected.column_names == ["id", "text", "n", "predicted_label", "prob_neg", "prob_pos"]
    assert got.column("id").to_pylist() == list(range(2600))
    for name in ("id", "text", "n", "predicted_label"):
        assert got.column(name).to_pylist() == expected.column(name).to_pylist()
    np.testing.assert_allclose(got.column("prob_pos").to_numpy(), expected.column("prob_pos").to_numpy(), atol=1e-6)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_an_undecodable_line_met_by_a_ray_task_is_read_tables_error(model_dir, tmp_path, ray_session):
    """A GBK line past the rows the driver looks at is met by a read task inside Ray: its DataError comes out as
    itself (read_table's words), and nothing is published."""
    path = write_rows(tmp_path / "in.csv", mixed_rows(40_000))
    assert path.stat().st_size > 2 * predict_input.HEAD_BYTES
    path.write_bytes(path.read_bytes() + "40000,今天天气很好,1\n".encode("gbk"))
    with pytest.raises(DataError) as whole:
        data.read_table(path)
    with pytest.raises(DataError) as streamed:
        run_predict(model_dir, path, tmp_path / "out.jsonl", actor_threshold=0, num_actors=1)
    assert type(streamed.value) is DataError and str(streamed.value) == str(whole.value)
    assert "line 40002, byte 0xbd" in str(streamed.value)
    assert not (tmp_path / "out.jsonl").exists()


#: the command, run as `albert-dist predict` is, then one JSON line: its private memory before and at its peak, and
#: Ray's object store (capacity, bytes spilled to disk or allocated beside it)
DRIVER = """
import json, sys, threading
from pathlib import Path

def private_mb():
    return int(Path("/proc/self/status").read_text().split("RssAnon:")[1].split()[0]) / 1024

import ray.data  # what the command imports anyway, in the baseline
from albert_dist import cli
from albert_dist.finetune import predict  # noqa: F401

baseline, peak, done = private_mb(), [0.0], threading.Event()

def sample():
    while not done.wait(0.05):
        peak[0] = max(peak[0], private_mb())

threading.Thread(target=sample, daemon=True).start()
code = cli.main(sys.argv[1:])
done.set()
from ray._private.internal_api import get_memory_info_reply, get_state_from_address

stats = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address)).store_stats
print(json.dumps({"baseline_mb": baseline, "peak_mb": peak[0], "store_bytes": stats.object_store_bytes_avail,
                  "spilled_bytes": stats.spilled_bytes_total, "fallback_bytes": stats.object_store_bytes_fallback}))
sys.exit(code)
"""
STREAMED_ROWS = 20_500
OBJECT_STORE_BYTES = 80_000_000  # Ray's smallest is 75 MiB
#: every line the command prints: ours, none of Ray's
OUR_LINES = re.compile(r"local Ray: dashboard |Ray's logs: |predict: |predicted \d+ rows |wrote \d+ predictions |\{")


@dataclass
class StreamedCommand:
    model: Path
    source: Path
    output: Path
    lines: list[str] = field(default_factory=list)
    listeners: set = field(default_factory=set)
    api_status: dict[str, int] = field(default_factory=dict)
    returncode: int | None = None

    @property
    def summary(self) -> dict:
        return json.loads(self.lines[-1])


@pytest.fixture(scope="module")
def streamed_command(model_dir, tmp_path_factory) -> StreamedCommand:
    """`albert-dist predict` of 20,500 rows (~125 MB: a 6,000-character column beside the text) with Ray's own
    defaults but an 80 MB object store, starting its own Ray: its listeners sampled every half second, its job API
    asked without, with a wrong and with its token once it is up."""
    root = tmp_path_factory.mktemp("streamed")
    rng = random.Random(1)
    rows = [
        {"id": i, "text": sentence(rng, [], 4 + i % 20), "payload": f"r{i:05d}" * 1000} for i in range(STREAMED_ROWS)
    ]
    job = StreamedCommand(model_dir, write_csv(root / "in.csv", rows), root / "out.csv")
    ray_tmp = Path(tempfile.mkdtemp(prefix="prd-", dir="/tmp"))  # short: Ray's socket paths live below it
    env = {
        **os.environ,
        "RAY_ADDRESS": "local",
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(OBJECT_STORE_BYTES),
    }
    argv = ["predict", "--model", str(model_dir), "--input", str(job.source), "--output", str(job.output)]
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )

    def read_output() -> None:
        for line in proc.stdout:
            job.lines.append(line.rstrip("\n"))
            if line.startswith("local Ray: dashboard"):
                url, token_path = re.search(r"dashboard (http://\S+),.* token is in (\S+) ", line).groups()
                token, api = Path(token_path).read_text().strip(), f"{url}/api/jobs/"
                job.api_status = {
                    name: http_status(api, t) for name, t in [("none", None), ("wrong", "x" + token), ("token", token)]
                }

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        with listeners_sampled(lambda: process_tree(proc.pid), every=0.5) as listeners:
            try:
                proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                proc.kill()
        job.listeners, job.returncode = listeners, proc.wait()
        reader.join(timeout=30)
        yield job
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
def test_a_streamed_predict_listens_on_loopback_only_and_wants_its_token(streamed_command):
    job = streamed_command
    assert job.returncode == 0, "\n".join(job.lines[-40:])
    names = " ".join(name for _, _, name in job.listeners)
    for process in ("gcs_server", "raylet"):  # the sample saw Ray's servers
        assert process in names, (process, sorted(job.listeners))
    assert not beyond_loopback(job.listeners), f"listening beyond loopback: {beyond_loopback(job.listeners)}"
    assert job.api_status["none"] in (401, 403) and job.api_status["wrong"] in (401, 403), job.api_status
    assert job.api_status["token"] == 200, job.api_status


@pytest.mark.slow
def test_a_streamed_predict_prints_our_lines_only(streamed_command):
    """No Ray INFO line, progress bar or warning on the console: the start, the pool, progress with its ETA, the
    summary."""
    job = streamed_command
    assert job.returncode == 0, "\n".join(job.lines[-40:])
    assert [line for line in job.lines if not OUR_LINES.match(line)] == []
    assert f"predict: {job.source} streamed to " in "\n".join(job.lines)
    assert job.lines[-3:-1] == [
        f"predicted {STREAMED_ROWS} rows of {job.source} with {job.model} → {job.output}",
        f"wrote {STREAMED_ROWS} predictions to {job.output}",
    ]
    progress = [line for line in job.lines if re.match(r"predict: [\d,]+ rows \(", line)]
    assert progress[-1].startswith(f"predict: {STREAMED_ROWS:,} rows (")
    assert all("% | ETA " in line for line in progress[:-1])


@pytest.mark.slow
def test_an_input_larger_than_the_object_store_is_predicted_whole_and_in_order(streamed_command):
    """125 MB through an 80 MB object store, none of it spilled to disk, the driver's private memory growing by
    less than half the input: every row written, in input order."""
    job = streamed_command
    assert job.returncode == 0, "\n".join(job.lines[-40:])
    summary, size = job.summary, job.source.stat().st_size
    assert summary["store_bytes"] < size / 1.5, summary
    assert summary["spilled_bytes"] == 0 and summary["fallback_bytes"] == 0, summary
    assert summary["peak_mb"] - summary["baseline_mb"] < size / 2**20 / 2, summary
    out = data.read_table(job.output)
    assert out.column("id").to_pylist() == list(range(STREAMED_ROWS))
    assert out.column("payload").to_pylist()[-1] == f"r{STREAMED_ROWS - 1:05d}" * 1000
    probabilities = np.array([out.column("prob_neg").to_numpy(), out.column("prob_pos").to_numpy()]).T
    assert out.column("predicted_label").to_pylist() == [["neg", "pos"][i] for i in probabilities.argmax(1)]
