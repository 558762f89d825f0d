import pytest

from albert_dist.config import apply_overrides, flatten, load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.errors import ConfigError
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.storage import resolve_location, resolve_path


def write(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_yaml_and_overrides_are_typed(tmp_path):
    path = write(tmp_path, "train:\n  max_steps: 50\n  warmup_steps: 5\nmodel:\n  preset: base\n")
    cfg = load_config(
        PretrainJobConfig, path, ["train.learning_rate=1e-4", "model.hidden_size=256", "scaling.use_gpu=true"]
    )
    assert cfg.train.max_steps == 50 and cfg.train.learning_rate == pytest.approx(1e-4)
    assert cfg.model.preset == "base" and cfg.model.hidden_size == 256 and cfg.scaling.use_gpu is True
    assert cfg.model.overrides() == {"hidden_size": 256}


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.learnig_rate: unknown key"):
        load_config(PretrainJobConfig, write(tmp_path, "train:\n  learnig_rate: 0.1\n"))
    with pytest.raises(ConfigError, match=r"bogus: unknown key"):
        load_config(PretrainJobConfig, None, ["bogus.x=1"])


def test_pretraining_only_keys_are_unknown_to_fine_tuning():
    """Fine-tuning has no unigram baseline nor range test: it refuses their keys instead of ignoring them."""
    from albert_dist.finetune.config import FinetuneJobConfig

    assert load_config(PretrainJobConfig, None, ["train.plateau_warning_after=0.5"]).train.plateau_warning_after == 0.5
    for key, unknown in (
        ("train.plateau_warning_after=0.5", "train.plateau_warning_after"),
        ("lr_range.steps=10", "lr_range"),
    ):
        with pytest.raises(ConfigError, match=rf"{unknown}: unknown key"):
            load_config(FinetuneJobConfig, None, [key])


def test_impossible_values_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.learning_rate: .*greater than 0.*-1"):
        load_config(PretrainJobConfig, None, ["train.learning_rate=-1"])
    with pytest.raises(ConfigError, match=r"warmup_steps \(500\) exceeds max_steps \(100\)"):
        load_config(PretrainJobConfig, None, ["train.max_steps=100", "train.warmup_steps=500"])
    with pytest.raises(ConfigError, match="precision"):
        load_config(PretrainJobConfig, None, ["train.precision=fp8"])


def test_model_section_reports_model_validation(tmp_path):
    cfg = load_config(PretrainJobConfig, None, ["model.hidden_size=100", "model.num_attention_heads=12"])
    with pytest.raises(ConfigError, match=r"model: .*hidden_size \(100\).*num_attention_heads \(12\)"):
        cfg.model.build(vocab_size=1000)
    built = load_config(PretrainJobConfig, None, ["model.preset=base"]).model.build(vocab_size=1000)
    assert (built.hidden_size, built.num_hidden_layers, built.vocab_size) == (768, 12, 1000)


def test_bad_files_and_override_syntax(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(DataJobConfig, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(DataJobConfig, write(tmp_path, "data: [unclosed\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(DataJobConfig, write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="section.field=value"):
        apply_overrides({}, ["no_equals_sign"])
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"train": 3}, ["train.max_steps=1"])


def test_yaml_lists_in_overrides_and_flatten():
    cfg = load_config(DataJobConfig, None, ["data.inputs=[a.txt, b.txt]"])
    assert cfg.data.inputs == ["a.txt", "b.txt"]
    flat = flatten(cfg)
    assert flat["data.inputs"] == ["a.txt", "b.txt"] and flat["tokenizer.vocab_size"] == 8000


def test_relative_paths_do_not_depend_on_the_job_working_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ALBERT_DIST_HOME", str(tmp_path))
    assert resolve_path("runs") == tmp_path / "runs"
    assert resolve_path("/abs/x") == resolve_path("/abs/x").resolve()
    assert resolve_location("s3://bucket/x", base="/base") == "s3://bucket/x"  # URIs: tests/test_s3.py
    assert resolve_path("data", base="/base") == resolve_path("/base/data")


def test_override_keeps_the_job_s_own_section_defaults():
    from albert_dist.demo.config import DemoJobConfig

    cfg = load_config(DemoJobConfig, None, ["run.output_dir=/tmp/x", "train.max_steps=500"])
    assert cfg.run.name == "demo" and cfg.run.output_dir == "/tmp/x"
    assert cfg.train.max_steps == 500 and cfg.train.batch_size == DemoJobConfig().train.batch_size


@pytest.mark.parametrize(
    "job, key, hint",
    [
        ("finetune", "train.warmup_steps=10", "finetune.warmup_ratio"),
        ("distill", "train.eval_batches=5", "whole dev set"),
        ("finetune", "model.preset=base", "model.init_from's"),
        ("finetune", "model.hidden_size=64", "can change its dropout"),
        ("pretrain", "data.format=blocks", "data prepare"),
        ("pretrain", "data.inputs=[a.txt]", "data prepare"),
        ("pretrain", "masking.static=true", "data prepare's masking.static"),
        ("prepare_data", "data.cache=memory", None),
        ("prepare_data", "run.name=prepare", "data.output"),
        ("prepare_data", "run.seed=1", "data.seed"),
        ("demo", "data.inputs=[a.txt]", None),
        ("demo", "train.lr_range_test=true", "a command of its own: albert-dist lr-range"),
        ("pretrain", "train.lr_range_steps=10", "albert-dist lr-range, in its section: lr_range.steps"),
        ("lr-range", "lr_range.test=true", None),
        ("demo", "run.resume_changes=allow", "the demo starts afresh"),
        ("tune-finetune", "run.resume_changes=allow", "a sweep resumes its trials as they were launched"),
    ],
)
def test_keys_a_job_does_not_read_are_unknown_with_a_hint(job, key, hint):
    """A key another job reads is refused by a job that would ignore it, and the message says where it belongs."""
    from albert_dist.jobs.registry import JOBS

    name = key.partition("=")[0]
    with pytest.raises(ConfigError) as err:
        load_config(JOBS[job].config_class(), None, [key])
    assert f"{name}: unknown key" + (" (" if hint else "") in str(err.value)
    assert hint is None or hint in str(err.value)


def test_the_range_test_is_a_command_on_the_pretraining_config():
    """`albert-dist lr-range` reads a pretraining job's config as `albert-dist pretrain` does, plus its own section,
    which pretraining refuses, naming the command."""
    from albert_dist.pretrain.config import LrRangeJobConfig

    pretraining = PretrainJobConfig().model_dump()
    assert LrRangeJobConfig().model_dump(exclude={"lr_range"}) == pretraining
    assert set(LrRangeJobConfig.model_fields) == {*PretrainJobConfig.model_fields, "lr_range"}
    assert load_config(LrRangeJobConfig, None, ["lr_range.steps=10"]).lr_range.steps == 10
    with pytest.raises(ConfigError, match=r"lr_range: unknown key \(.*a command of its own: albert-dist lr-range\)"):
        load_config(PretrainJobConfig, None, ["lr_range.steps=10"])


def test_fine_tuning_length_is_epochs_or_max_steps_not_both():
    from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig

    assert load_config(FinetuneJobConfig).finetune.epochs == 3 and FinetuneJobConfig().train.max_steps is None
    cfg = load_config(DistillJobConfig, None, ["finetune.epochs=", "train.max_steps=40"])
    assert (cfg.finetune.epochs, cfg.train.max_steps) == (None, 40)
    for overrides in (["train.max_steps=40"], ["finetune.epochs="]):
        with pytest.raises(ConfigError, match="give the training length once"):
            load_config(FinetuneJobConfig, None, overrides)


def test_pretraining_from_a_model_keeps_its_shape():
    assert load_config(PretrainJobConfig, None, ["model.init_from=/m"]).model.overrides() == {}
    with pytest.raises(ConfigError, match=r"model: hidden_size cannot be set with init_from"):
        load_config(PretrainJobConfig, None, ["model.init_from=/m", "model.hidden_size=64"])


def test_preparation_refuses_options_it_would_not_use():
    """With a given tokenizer its training options, and without static masks the masking options, do nothing."""
    assert (
        load_config(
            DataJobConfig, None, ["tokenizer.path=/tok", "masking.static=true", "masking.mlm_probability=0.2"]
        ).masking.mlm_probability
        == 0.2
    )
    with pytest.raises(ConfigError, match=r"tokenizer\.vocab_size: options of training a tokenizer"):
        load_config(DataJobConfig, None, ["tokenizer.path=/tok", "tokenizer.vocab_size=500"])
    with pytest.raises(ConfigError, match=r"masking\.max_ngram, masking\.whole_word: options of static masks"):
        load_config(DataJobConfig, None, ["masking.max_ngram=1", "masking.whole_word=false"])


def test_distillation_takes_its_task_and_default_metric_from_the_teacher(tmp_path):
    """A NER teacher's student is picked by entity F1, a reader's may be by exact match, and a metric the teacher's
    task lacks is refused, naming both; a sweep's metric follows."""
    from albert_dist.finetune.config import DistillJobConfig
    from albert_dist.model import AlbertConfig
    from albert_dist.tune.config import DistillTuneConfig

    def teacher(architecture: str) -> str:
        directory = tmp_path / architecture
        directory.mkdir(exist_ok=True)
        AlbertConfig(architectures=[architecture]).to_json_file(directory / "config.json")
        return str(directory)

    def distill(architecture: str, *overrides: str) -> DistillJobConfig:
        return load_config(DistillJobConfig, None, [f"distill.teacher={teacher(architecture)}", *overrides])

    assert distill("AlbertForTokenClassification").best_metric == "f1"
    assert distill("AlbertForQuestionAnswering", "finetune.metric=exact_match").best_metric == "exact_match"
    assert distill("AlbertForSequenceClassification").best_metric == "accuracy"
    classifier = distill("AlbertForMaskedLM", "finetune.metric=pearson")  # any other head: a classifier's teacher
    with pytest.raises(ConfigError, match="metric pearson does not apply to classification; use one of accuracy"):
        _ = classifier.best_metric
    with pytest.raises(ConfigError, match="distill.teacher is not set"):
        _ = load_config(DistillJobConfig).best_metric
    sweep = DistillTuneConfig.model_validate({"job": distill("AlbertForTokenClassification")})
    assert sweep.tune_metric == "eval_f1"
    with pytest.raises(ConfigError, match=r"finetune\.task: unknown key \(distillation's task is its teacher's"):
        load_config(DistillJobConfig, None, ["finetune.task=classification"])
    with pytest.raises(ConfigError, match="data: labels: distillation learns the teacher's labels"):
        load_config(DistillJobConfig, None, ["data.labels=[neg, pos]"])


def test_distillation_keeps_its_run_directory_local():
    """The student's initial weights are staged in the run directory, which every worker reads."""
    from albert_dist.finetune.config import DistillJobConfig

    with pytest.raises(
        ConfigError, match="run: output_dir is a URI, but distillation stages the student's initial weights"
    ):
        load_config(DistillJobConfig, None, ["run.output_dir=s3://bucket/runs"])


def test_phases_give_max_steps_or_must_agree_with_it(tmp_path):
    two = "train.phases=[{data: prepared_128, steps: 270, batch_size: 64, max_seq_length: 128}, {steps: 30}]"
    cfg = load_config(PretrainJobConfig, None, [two])
    assert cfg.train.max_steps == 300 and cfg.train.phases[1].data is None and cfg.train.phases[1].batch_size is None
    assert load_config(PretrainJobConfig, write(tmp_path, "train:\n  max_steps: 300\n"), [two]).train.max_steps == 300
    with pytest.raises(ConfigError, match=r"the phases' steps add up to 300, max_steps is 600"):
        load_config(PretrainJobConfig, None, [two, "train.max_steps=600"])
    with pytest.raises(ConfigError, match=r"train\.phases\.0\.steps: .*greater than 0"):
        load_config(PretrainJobConfig, None, ["train.phases=[{steps: 0}]"])
    with pytest.raises(ConfigError, match=r"train\.phases\.0\.data: .*credentials"):
        load_config(PretrainJobConfig, None, ["train.phases=[{data: 's3://key:secret@bucket/x', steps: 5}]"])
    from albert_dist.finetune.config import FinetuneJobConfig

    with pytest.raises(ConfigError, match=r"train\.phases: unknown key"):
        load_config(FinetuneJobConfig, None, [two])


def test_every_config_section_is_at_most_two_levels_below_section():
    """A reader finds a key in the section they opened or its one parent: no section of any job config inherits
    from a class that itself inherits from another section class."""
    import albert_dist.demo.job
    import albert_dist.finetune.config
    import albert_dist.tune.config
    from albert_dist.config import Section

    del albert_dist  # imported for their sections
    found, todo = set(), [Section]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("albert_dist") and sub not in found:
                found.add(sub)
                todo.append(sub)
    deep = {cls.__name__: depth for cls in found if (depth := cls.__mro__.index(Section)) > 2}
    assert len(found) > 30 and deep == {}


def test_an_elastic_range_is_for_pretraining_in_order_and_resize_check_needs_one():
    from albert_dist.finetune.config import FinetuneJobConfig
    from albert_dist.train.ray_runner import scaling_config

    elastic = load_config(PretrainJobConfig, None, ["scaling.num_workers=[1, 4]", "scaling.resize_check_s=5"]).scaling
    assert elastic.worker_range == (1, 4)
    ray_scaling = scaling_config(elastic)  # Ray Train's elastic worker group
    assert (ray_scaling.min_workers, ray_scaling.max_workers, ray_scaling.elastic_resize_monitor_interval_s) == (
        1,
        4,
        5,
    )
    assert load_config(PretrainJobConfig, None, ["scaling.num_workers=3"]).scaling.worker_range == (3, 3)
    for overrides, message in (
        (["scaling.num_workers=[4, 1]"], "min > max"),
        (["scaling.resize_check_s=5"], "resize_check_s is how often an elastic run"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(PretrainJobConfig, None, overrides)
    with pytest.raises(ConfigError, match="scaling.num_workers"):
        load_config(FinetuneJobConfig, None, ["scaling.num_workers=[1, 2]"])
