"""`albert-dist`: the command line. Each subcommand parses its flags and hands a validated config to the library.

Errors caused by the user's input (`AlbertDistError`) are printed as one line and exit with status 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from albert_dist.errors import AlbertDistError


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML job config (embedded defaults when omitted)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one config field, e.g. --set train.max_steps=100 (repeatable)")


def _config_command(config_class_path: str, runner_path: str) -> Callable[[argparse.Namespace], int]:
    """A handler that loads `config_class_path` from --config/--set and passes it to `runner_path`."""

    def handler(args: argparse.Namespace) -> int:
        from albert_dist.config import load_config

        config_class = _import(config_class_path)
        cfg = load_config(config_class, args.config, args.overrides)
        return _import(runner_path)(cfg) or 0

    return handler


def _import(path: str):
    import importlib

    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _tokenizer_train(args: argparse.Namespace) -> int:
    from albert_dist.tokenizer import train_sentencepiece

    model = train_sentencepiece(args.input, args.out, args.vocab_size, character_coverage=args.character_coverage,
                                model_type=args.model_type)
    print(f"tokenizer written to {model}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="albert-dist", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tok = commands.add_parser("tokenizer", help="train a SentencePiece tokenizer").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    train = tok.add_parser("train", help="train a SentencePiece unigram model with ALBERT's special tokens")
    train.add_argument("--input", nargs="+", required=True, help="corpus files")
    train.add_argument("--vocab-size", type=int, default=30000)
    train.add_argument("--out", required=True, help="output directory for spiece.model")
    train.add_argument("--character-coverage", type=float, default=0.99995, help="0.9995 for Chinese")
    train.add_argument("--model-type", choices=["unigram", "bpe"], default="unigram")
    train.set_defaults(handler=_tokenizer_train)

    data = commands.add_parser("data", help="prepare a corpus for pretraining").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    prepare = data.add_parser("prepare", help="read, split, tokenize and write SOP instances as Parquet shards")
    _add_config_flags(prepare)
    prepare.set_defaults(handler=_config_command("albert_dist.config:DataJobConfig",
                                                 "albert_dist.data.prepare:run_prepare"))

    for name, config_class, runner, help_text in _JOB_COMMANDS:
        job = commands.add_parser(name, help=help_text)
        _add_config_flags(job)
        job.set_defaults(handler=_config_command(config_class, runner))
    return parser


# (subcommand, config class, runner, help) for jobs that take only --config/--set.
_JOB_COMMANDS = [
    ("pretrain", "albert_dist.config:PretrainJobConfig", "albert_dist.pretrain:run_pretrain",
     "pretrain ALBERT (MLM + SOP) on Ray Train"),
    ("demo", "albert_dist.demo:DemoJobConfig", "albert_dist.demo:run_demo",
     "the whole pipeline on a small corpus of Python docstrings, end to end"),
]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except AlbertDistError as err:
        print(f"albert-dist: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("albert-dist: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
