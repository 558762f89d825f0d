"""What pretraining buys on a real Chinese short-text classification set: `albert-dist finetune` from a
pretrained model and from a random init of the same shape (same vocab.txt), on the same data, steps, rate and
seeds, and the difference in dev accuracy.

    python benchmarks/corpora.py zh-manpage-sections /work/corpora/zh_sections    # the set, pretraining text
    albert-dist data prepare --config albert_dist/configs/prepare_zh.yaml --set run.output_dir=/work/zhsec \\
        --set 'data.inputs=[/work/corpora/zh_sections/pretrain_corpus.txt]'
    albert-dist pretrain --config albert_dist/configs/pretrain_zh.yaml --set run.output_dir=/work/zhsec \\
        --set train.max_steps=950                                                  # ~20 minutes on 2 CPUs
    python benchmarks/bench_zh_sections.py --pretrained /work/zhsec/albert-tiny-zh/model \\
        --task /work/corpora/zh_sections --out-dir /work/zhsec/sections

The set (benchmarks/corpora.py): the Chinese descriptions of manpages-zh's NAME lines ("列出目录内容"), labelled by
manual section (5 classes); the pretraining text holds the training pages only. Each fine-tuning evaluates once,
after its last step, so no arm picks its checkpoint on the dev set it is scored on.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def finetune_config(init_from: Path, task: Path, out_dir: Path, name: str, seed: int, args):
    from albert_dist.finetune.config import FinetuneJobConfig

    return FinetuneJobConfig.model_validate(
        {
            "run": {"name": name, "output_dir": str(out_dir), "seed": seed},
            "model": {"init_from": str(init_from)},
            "data": {
                "train": str(task / "train.jsonl"),
                "dev": str(task / "dev.jsonl"),
                "format": "jsonl",
                "text_column": "text",
                "label_column": "label",
                "max_seq_length": args.max_seq_length,
            },
            "finetune": {"task": "classification", "epochs": None},
            "scaling": {"num_workers": 1, "cpus_per_worker": 2},
            "train": {
                "max_steps": args.steps,
                "batch_size": args.batch_size,
                "learning_rate": args.learning_rate,
                "eval_every": args.steps,
                "checkpoint_every": args.steps,
                "log_every": args.steps,
            },
            "tracking": {"experiment": "bench-zh-sections"},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrained", type=Path, required=True, help="an exported model directory")
    parser.add_argument("--task", type=Path, required=True, help="train.jsonl and dev.jsonl")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--max-seq-length", type=int, default=32)
    args = parser.parse_args()

    from albert_dist.demo.job import random_init_like
    from albert_dist.finetune.job import FINETUNE

    random_init = random_init_like(args.pretrained, args.out_dir / "random-init" / "model", seed=0)
    arms = {"pretrained": args.pretrained, "random init": random_init}
    accuracy: dict[str, list[float]] = {arm: [] for arm in arms}
    for seed in range(args.seeds):
        for arm, init_from in arms.items():
            name = f"{arm.replace(' ', '-')}-seed{seed}"
            outcome = FINETUNE.run(finetune_config(init_from, args.task, args.out_dir, name, seed, args))
            accuracy[arm].append(outcome.metrics["dev_accuracy"])
            print(f"{arm:12} seed {seed}: dev accuracy {accuracy[arm][-1]:.3f}  (MLflow run {outcome.run_id})")
    dev_labels = [json.loads(line)["label"] for line in (args.task / "dev.jsonl").open(encoding="utf-8")]
    majority = max(map(dev_labels.count, set(dev_labels))) / len(dev_labels)
    gains = [100 * (p - r) for p, r in zip(accuracy["pretrained"], accuracy["random init"])]
    summary = {
        "dev_rows": len(dev_labels),
        "majority_class": majority,
        "accuracy": accuracy,
        "gain_points": gains,
        "mean_gain_points": statistics.mean(gains),
        "median_gain_points": statistics.median(gains),
        "args": vars(args),
    }
    print(f"dev rows {len(dev_labels)}, majority class {majority:.3f}")
    for arm, values in accuracy.items():
        print(f"{arm:12} mean dev accuracy {statistics.mean(values):.3f}  ({', '.join(f'{v:.3f}' for v in values)})")
    # the median too: one random-init run left on the majority class moves the mean by tens of points
    print(
        f"pretrained − random init: {summary['median_gain_points']:+.1f} points median, "
        f"{summary['mean_gain_points']:+.1f} mean ({', '.join(f'{g:+.1f}' for g in gains)} by seed)"
    )
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
