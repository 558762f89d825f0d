"""`albert-dist demo`: the main job end to end on embedded defaults, on a laptop.

Corpus (Python standard-library docstrings, extracted here) → tokenizer + prepared data (Ray Data) → pretraining
of a small ALBERT on 2 Ray Train workers → fine-tuning on a classification task built from the same corpus, once
from the pretrained model and once from a random init with the same budget (what pretraining bought) →
distillation into a smaller student → a small Ray Tune sweep; everything tracked in MLflow (a SQLite file under
the output directory).

The task is sentence order: two consecutive sentences of a docstring, as written or swapped. It is what the demo's
small pretraining learns (its SOP objective, on the same docstrings), and what a random init cannot learn from the
200 labelled pairs the fine-tunings get (1,000 more are the dev set): with more labelled pairs a random init learns
the task's surface cues too, and with a task that surface words decide it wins outright (benchmarks/README.md, the
demo).
"""

from __future__ import annotations

import csv
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from albert_dist.data.config import DataJobConfig
from albert_dist.demo.config import DemoJobConfig
from albert_dist.errors import ConfigError
from albert_dist.jobs.registry import Command
from albert_dist.model.checkpoint import CONFIG_NAME
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.storage import publish_dir, publish_file

#: written into run.output_dir by every demo: the directories `_start_fresh` may move aside and later delete
DEMO_MARKER = ".albert-dist-demo"


_CORPUS = Path("corpus", "stdlib_docstrings.txt")


if TYPE_CHECKING:
    from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
    from albert_dist.tune.config import FinetuneTuneConfig


