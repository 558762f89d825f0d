"""`albert-dist`: the command line. Each subcommand parses its flags and hands a validated config to the library.

Errors caused by the user's input (`errors.user_error`: an `AlbertDistError`, or the OS refusing one of the user's
paths) are printed as one line and exit with status 2; anything else is a bug and keeps its traceback.

A job submitted to a Ray cluster (`albert-dist submit`) runs this module too: `python -m albert_dist.cli <command>`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from albert_dist.errors import AlbertDistError, ConfigError, user_error
from albert_dist.jobs.registry import GROUPS, JOBS, Job

# Set by Ray's job supervisor in the environment of a submitted job's entrypoint.
_RAY_JOB_MARKER = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="YAML job config: a file, or the name of a config shipped in the package (albert-dist config list); "
        "embedded defaults when omitted",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one config field, e.g. --set train.max_steps=100 (repeatable)",
    )
    _add_verbose_flag(parser)


def _add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show Ray's and Ray Data's log lines on the console too (default: in a file whose "
        "path is printed; also ALBERT_DIST_VERBOSE=1)",
    )


def _config_command(job: Job) -> Callable[[argparse.Namespace], int]:
    """A handler that loads the job's config from --config/--set and runs the job."""

    def handler(args: argparse.Namespace) -> int:
        from albert_dist.config import load_config

        cfg = load_config(job.config_class(), args.config, args.overrides)
        check_output_root(cfg)
        return job.load().main(cfg) or 0

    return handler


def check_output_root(cfg) -> None:
    """Refuse a relative output directory inside a Ray job unless $ALBERT_DIST_HOME anchors it.

    A Ray job runs in a temporary copy of the working directory that is deleted with the job: a relative
    `run.output_dir` there would write where nobody finds the results, so the job stops before doing any work.
    """
    from albert_dist.storage import is_uri

    output_dir = cfg.run.output_dir
    relative = not (is_uri(output_dir) or os.path.isabs(os.path.expanduser(output_dir)))
    if relative and os.environ.get(_RAY_JOB_MARKER) and not os.environ.get("ALBERT_DIST_HOME"):
        raise ConfigError(
            f"run.output_dir={output_dir!r} is relative and $ALBERT_DIST_HOME is not set: inside a "
            "Ray job it would land in the job's temporary working directory; set ALBERT_DIST_HOME "
            "(albert-dist submit does) or an absolute run.output_dir"
        )


def _add_job_commands(commands) -> None:
    """One subcommand per registered job; a two-word command (`data prepare`) sits in its group."""
    groups = {}
    for job in JOBS.values():
        parent = commands
        if len(job.command) == 2:
            group = job.command[0]
            if group not in groups:
                groups[group] = commands.add_parser(group, help=GROUPS[group]).add_subparsers(
                    dest="action", required=True, metavar="ACTION"
                )
            parent = groups[group]
        sub = parent.add_parser(job.command[-1], help=job.help, description=job.help)
        _add_config_flags(sub)
        sub.set_defaults(handler=_config_command(job))


def _tokenizer_train(args: argparse.Namespace) -> int:
    from albert_dist.tokenizer.training import train_sentencepiece

    model = train_sentencepiece(
        args.input, args.out, args.vocab_size, character_coverage=args.character_coverage, model_type=args.model_type
    )
    print(f"tokenizer written to {model}")
    return 0


def _version() -> str:
    import albert_dist

    return albert_dist.__version__


