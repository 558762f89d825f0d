"""`albert-dist demo`: the main job end to end on embedded defaults, on a laptop.

Corpus (Python standard-library docstrings, extracted here) → tokenizer + prepared data (Ray Data) → pretraining
of a tiny ALBERT on 2 Ray Train workers in bf16, tracked in MLflow (a SQLite file under the output directory).
"""

from __future__ import annotations

from pydantic import Field

from albert_dist.config import (DataJobConfig, DataSection, MaskingSection, ModelSection, PretrainJobConfig,
                                RunSection, ScalingSection, Section, TokenizerSection, TrackingSection, TrainSection)


class DemoJobConfig(Section):
    run: RunSection = Field(default_factory=lambda: RunSection(name="demo", output_dir="runs/demo"))
    corpus_chars: int = Field(600_000, gt=10_000, description="How much docstring text to extract.")
    tokenizer: TokenizerSection = Field(default_factory=lambda: TokenizerSection(vocab_size=3000))
    data: DataSection = Field(default_factory=lambda: DataSection(format="blocks", max_seq_length=128,
                                                                  output="data/prepared", eval_fraction=0.05))
    masking: MaskingSection = Field(default_factory=MaskingSection)
    model: ModelSection = Field(default_factory=ModelSection)
    scaling: ScalingSection = Field(default_factory=lambda: ScalingSection(num_workers=2, cpus_per_worker=0.5))
    train: TrainSection = Field(default_factory=lambda: TrainSection(
        max_steps=300, warmup_steps=30, batch_size=16, learning_rate=2e-3, log_every=20, eval_every=100,
        checkpoint_every=100, eval_batches=10))
    tracking: TrackingSection = Field(default_factory=lambda: TrackingSection(experiment="albert-dist-demo"))


def run_demo(cfg: DemoJobConfig) -> int:
    from albert_dist.config import resolve_path
    from albert_dist.data.prepare import run_prepare
    from albert_dist.demo_corpus import write_stdlib_corpus
    from albert_dist.pretrain import run_pretrain
    from albert_dist.ray_init import ensure_ray

    root = resolve_path(cfg.run.output_dir)
    corpus = write_stdlib_corpus(root / "corpus" / "stdlib_docstrings.txt", cfg.corpus_chars)
    print(f"[1/2] corpus: {corpus} ({corpus.stat().st_size / 1e6:.1f} MB of standard-library docstrings)")
    ensure_ray()
    run = cfg.run.model_copy(update={"output_dir": str(root)})
    data = cfg.data.model_copy(update={"inputs": [str(corpus)]})
    run_prepare(DataJobConfig(run=run, data=data, tokenizer=cfg.tokenizer, masking=cfg.masking))
    print("[2/2] pretraining")
    run_pretrain(PretrainJobConfig(run=run, model=cfg.model, data=data, masking=cfg.masking, scaling=cfg.scaling,
                                   train=cfg.train, tracking=cfg.tracking))
    return 0
