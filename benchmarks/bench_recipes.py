"""Pretraining recipes compared by the tokens they need to learn: held-out MLM and SOP accuracy against steps.

Each arm trains the `tiny` preset (or `--preset`) from the same seed with the shared `Trainer` and
`PretrainingTask`, in this process (no Ray Train: the data is prepared once with Ray Data, then read into memory),
on a real corpus, and evaluates every `--eval-every` steps on the held-out split with fixed masks. It prints the
steps (and tokens) each arm needs to reach held-out MLM accuracy 0.20 / 0.30 and SOP accuracy 0.65 / 0.75, the
unigram baseline of the held-out masks (each of them shows [MASK]: nothing to copy), and the wall time measured
alongside (the machine may be shared: compare arms by steps, not seconds).

    python benchmarks/bench_recipes.py --corpus zh --steps 400 \
        --arm lamb-2e-3="train.optimizer=lamb train.learning_rate=2e-3 train.warmup_steps=30" \
        --arm adamw-1e-3="train.optimizer=adamw train.learning_rate=1e-3 train.warmup_steps=30"

An arm may train in sequence-length phases (`train.phases`, data prepared at `--short-seq` with the same tokenizer
as `zh-<seq>-<vocab>`; evaluation reads the `--seq` data's held-out split):

    python benchmarks/bench_recipes.py --corpus zh --seq 128 --short-seq 64 --steps 600 \
        --arm "phased='train.phases=[{data: zh-64-8000-for128, steps: 540}, {steps: 60}]'"

Corpora (`--corpus`): `zh` is Debian's fortunes-zh `chinese` file as blank-line separated documents (`--zh-path`;
benchmarks/README.md rebuilds it), `en` the standard-library docstrings `albert_dist.demo.corpus` extracts, and
any other value the path of a text file of blank-line separated documents, such as the Chinese manual pages and
Python's documentation that `benchmarks/corpora.py` writes.
`--also-eval-masking` scores every evaluation a second time on other fixed masks, e.g. single-token masks as
transformers' MLM collator draws them (reported as `also_*`, its time left out of the arm's clock). Arm overrides
are `--set` strings of a pretraining job (`train.*`, `masking.*`, `model.*`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.pretrain.config import PretrainJobConfig

THRESHOLDS = {"eval_mlm_accuracy": (0.20, 0.30), "eval_sop_accuracy": (0.65, 0.75)}


class MemorySplit:
    """A prepared split held in memory, read with the part of Ray Data's `iter_batches` that training uses."""

    def __init__(self, paths: list[str]):
        import pyarrow as pa

        self.table = pa.concat_tables([pq.read_table(p) for p in paths])
        self.columns = {
            name: self.table.column(name).to_numpy(zero_copy_only=False) for name in self.table.column_names
        }

    def iter_batches(
        self,
        *,
        batch_size: int,
        batch_format: str = "numpy",
        drop_last: bool = False,
        local_shuffle_buffer_size: int = 0,
        local_shuffle_seed: int | None = None,
    ):
        n = self.table.num_rows
        order = np.random.default_rng(local_shuffle_seed).permutation(n) if local_shuffle_buffer_size else np.arange(n)
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            rows = order[start : start + batch_size]
            yield {name: column[rows] for name, column in self.columns.items()}


def prepare(
    root: Path, corpus: str, zh_path: str, seq: int, vocab: int, eval_fraction: float, tokenizer_of: Path | None = None
) -> Path:
    """The corpus prepared at `seq` tokens with a new tokenizer of `vocab` pieces, or with the tokenizer of the
    prepared data `tokenizer_of` (the short phase of a schedule must share the model's vocabulary)."""
    from albert_dist.data.prepare import prepare_dataset

    name = corpus if corpus in ("zh", "en") else Path(corpus).stem.replace("-", "_")
    out = root / (f"{name}-{seq}-{vocab}" + (f"-for{tokenizer_of.name.split('-')[-2]}" if tokenizer_of else ""))
    if (out / "manifest.json").exists():
        return out
    if corpus == "en":
        from albert_dist.demo.corpus import write_stdlib_corpus

        source, fmt = str(write_stdlib_corpus(root / "stdlib_docstrings.txt", 2_000_000)), "blocks"
    else:
        source, fmt = zh_path if corpus == "zh" else corpus, "blocks"
    tokenizer = f"tokenizer.path={tokenizer_of / 'tokenizer'}" if tokenizer_of else f"tokenizer.vocab_size={vocab}"
    cfg = load_config(
        DataJobConfig,
        None,
        [
            f"run.output_dir={root}",
            f"data.inputs=[{source}]",
            f"data.format={fmt}",
            f"data.output={out.name}",
            f"data.max_seq_length={seq}",
            f"data.eval_fraction={eval_fraction}",
            tokenizer,
        ],
    )
    prepare_dataset(cfg)
    return out