def _add_config_commands(commands) -> None:
    from albert_dist.jobs import catalog

    config = commands.add_parser(
        "config", help="the job configs shipped in the package, and each job's config schema"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    config.add_parser("list", help="the packaged configs: NAME and what it is for").set_defaults(
        handler=lambda a: print("\n".join(f"{name:<16} {about}" for name, about in catalog.listing())) or 0
    )
    show = config.add_parser("show", help="print a packaged config (or a YAML file)")
    show.add_argument("name")
    show.set_defaults(handler=lambda a: print(catalog.show(a.name), end="") or 0)
    init = config.add_parser("init", help="copy a packaged config to PATH (a file or a directory) to edit it")
    init.add_argument("name")
    init.add_argument("path")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.set_defaults(handler=lambda a: print(f"wrote {catalog.init(a.name, a.path, a.force)}") or 0)
    schema = config.add_parser(
        "schema", help="the JSON schema of a job's config (for editors: yaml-language-server's $schema)"
    )
    schema.add_argument("job", choices=JOBS, help="the job, as `albert-dist submit` names it")
    schema.add_argument("--output", help="write it to this file (default: print it)")
    schema.set_defaults(handler=_config_schema)


def _config_schema(args: argparse.Namespace) -> int:
    from albert_dist.jobs.catalog import schema_text
    from albert_dist.storage import publish_text

    text = schema_text(args.job)
    if args.output:
        print(f"wrote {publish_text(args.output, text)}")
    else:
        print(text, end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="albert-dist", description="Pretrain, fine-tune and distill ALBERT models on Ray, tracked in MLflow."
    )
    _add_verbose_flag(parser)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_config_commands(commands)

    tok = commands.add_parser("tokenizer", help="train a SentencePiece tokenizer").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    train = tok.add_parser("train", help="train a SentencePiece unigram model with ALBERT's special tokens")
    train.add_argument("--input", nargs="+", required=True, help="corpus files")
    train.add_argument("--vocab-size", type=int, default=30000)
    train.add_argument("--out", required=True, help="output directory for spiece.model")
    train.add_argument("--character-coverage", type=float, default=0.99995, help="0.9995 for Chinese")
    train.add_argument("--model-type", choices=["unigram", "bpe"], default="unigram")
    train.set_defaults(handler=_tokenizer_train)

    _add_job_commands(commands)

    predict = commands.add_parser(
        "predict",
        help="batch inference with a fine-tuned or distilled model",
        description="Inputs under 1 MiB are predicted in this process; larger ones are streamed through Ray Data "
        "to a pool of actors (Ray started on 127.0.0.1 with a token, or $RAY_ADDRESS joined) and written in input "
        "order as they come, so no process holds the whole input.",
    )
    predict.add_argument("--model", required=True, help="model directory (transformers layout)")
    predict.add_argument(
        "--input", required=True, help="CSV, TSV, JSONL or Parquet file: a path or a URI (s3://, gs://, file://)"
    )
    predict.add_argument(
        "--output", required=True, help="output file; its extension picks the format (with --clue: a directory)"
    )
    predict.add_argument(
        "--clue",
        metavar="TASK",
        help="--input is CLUE TASK's test file (afqmc, tnews, iflytek, ocnli, cmnli, csl, wsc, cluener, cmrc2018), "
        "read in this process; its submission file, named and laid out as CLUE's leaderboard takes it, is written "
        "into the --output directory",
    )
    predict.add_argument(
        "--clue-labels",
        metavar="LABELS_JSON",
        help="with --clue tnews or iflytek: the task's labels.json, for a model trained on the label names",
    )
    predict.add_argument("--text-column", default="text")
    predict.add_argument("--text-pair-column")
    predict.add_argument("--batch-size", type=int, default=64)
    predict.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp16"],
        default="auto",
        help="auto: bf16 where the hardware computes it natively, else fp16 on a GPU, fp32 on a CPU",
    )
    predict.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto: a GPU where there is one (in this process for a small input; in the Ray cluster for a "
        "streamed one, one actor per GPU), else the CPU",
    )
    predict.add_argument(
        "--num-actors",
        type=int,
        metavar="N",
        help="actors predicting a streamed input (default: one per GPU; on CPUs, one per CPU less a quarter CPU "
        "per node for reading)",
    )
    _add_verbose_flag(predict)
    predict.add_argument(
        "--backend",
        choices=["torch", "onnx"],
        default="torch",
        help="torch: the model directory in PyTorch; onnx: an `albert-dist export` directory in onnxruntime (CPU)",
    )
    predict.set_defaults(handler=_predict)

    serve = commands.add_parser(
        "serve",
        help="a fine-tuned or distilled model behind HTTP on Ray Serve (127.0.0.1, bearer token)",
        description='POST / with {"texts": [...]} (and "text_pairs" with --pair) answers {"predictions": '
        "[...]}; every request needs Authorization: Bearer <token> (the token is $ALBERT_DIST_SERVE_TOKEN, else made "
        "for this start and written to a file whose path is printed). Ctrl-C stops. See docs/serving.md.",
    )
    serve.add_argument("--model", required=True, help="model directory (transformers layout)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 with --open)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--open", action="store_true", help="listen beyond this machine (0.0.0.0 unless --host)")
    serve.add_argument("--pair", action="store_true", help="a sentence-pair model: requests carry text_pairs")
    serve.add_argument(
        "--max-batch-size", type=int, default=64, help="texts per model call, and at most this many per request"
    )
    serve.add_argument(
        "--batch-wait-ms", type=float, default=10.0, help="how long a batch waits for more requests after its first"
    )
    serve.add_argument("--replicas", type=int, default=1, help="copies of the model, each in its own Ray actor")
    serve.add_argument("--threads", type=int, help="torch threads per replica (default: the cores / replicas)")
    serve.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto", help="as predict's")
    serve.set_defaults(handler=_serve)

    export = commands.add_parser(
        "export",
        help="a trained model as ONNX (fp32, int8, fp16), checked against PyTorch",
        description="Writes model.onnx, config.json, the tokenizer files and export.json (the check against PyTorch, "
        "sizes, dev metrics) to --output, published whole once the check passes. See docs/export.md.",
    )
    export.add_argument("--model", required=True, help="model directory (transformers layout)")
    export.add_argument("--format", choices=["onnx"], default="onnx")
    export.add_argument(
        "--quantize",
        choices=["none", "int8", "fp16"],
        default="none",
        help="int8: dynamic quantization for CPUs (onnxruntime); fp16: half precision, for GPUs",
    )
    export.add_argument("--output", required=True, help="directory to write (replaced whole if an earlier export)")
    export.add_argument("--opset", type=int, default=23, help="ONNX opset, 18 or newer (default 23)")
    export.add_argument("--dev", help="labelled file: the export's dev metrics beside PyTorch fp32's (classifiers)")
    export.add_argument("--text-column", default="text")
    export.add_argument("--text-pair-column")
    export.add_argument("--label-column", default="label")
    export.add_argument(
        "--tracking-uri",
        help="MLflow store of the model's run, where --dev's metrics are logged (default $MLFLOW_TRACKING_URI, else "
        "the run's own SQLite file)",
    )
    export.set_defaults(handler=_export)

    push = commands.add_parser(
        "push",
        help="upload a model directory or an export to the Hugging Face Hub",
        description="Uploads every file of --model (its model card's snippets naming --repo) in one commit, creating "
        "the repo if needed. The token: $HF_TOKEN, else huggingface_hub's login; $HF_ENDPOINT names another Hub. "
        "See docs/hub.md.",
    )
    push.add_argument("--model", required=True, help="a model directory a job published, or an export")
    push.add_argument("--repo", required=True, help="the Hub repo id, org/name")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument("--dry-run", action="store_true", help="print what would be uploaded; contact no Hub")
    push.set_defaults(handler=_push)

    from albert_dist.cluster import submit as jobs_client

    address_help = "Ray dashboard URL, e.g. http://127.0.0.1:8265 (default $RAY_ADDRESS)"
    submit = commands.add_parser("submit", help="run a job's command on a Ray cluster")
    submit.add_argument("job", choices=JOBS)
    _add_config_flags(submit)
    submit.add_argument("--address", help=address_help)
    submit.add_argument("--name", help="submission id (default: generated by Ray)")
    submit.add_argument(
        "--output-root",
        help="absolute output directory on the cluster, shared by all nodes "
        f"(default $ALBERT_DIST_HOME, else {jobs_client.DEFAULT_OUTPUT_ROOT})",
    )
    submit.add_argument(
        "--follow", action="store_true", help="stream the logs; exit status 0 SUCCEEDED, 1 FAILED, 2 STOPPED"
    )
    submit.set_defaults(
        handler=lambda a: jobs_client.submit(
            a.job, JOBS[a.job].command, a.config, a.overrides, a.address, a.name, a.output_root, a.follow
        )
    )

    jobs = commands.add_parser("jobs", help="list, inspect and stop jobs on a Ray cluster").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    for action, help_text, handler in [
        ("list", "all jobs with their status", lambda a: jobs_client.list_jobs(a.address)),
        ("status", "one job's status (exit status as submit --follow)", lambda a: jobs_client.status(a.address, a.id)),
        ("stop", "stop a running job", lambda a: jobs_client.stop(a.address, a.id)),
        ("logs", "a job's logs", lambda a: jobs_client.logs(a.address, a.id, a.follow)),
    ]:
        sub = jobs.add_parser(action, help=help_text)
        sub.add_argument("--address", help=address_help)
        if action != "list":
            sub.add_argument("id", help="submission id")
        if action == "logs":
            sub.add_argument("--follow", action="store_true")
        sub.set_defaults(handler=handler)

    from albert_dist.cluster import preemption

    preemption.add_parser(commands)
    return parser


