"""`albert-dist demo`'s config: the sizes and budgets of each stage of the pipeline it runs."""

from __future__ import annotations

from pydantic import Field

from albert_dist.config import RunSection, ScalingSection, Section, TrackingSection
from albert_dist.data.config import PreparationSection, PrepareMaskingSection, TokenizerSection
from albert_dist.model.sections import ModelSection
from albert_dist.pretrain.config import PretrainTrainSection


class DemoJobConfig(Section):
    run: RunSection = Field(default_factory=lambda: RunSection(name="demo", output_dir="runs/demo"))
    corpus_chars: int = Field(600_000, gt=10_000, description="How much docstring text to extract.")
    tokenizer: TokenizerSection = Field(default_factory=lambda: TokenizerSection(vocab_size=3000))
    data: PreparationSection = Field(
        # five cuts of each document into sentence pairs: with one, 1,200 steps see every pair ~8 times and SOP
        # learned the training pairs by heart (0.95 on them, 0.58 held out, in one seed of three)
        default_factory=lambda: PreparationSection(
            format="blocks", max_seq_length=64, output="data/prepared", eval_fraction=0.15, dupe_factor=5
        )
    )
    masking: PrepareMaskingSection = Field(default_factory=PrepareMaskingSection)
    # tiny's shape at a third of its width: four times the steps of tiny in the same minutes on 2 cores
    model: ModelSection = Field(
        default_factory=lambda: ModelSection(hidden_size=128, num_attention_heads=4, intermediate_size=512)
    )
    scaling: ScalingSection = Field(default_factory=lambda: ScalingSection(num_workers=2, cpus_per_worker=0.5))
    train: PretrainTrainSection = Field(
        default_factory=lambda: PretrainTrainSection(
            optimizer="adamw",
            learning_rate=1e-3,
            max_steps=2400,  # held-out MLM +2.5 to +3.0 points over its unigram baseline (1,200 steps: +1.2 to +2.3)
            warmup_steps=60,
            publish="last",
            batch_size=16,
            log_every=300,  # the console stays short: 8 progress lines and 4 evaluations
            eval_every=600,
            checkpoint_every=600,
            eval_batches=128,  # every held-out pair (~2,000: five cuts of ~260 documents), SOP within ±1.1 points
            plateau_warning_after=0.5,
        )
    )
    task_train_rows: int = Field(
        200, gt=0, description="Labelled sentence pairs the fine-tunings learn from (1,000 more are the dev set)."
    )
    finetune_steps: int = Field(
        60,
        gt=0,
        description="Steps of each fine-tuning (from the pretrained model and "
        "from a random init), distillation and sweep trial.",
    )
    student_layers: int = Field(1, gt=0, description="Layers of the distilled student (the teacher has the preset's).")
    sweep_trials: int = Field(2, ge=0, description="Trials of the closing fine-tuning sweep; 0 skips it.")
    tracking: TrackingSection = Field(default_factory=lambda: TrackingSection(experiment="albert-dist-demo"))