def run_arm(name: str, overrides: list[str], data_dir: Path, args) -> dict:
    from albert_dist.data.loading import load_prepared
    from albert_dist.pretrain.job import open_phases, pretraining_model_config, pretraining_spec
    from albert_dist.train.loop import Trainer, WorkerEnv

    prepared = load_prepared(data_dir)
    cfg = load_config(
        PretrainJobConfig,
        None,
        [
            f"run.output_dir={data_dir.parent}",
            f"model.preset={args.preset}",
            "train.precision=fp32",
            f"train.batch_size={args.batch_size}",
            f"train.eval_every={args.eval_every}",
            f"train.eval_batches={args.eval_batches}",
            f"train.log_every={args.eval_every}",
            f"train.checkpoint_every={10 * args.steps}",
            *overrides,
            *([] if any(o.startswith("train.phases=") for o in overrides) else [f"train.max_steps={args.steps}"]),
        ],
    )
    phases = open_phases(cfg, prepared, pretraining_model_config(cfg, prepared.manifest))
    trained = {f"train_{i}": phase.prepared for i, phase in enumerate(phases)} or {"train": prepared}
    splits = {split: MemorySplit(data.shard_paths("train")) for split, data in trained.items()}
    splits["eval"] = MemorySplit(prepared.shard_paths("eval"))
    task = pretraining_spec(cfg, prepared, data_dir, phases=phases).build(0, 1, dataset=lambda split: splits[split])
    own_eval_batches = task.eval_batches
    if args.eval_masking:
        task.eval_batches = evaluated_with_masking(
            task, own_eval_batches, prepared.manifest, shlex.split(args.eval_masking)
        )
    curve: list[dict] = []
    started, second_evaluations = time.perf_counter(), 0.0  # the latter left out of the arm's clock

    def log_metrics(metrics: dict, step: int) -> None:
        nonlocal second_evaluations
        if "eval_mlm_accuracy" in metrics:
            point = {
                "step": step,
                "seconds": round(time.perf_counter() - started, 1),
                **{k: round(v, 4) for k, v in metrics.items() if k.startswith("eval_")},
            }
            also = ""
            if args.also_eval_masking:
                extra = evaluate_also(
                    trainer, task, own_eval_batches, prepared.manifest, shlex.split(args.also_eval_masking)
                )
                second_evaluations += extra.pop("seconds")
                point.update({f"also_{k}": round(v, 4) for k, v in extra.items()})
                also = (
                    f" | also-masks MLM {extra['eval_mlm_accuracy']:.3f} "
                    f"(unigram {extra.get('eval_mlm_unigram_baseline', float('nan')):.3f})"
                )
            point["seconds"] = round(point["seconds"] - second_evaluations, 1)
            curve.append(point)
            print(
                f"  {name} step {step}: MLM {metrics['eval_mlm_accuracy']:.3f} (unigram "
                f"{metrics.get('eval_mlm_unigram_baseline', float('nan')):.3f}) SOP "
                f"{metrics['eval_sop_accuracy']:.3f}{also}  {point['seconds']:.0f}s",
                flush=True,
            )

    trainer = Trainer(
        task, cfg.train, WorkerEnv(log_metrics=log_metrics, print_fn=lambda line: None), seed=cfg.run.seed
    )
    result = trainer.fit()
    slots = [(p.steps, p.batch_size * p.max_seq_length) for p in phases] or [
        (cfg.train.max_steps, cfg.train.batch_size * prepared.manifest["max_seq_length"])
    ]
    token_slots = sum(steps * per_step for steps, per_step in slots) * cfg.train.grad_accum_steps
    reached = {
        f"{metric}>={t}": next((p["step"] for p in curve if p.get(metric, 0) >= t), None)
        for metric, targets in THRESHOLDS.items()
        for t in targets
    }
    return {
        "arm": name,
        "overrides": overrides,
        "status": result["status"],
        "token_slots": token_slots,
        "seconds": round(time.perf_counter() - started - second_evaluations, 1),
        "reached": reached,
        "curve": curve,
    }


def evaluate_also(trainer, task, own_eval_batches, manifest: dict, overrides: list[str]) -> dict:
    """One more evaluation of the model as it stands, with the masking `overrides` give (the held-out masks fixed
    as the job's are), and the seconds it took."""
    started = time.perf_counter()
    evaluation = task.eval_batches
    task.eval_batches = evaluated_with_masking(task, own_eval_batches, manifest, overrides)
    try:
        metrics = trainer.evaluate()
    finally:
        task.eval_batches = evaluation
    return {**metrics, "seconds": time.perf_counter() - started}


def evaluated_with_masking(task, own_eval_batches, manifest: dict, overrides: list[str]):
    """The task's own evaluation batches (`own_eval_batches`) masked as the masking `overrides` give (e.g.
    single-token masks, as transformers' MLM collator draws them) instead of as the data was prepared."""
    from albert_dist.data.masking import MaskingCollator

    eval_collator = MaskingCollator.from_manifest(
        manifest, load_config(PretrainJobConfig, None, overrides).masking, mask_all=True
    )

    def masked_for_evaluation():
        own_collator, task.eval_collator = task.eval_collator, eval_collator
        try:
            yield from own_eval_batches()
        finally:
            task.eval_collator = own_collator

    return masked_for_evaluation


