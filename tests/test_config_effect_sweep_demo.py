"""Every key of a sweep and of the demo has an effect: set to another valid value, it changes the resolved plan
(`plan_sweep`: the trials' job and resources, the search space, how Tune searches and schedules; `plan_demo`: every
stage's config, the corpus, the task), resolved without Ray or MLflow. What the plans hand on (the trials' job, the
demo's stages) is proven to change what those jobs do by test_config_effect.py and test_config_effect_prepare.py.
"""

from __future__ import annotations

import dataclasses

from effect_helpers import Together, keys_without_effect, leaf_keys

from albert_dist.config import load_config
from albert_dist.demo.config import DemoJobConfig
from albert_dist.demo.job import plan_demo
from albert_dist.model import AlbertConfig
from albert_dist.tune.config import DistillTuneConfig, FinetuneTuneConfig
from albert_dist.tune.sweep import plan_sweep


class Sweep:
    """The sweep's plan, its trials' job as a trial runs it (its own run, under the sweep)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def resolved(self):
        plan = plan_sweep(self.cfg)
        return dataclasses.replace(plan, trial=None), plan.trial.job_for({}, "trial"), plan.trial.metric


class Demo:
    def __init__(self, cfg):
        self.cfg = cfg

    def resolved(self):
        return plan_demo(self.cfg)


SPACE = {"train.learning_rate": {"loguniform": [0.0001, 0.001]}}


#: the job's own keys reach each trial whole (`TrialSetup.job_for`) and test_config_effect.py proves each of them
#: to change the job's plan: one stands here for all of them
JOB_STANDS_FOR_ALL = "job.train.weight_decay"
REPLACED_BY_THE_TRIAL = {
    "job.run.name": "each trial runs under its own name, its trial id (a job's YAML is reused as it is)",
    "job.run.output_dir": "each trial runs in the sweep's trials directory",
}


def test_every_sweep_key_changes_its_plan(tmp_path):
    # a distillation sweep reads its teacher's task (its default metric) when it is planned
    (tmp_path / "teacher").mkdir()
    AlbertConfig(architectures=["AlbertForSequenceClassification"]).to_json_file(tmp_path / "teacher" / "config.json")
    for config, job in (
        (FinetuneTuneConfig, {"model.init_from": str(tmp_path / "model")}),
        (DistillTuneConfig, {"distill.teacher": str(tmp_path / "teacher")}),
    ):
        sets = [f"search_space={SPACE}", f"run.output_dir={tmp_path}", *(f"job.{k}={v}" for k, v in job.items())]
        cfg = load_config(config, None, sets)
        alternatives = {
            "search_space": {"train.weight_decay": {"uniform": [0.0, 0.1]}},
            "metric": "eval_loss",
            "mode": "min",
            "run.name": "other-sweep",
            "run.output_dir": str(tmp_path / "other"),
            "resources_per_trial.num_workers": 3,
            "resources_per_trial.cpu": 0.25,
            "resources_per_trial.gpu": 1.0,
            "scheduler.reduction_factor": 3.0,
        }
        job_keys = {
            key: "proven by test_config_effect.py"
            for key, _ in leaf_keys(config)
            if key.startswith("job.") and key != JOB_STANDS_FOR_ALL
        }
        problems = keys_without_effect(Sweep, cfg, alternatives, {**job_keys, **REPLACED_BY_THE_TRIAL})
        assert problems == [], (config.__name__, problems)


DEMO_SHAPE = ("model.hidden_size", "model.num_attention_heads", "model.intermediate_size")


def test_every_demo_key_changes_its_plan(tmp_path):
    cfg = load_config(DemoJobConfig, None, [f"run.output_dir={tmp_path / 'demo'}"])
    alternatives = {
        "run.output_dir": str(tmp_path / "other"),
        "run.name": "other-demo",
        "data.output": "data/other",
        "data.text_field": "body",
        "data.tokenizer_actors": 2,
        "data.range_bytes": 30_000,
        "data.user_dict": Together({"data.user_dict": str(tmp_path / "words.txt"), "data.word_segmenter": "jieba"}),
        "tokenizer.character_coverage": 0.99,
        "model.init_from": Together({"model.init_from": str(tmp_path / "model"), **dict.fromkeys(DEMO_SHAPE)}),
        "model.hidden_dropout_prob": 0.05,
        "model.attention_probs_dropout_prob": 0.05,
        "model.classifier_dropout_prob": 0.05,
        "model.embedding_size": 64,
        "model.num_hidden_layers": 2,
        "model.num_hidden_groups": 2,
        "model.inner_group_num": 2,
        "model.hidden_act": "relu",
        "model.max_position_embeddings": 256,
        "train.peak_tflops": 10.0,
        "tracking.experiment": "other",
        "tokenizer.path": Together({"tokenizer.path": str(tmp_path / "tokenizer"), "tokenizer.vocab_size": 8000}),
        "tracking.tracking_uri": "sqlite:///other.db",
        "tracking.register_model": "other-model",
        "train.phases": [{"steps": 1200, "max_seq_length": 32}, {"steps": 1200}],
    }
    assert keys_without_effect(Demo, cfg, alternatives, {}) == []


def test_every_registered_job_has_its_effect_test():
    """A job added to the registry needs its keys proven here, in test_config_effect.py or in
    test_config_effect_prepare.py (the test of each is named in the comment)."""
    from albert_dist.jobs.registry import JOBS

    assert set(JOBS) == {
        "prepare_data",  # test_config_effect_prepare.py
        "pretrain",  # test_config_effect.py
        "lr-range",  # pretrain's config, to share its YAML (not every key acts on the test); lr_range: test_pretrain.py
        "finetune",  # test_config_effect.py
        "distill",  # test_config_effect.py
        "tune-finetune",  # above
        "tune-distill",  # above
        "demo",  # above
    }