def _predict(args: argparse.Namespace) -> int:
    from albert_dist.finetune.predict import run_predict

    if args.clue_labels and not args.clue:
        raise ConfigError("--clue-labels goes with --clue tnews or --clue iflytek")
    inference = {
        "batch_size": args.batch_size,
        "precision": args.precision,
        "device": args.device,
        "backend": args.backend,
    }
    if args.clue:
        from albert_dist.finetune.clue_submit import write_submission

        write_submission(args.model, args.clue, args.input, args.output, labels_path=args.clue_labels, **inference)
        return 0
    rows = run_predict(
        args.model,
        args.input,
        args.output,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        num_actors=args.num_actors,
        **inference,
    )
    print(f"wrote {rows} predictions to {args.output}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from albert_dist.serve.server import ServeOptions, run_serve

    return run_serve(
        ServeOptions(
            model_dir=args.model,
            host=args.host,
            port=args.port,
            open=args.open,
            max_batch_size=args.max_batch_size,
            batch_wait_ms=args.batch_wait_ms,
            replicas=args.replicas,
            threads=args.threads,
            pair=args.pair,
            precision=args.precision,
        )
    )


def _export(args: argparse.Namespace) -> int:
    from albert_dist.export.dev_metrics import DevSet
    from albert_dist.export.run import run_export

    dev = DevSet(args.dev, args.text_column, args.text_pair_column, args.label_column) if args.dev else None
    run_export(
        args.model,
        args.output,
        fmt=args.format,
        quantize=args.quantize,
        opset=args.opset,
        dev=dev,
        tracking_uri=args.tracking_uri,
    )
    return 0


def _push(args: argparse.Namespace) -> int:
    from albert_dist.hub.push import plan_push, push

    plan = plan_push(args.model, args.repo, private=args.private)
    print("\n".join(plan.lines()))
    if args.dry_run:
        print("dry run: nothing uploaded")
    else:
        print(f"pushed: {push(plan)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from albert_dist.console import quiet_mlflow, set_verbose

    args = build_parser().parse_args(argv)
    if getattr(args, "verbose", False):
        set_verbose()
    quiet_mlflow()
    try:
        return args.handler(args)
    except (AlbertDistError, OSError) as err:
        error = user_error(err)
        if error is None:
            raise
        print(f"albert-dist: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("albert-dist: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