def first_step_sizes(data_dir: Path, args) -> None:
    """The size of the first update each arm's optimizer makes, from one shared gradient: LAMB scales a layer's
    step to lr × its weight norm, so at init (std 0.02) each weight moves by lr × 0.02, AdamW's by about lr."""
    import copy
    import statistics

    from albert_dist.data.loading import load_prepared
    from albert_dist.pretrain.job import pretraining_spec
    from albert_dist.train import optim

    prepared = load_prepared(data_dir)
    cfg = load_config(PretrainJobConfig, None, [f"model.preset={args.preset}", f"train.batch_size={args.batch_size}"])
    splits = {split: MemorySplit(prepared.shard_paths(split)) for split in ("train", "eval")}
    task = pretraining_spec(cfg, prepared, data_dir).build(0, 1, dataset=lambda split: splits[split])
    torch.manual_seed(0)
    model = task.build_model()
    task.loss(model, next(iter(task.train_batches(0))))[0].backward()
    for spec in args.arm:
        name, _, overrides = spec.partition("=")
        train = load_config(PretrainJobConfig, None, shlex.split(overrides)).train
        copy_ = copy.deepcopy(model)
        for source, target in zip(model.parameters(), copy_.parameters()):
            target.grad = source.grad.clone()
        before = {n: p.detach().clone() for n, p in copy_.named_parameters()}
        optimizer = optim.build_optimizer(
            train.optimizer,
            optim.parameter_groups(copy_.named_parameters(), train.weight_decay),
            train.learning_rate,
            (train.adam_beta1, train.adam_beta2),
            train.adam_epsilon,
            train.weight_decay,
        )
        optimizer.step()
        rms = [
            (p.detach() - before[n]).pow(2).mean().sqrt().item() for n, p in copy_.named_parameters() if p.dim() == 2
        ]
        print(f"{name}: median RMS change of a weight matrix in the first step {statistics.median(rms):.2e}")


def table(results: list[dict]) -> str:
    keys = [f"{m}>={t}" for m, targets in THRESHOLDS.items() for t in targets]
    head = (
        "| arm | "
        + " | ".join(k.replace("eval_", "").replace("_accuracy", "") for k in keys)
        + " | final MLM | final SOP | unigram | s/step |"
    )
    lines = [head, "|" + "---|" * (len(keys) + 5)]
    for r in results:
        last = r["curve"][-1] if r["curve"] else {}
        steps = last.get("step", 1)
        cells = [str(r["reached"][k]) if r["reached"][k] is not None else "—" for k in keys]
        lines.append(
            f"| {r['arm']} | " + " | ".join(cells) + f" | {last.get('eval_mlm_accuracy', float('nan')):.3f} | "
            f"{last.get('eval_sop_accuracy', float('nan')):.3f} | "
            f"{last.get('eval_mlm_unigram_baseline', float('nan')):.3f} | {r['seconds'] / steps:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus",
        default="zh",
        help="zh (the --zh-path file), en (the standard library's "
        "docstrings) or a text file of blank-line separated documents",
    )
    parser.add_argument("--zh-path", default="/work/corpora/zh_fortunes.txt")
    parser.add_argument("--data-root", default="/tmp/albert-recipes")
    parser.add_argument(
        "--prepared",
        type=Path,
        help="train on this prepared data (e.g. data prepare's with "
        "albert_dist/configs/prepare_zh.yaml) instead of preparing --corpus",
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument(
        "--short-seq",
        type=int,
        help="also prepare the corpus at this length with the --seq data's tokenizer, for arms with train.phases",
    )
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--eval-fraction", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--eval-masking",
        metavar="OVERRIDES",
        help="evaluate every arm with these masking.* overrides instead of the masking the data was prepared with",
    )
    parser.add_argument(
        "--also-eval-masking",
        metavar="OVERRIDES",
        help="at each evaluation also evaluate with these masking.* overrides (e.g. single-token "
        'masks: "masking.whole_word=false masking.max_ngram=1"), reported as also_*',
    )
    parser.add_argument(
        "--arm",
        action="append",
        required=True,
        metavar="NAME=OVERRIDES",
        help="an arm: its name and space-separated --set overrides",
    )
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--prepare-only", action="store_true")
    parser.add_argument(
        "--first-step",
        action="store_true",
        help="only print how far each arm's optimizer moves the weights in its first step",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = args.prepared or prepare(
        Path(args.data_root), args.corpus, args.zh_path, args.seq, args.vocab, args.eval_fraction
    )
    if args.short_seq:
        prepare(
            Path(args.data_root),
            args.corpus,
            args.zh_path,
            args.short_seq,
            args.vocab,
            args.eval_fraction,
            tokenizer_of=data_dir,
        )
    if args.prepare_only:
        return
    if args.first_step:
        first_step_sizes(data_dir, args)
        return
    results = []
    for spec in args.arm:
        name, _, overrides = spec.partition("=")
        results.append(run_arm(name, shlex.split(overrides), data_dir, args))
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
    print(
        f"\n{args.corpus}, {args.preset}, batch {args.batch_size} x {args.seq}, {args.threads} thread(s); "
        f"steps to the threshold (evaluated every {args.eval_every}):"
    )
    print(table(results))


if __name__ == "__main__":
    main()
