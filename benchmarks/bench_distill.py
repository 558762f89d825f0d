"""Teacher vs distilled-student inference: throughput on the same batch, machine and precision (fp32 and bf16
autocast), and, given fine-tuned model directories and a dev file, their dev metrics on the same data.

    python benchmarks/bench_distill.py                       # shapes only: 12-layer H=312 teacher vs students
    python benchmarks/bench_distill.py --teacher T --student S --dev dev.csv [--text-column text ...]

Without model directories the models are randomly initialised (speed does not depend on the weights):
teacher 12 layers, shared H=312 (ALBERT tiny's width); students 4 layers at H=312 (initialisable from the
teacher's shared group) and 4 layers at H=128.
"""

from __future__ import annotations

import argparse
import platform

import torch

from albert_dist.data import batching
from albert_dist.finetune import inference
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification

SHAPES = {
    "teacher 12L H312": dict(num_hidden_layers=12, hidden_size=312, num_attention_heads=12, intermediate_size=1248),
    "student 4L H312": dict(num_hidden_layers=4, hidden_size=312, num_attention_heads=12, intermediate_size=1248),
    "student 4L H128": dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, intermediate_size=512),
}


def random_batch(batch_size: int, seq_len: int, vocab_size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(5, vocab_size, (batch_size, seq_len), generator=g),
        "attention_mask": torch.ones(batch_size, seq_len, dtype=torch.long),
        "token_type_ids": torch.zeros(batch_size, seq_len, dtype=torch.long),
    }


def dev_comparison(args) -> None:
    from albert_dist.finetune.config import TaskDataSection
    from albert_dist.finetune.job import prepare_task_data

    teacher = AlbertForSequenceClassification.from_pretrained(args.teacher)
    student = AlbertForSequenceClassification.from_pretrained(args.student)
    names = [teacher.config.id2label[i] for i in range(teacher.config.num_labels)]
    section = TaskDataSection(
        train=args.dev,
        dev=args.dev,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        label_column=args.label_column,
        max_seq_length=args.seq_len,
    )
    dev = prepare_task_data(section, "classification", args.teacher, label_names=names).splits["dev"]
    batch = next(batching.batches(dev, args.batch_size, 8))
    for precision in args.precisions.split(","):
        t_metrics = inference.evaluate(teacher, dev, task="classification", precision=precision)
        s_metrics = inference.evaluate(student, dev, task="classification", precision=precision)
        speeds = inference.throughputs({"teacher": teacher, "student": student}, batch, precision, args.repeats)
        t_speed, s_speed = speeds["teacher"], speeds["student"]
        print(
            f"{precision}: teacher acc {t_metrics['accuracy']:.4f} {t_speed:.0f} seq/s | student acc "
            f"{s_metrics['accuracy']:.4f} {s_speed:.0f} seq/s | share {s_metrics['accuracy'] / t_metrics['accuracy']:.3f}"
            f" | speedup x{s_speed / t_speed:.2f}"
        )


def shape_comparison(args) -> None:
    batch = random_batch(args.batch_size, args.seq_len, 8000)
    models = {
        name: AlbertForSequenceClassification(AlbertConfig(vocab_size=8000, embedding_size=128, **shape))
        for name, shape in SHAPES.items()
    }
    for precision in args.precisions.split(","):
        speeds = inference.throughputs(models, batch, precision, args.repeats)
        teacher = speeds["teacher 12L H312"]
        print(
            f"{precision} (batch {args.batch_size} x {args.seq_len}): "
            + " | ".join(f"{name} {speed:.0f} seq/s (x{speed / teacher:.2f})" for name, speed in speeds.items())
        )
    print("parameters: " + ", ".join(f"{name} {m.num_parameters() / 1e6:.2f}M" for name, m in models.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher"), parser.add_argument("--student"), parser.add_argument("--dev")
    parser.add_argument("--text-column", default="text"), parser.add_argument("--text-pair-column")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--precisions", default="fp32,bf16", help="bf16 is emulated (very slow) on CPUs without AVX512-BF16/AMX"
    )
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    if args.teacher and args.student and args.dev:
        dev_comparison(args)
    else:
        shape_comparison(args)


if __name__ == "__main__":
    main()