def write_sentence_order_task(
    corpus: Path, directory: Path, train_rows: int = 200, dev_rows: int = 1000, seed: int = 0
) -> tuple[Path, Path]:
    """`train.csv` and `dev.csv` in `directory`: pairs of consecutive sentences of one docstring (text, text_pair),
    labelled `in_order` or `swapped` (then written the other way round), half of each overall; distinct pairs, none
    in both files."""
    from albert_dist.data.sentences import split_sentences

    pairs = []
    for block in corpus.read_text(encoding="utf-8").split("\n\n"):
        sentences = [s[:200] for s in split_sentences(block) if len(s.split()) >= 3]
        pairs += [(sentences[i], sentences[i + 1]) for i in range(0, len(sentences) - 1, 2)]
    pairs = list(dict.fromkeys(pairs))  # docstrings repeated in the library would put one pair in train and dev
    rng = random.Random(seed)
    chosen = rng.sample(pairs, min(train_rows + dev_rows, len(pairs) // 2 * 2))
    rows = [(a, b, "in_order") if i % 2 == 0 else (b, a, "swapped") for i, (a, b) in enumerate(chosen)]
    rng.shuffle(rows)

    return (
        _publish_pairs(directory / "train.csv", rows[:train_rows]),
        _publish_pairs(directory / "dev.csv", rows[train_rows:]),
    )


def _publish_pairs(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    """A CSV of (text, text_pair, label) rows, published atomically."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            out = csv.writer(f)
            out.writerow(["text", "text_pair", "label"])
            out.writerows(rows)

    return publish_file(path, write)


@dataclass(frozen=True)
class DemoPlan:
    """Every stage of a demo, configured before any runs: what `run_demo` does, and all that its keys decide."""

    root: Path
    corpus: Path
    corpus_chars: int
    prepare: DataJobConfig
    pretrain: PretrainJobConfig
    task_dir: Path  # the sentence-order task's train.csv and dev.csv
    task_train_rows: int
    seed: int  # the task's split and the random init's weights
    finetune: FinetuneJobConfig
    random_init: Path
    finetune_random_init: FinetuneJobConfig
    distill: DistillJobConfig
    sweep: FinetuneTuneConfig | None


def plan_demo(cfg: DemoJobConfig) -> DemoPlan:
    from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
    from albert_dist.storage import resolve_path
    from albert_dist.train.checkpointing import PUBLISHED_MODEL

    root = resolve_path(cfg.run.output_dir)
    corpus = root / _CORPUS
    task_dir = root / "corpus" / "sentence_order"
    prepare = DataJobConfig.model_validate(
        {
            "run": {"output_dir": str(root)},
            "data": {**cfg.data.model_dump(), "inputs": [str(corpus)]},
            "tokenizer": cfg.tokenizer,
            # without static masks the masking options are pretraining's alone
            "masking": cfg.masking.model_dump() if cfg.masking.static else {},
        }
    )
    pretrain = PretrainJobConfig.model_validate(
        {
            "run": {**cfg.run.model_dump(), "output_dir": str(root)},
            "model": cfg.model,
            "data": {"output": cfg.data.output},
            "masking": cfg.masking.model_dump(exclude={"static"}),
            "scaling": cfg.scaling.model_dump(),
            "train": cfg.train.model_dump(),
            "tracking": cfg.tracking,
        }
    )
    # 1e-3 for both arms: the pretrained model gains more from it than from 3e-4 (+6 against +4 points in one run)
    ft_train = {
        "max_steps": cfg.finetune_steps,
        "batch_size": 16,
        "precision": cfg.train.precision,
        "learning_rate": 1e-3,
        "log_every": 20,
        "eval_every": 20,
        "checkpoint_every": cfg.finetune_steps,
    }
    shared = {
        "data": {
            "train": str(task_dir / "train.csv"),
            "dev": str(task_dir / "dev.csv"),
            "text_pair_column": "text_pair",
            "max_seq_length": 64,
        },
        "scaling": cfg.scaling.model_dump(),
        "tracking": cfg.tracking.model_dump(),
        "finetune": {"epochs": None},
        "train": ft_train,
    }

    def finetune(name: str, model: Path) -> FinetuneJobConfig:
        return FinetuneJobConfig.model_validate(
            {
                **shared,
                "run": {"name": name, "output_dir": str(root), "seed": cfg.run.seed},
                "model": {"init_from": str(model)},
            }
        )

    ft = finetune("demo-finetune", pretrain.run.locate(PUBLISHED_MODEL))
    random_init = root / "random-init" / "model"
    distill = DistillJobConfig.model_validate(
        {
            **shared,
            "run": {"name": "demo-distill", "output_dir": str(root), "seed": cfg.run.seed},
            "distill": {"teacher": str(ft.run.locate(PUBLISHED_MODEL)), "speed_repeats": 5},
            "student": {"num_hidden_layers": cfg.student_layers},
        }
    )
    return DemoPlan(
        root=root,
        corpus=corpus,
        corpus_chars=cfg.corpus_chars,
        prepare=prepare,
        pretrain=pretrain,
        task_dir=task_dir,
        task_train_rows=cfg.task_train_rows,
        seed=cfg.run.seed,
        finetune=ft,
        random_init=random_init,
        finetune_random_init=finetune("demo-finetune-random-init", random_init),
        distill=distill,
        sweep=_sweep_config(cfg, ft, root) if cfg.sweep_trials else None,
    )


def run_demo(cfg: DemoJobConfig) -> int:
    from albert_dist.cluster.ray_init import ensure_ray
    from albert_dist.data.prepare import run_prepare
    from albert_dist.demo.corpus import write_stdlib_corpus
    from albert_dist.finetune.distill import DISTILL
    from albert_dist.finetune.job import FINETUNE
    from albert_dist.pretrain.job import PRETRAIN
    from albert_dist.tracking.run import ui_hint
    from albert_dist.train.precision import explain_precision
    from albert_dist.tune.report import table
    from albert_dist.tune.sweep import run_sweep

    plan = plan_demo(cfg)
    _start_fresh(plan.root)
    corpus = write_stdlib_corpus(plan.corpus, plan.corpus_chars)
    print(f"[1/6] corpus: {corpus} ({corpus.stat().st_size / 1e6:.1f} MB of standard-library docstrings)")
    ensure_ray()
    print("[2/6] preparing the corpus with Ray Data")
    run_prepare(plan.prepare)

    print("[3/6] pretraining")
    pre = PRETRAIN.run(plan.pretrain)

    print(
        "[4/6] fine-tuning on a task built from the corpus: are two consecutive sentences of a docstring in their "
        "order or swapped?"
    )
    write_sentence_order_task(corpus, plan.task_dir, train_rows=plan.task_train_rows, seed=plan.seed)
    ft = FINETUNE.run(plan.finetune)
    print("[4/6] the same fine-tuning from a random init of the same shape (what pretraining buys is the difference)")
    random_init_like(pre.model_dir, plan.random_init, plan.seed)
    scratch = FINETUNE.run(plan.finetune_random_init)

    print(f"[5/6] distilling into a {cfg.student_layers}-layer student")
    ds = DISTILL.run(plan.distill)

    sweep_table = None
    if plan.sweep:
        print(f"[6/6] a {plan.sweep.num_samples}-trial fine-tuning sweep with Ray Tune")
        sweep_table = table(run_sweep(plan.sweep).rows)
    _summary(pre, ft, scratch, ds, sweep_table, ui_hint(pre.tracking_uri))
    print(f"precision: {explain_precision(cfg.train.precision, cfg.scaling.use_gpu)}")
    return 0


def _start_fresh(root: Path) -> None:
    """A second demo into the same directory starts over: the earlier one is moved aside (the one before it
    deleted), not resumed. A directory holding anything but a demo is refused: it would be deleted in turn."""
    previous = root.with_name(root.name + ".previous")
    if root.exists() and any(root.iterdir()):
        for directory in (root, previous):
            if directory.exists() and not _is_demo(directory):
                raise ConfigError(
                    f"{directory} holds files that are not an earlier demo's (no {DEMO_MARKER}), and a demo into "
                    f"{root} moves the earlier one to {previous}, deleting the one before: choose another "
                    "run.output_dir (a new or empty directory)"
                )
        if previous.exists():
            shutil.rmtree(previous)
        root.rename(previous)
        print(f"{root} held an earlier demo: moved to {previous}; this run starts fresh")
    root.mkdir(parents=True, exist_ok=True)
    (root / DEMO_MARKER).write_text("albert-dist demo\n")


def _is_demo(directory: Path) -> bool:
    """A demo's run.output_dir: its marker, or (written before the marker was) its corpus."""
    return (directory / DEMO_MARKER).is_file() or (directory / _CORPUS).is_file()


def random_init_like(pretrained: Path, target: Path, seed: int) -> Path:
    """An untrained model of the pretrained one's shape, with its tokenizer, in `target`: the fine-tuning
    baseline."""
    import torch

    from albert_dist.model import AlbertConfig, AlbertForPreTraining
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    torch.manual_seed(seed)
    model = AlbertForPreTraining(AlbertConfig.from_json_file(pretrained / "config.json"))

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        load_tokenizer(pretrained).save(directory)

    return publish_dir(target, write, marker=CONFIG_NAME)


def _sweep_config(cfg: DemoJobConfig, ft_cfg, root: Path):
    from albert_dist.tune.config import FinetuneTuneConfig

    return FinetuneTuneConfig.model_validate(
        {
            "job": ft_cfg.model_dump(),
            "run": {"name": "demo-sweep", "output_dir": str(root / "sweeps"), "seed": cfg.run.seed},
            "search_space": {
                "train.learning_rate": {"loguniform": [1e-4, 1e-3]},
                "finetune.layer_lr_decay": {"uniform": [0.7, 1.0]},
            },
            "num_samples": cfg.sweep_trials,
            "max_concurrent_trials": 1,
            "resources_per_trial": {"num_workers": 1, "cpu": 1.0},
        }
    )


def _summary(pre, ft, scratch, ds, sweep_table: str | None, ui: str) -> None:
    m, p = ds.metrics, pre.metrics
    nan = float("nan")
    print("\n=== albert-dist demo: results ===")
    print(
        f"pretraining   eval MLM accuracy {p.get('eval_mlm_accuracy', nan):.3f} (unigram baseline "
        f"{p.get('eval_mlm_unigram_baseline', nan):.3f}) where the input shows [MASK], eval SOP accuracy "
        f"{p.get('eval_sop_accuracy', nan):.3f} (chance 0.5)  → {pre.model_dir}"
    )
    pretrained, random_init = ft.metrics["dev_accuracy"], scratch.metrics["dev_accuracy"]
    print(
        f"pretrained vs random init: fine-tuned dev accuracy {pretrained:.3f} from the pretrained model, "
        f"{random_init:.3f} from a random init (same steps): {100 * (pretrained - random_init):+.1f} points"
    )
    print(f"{'':14}{'teacher (fine-tuned)':>24}{'student (distilled)':>24}")
    print(f"{'dev accuracy':14}{m['teacher_dev_accuracy']:>24.3f}{m['student_dev_accuracy']:>24.3f}")
    print(f"{'parameters':14}{m['teacher_parameters'] / 1e6:>23.2f}M{m['student_parameters'] / 1e6:>23.2f}M")
    print(f"{'sequences/s':14}{m['teacher_sequences_per_s']:>24.0f}{m['student_sequences_per_s']:>24.0f}")
    print(
        f"student keeps {100 * m['student_share_of_teacher']:.1f}% of the teacher's accuracy, "
        f"{m['speedup']:.2f}x faster  → {ds.model_dir}"
    )
    if sweep_table:
        print("\nfine-tuning sweep:\n" + sweep_table)
    from albert_dist.redaction import redact_url

    print(f"\nMLflow: {redact_url(ft.tracking_uri)}\nMLflow UI: {ui}")


DEMO = Command(run_demo)
