"""Training a tokenizer on a corpus: SentencePiece with ALBERT's id layout (pad=0, unk=1, [CLS]=2, [SEP]=3, [MASK]=4),
or a WordPiece vocab.txt through the same BERT pipeline that reads it."""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from albert_dist.errors import TokenizerError
from albert_dist.storage import publish_file
from albert_dist.text_encoding import refuse_other_encoding, undecodable_chars
from albert_dist.tokenizer.backends import (
    ALBERT_CONTROL_SYMBOLS,
    ALBERT_USER_SYMBOLS,
    SPECIAL_ROLES,
    SPIECE_FILE,
    SPIECE_VOCAB_FILE,
    WORDPIECE_FILE,
    WORDPIECE_MAX_CHARS,
    WordPieceBackend,
    albert_preprocess,
    bert_pipeline,
    is_cjk,
)

_PROGRESS_EVERY_BYTES = 64 << 20


def train_sentencepiece(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    vocab_size: int,
    *,
    character_coverage: float = 0.99995,
    model_type: str = "unigram",
    input_sentence_size: int = 10_000_000,
    seed: int = 0,
    progress: Callable[[str], None] = print,
) -> Path:
    """Train `spiece.model` (+ `spiece.vocab`) in `out_dir` with ALBERT's settings; returns the model path.

    Lines are ALBERT-preprocessed, blank lines (document separators) dropped, and at most `input_sentence_size`
    of them kept by seeded reservoir sampling, then shuffled with the same seed.
    """
    if input_sentence_size < 1:
        raise TokenizerError(f"input_sentence_size must be at least 1, not {input_sentence_size}")
    paths = _input_paths(inputs)
    lines = _sample_lines(paths, input_sentence_size, random.Random(seed), progress)
    if not lines:
        raise TokenizerError(f"empty corpus: no non-blank lines in {', '.join(map(str, paths))}")
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="albert-spiece-") as tmp:
        prefix = Path(tmp) / "spiece"
        _run_trainer(
            lines,
            prefix,
            vocab_size,
            character_coverage=character_coverage,
            model_type=model_type,
            seed=seed,
            paths=paths,
        )
        # The model last: its presence means the pair is complete.
        for suffix, name in ((".vocab", SPIECE_VOCAB_FILE), (".model", SPIECE_FILE)):
            publish_file(
                out_dir / name,
                lambda tmp, suffix=suffix: shutil.copyfile(prefix.with_suffix(suffix), tmp),
                error=TokenizerError,
            )
    progress(f"sentencepiece: trained {vocab_size} pieces")  # where it goes is the caller's to say (a staging copy)
    return out_dir / SPIECE_FILE


def _input_paths(inputs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    paths = [Path(inputs)] if isinstance(inputs, (str, os.PathLike)) else [Path(p) for p in inputs]
    if not paths:
        raise TokenizerError("no input files given for sentencepiece training")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise TokenizerError(f"tokenizer training input not found: {', '.join(missing)}")
    return paths


def _read_lines(
    paths: Sequence[Path], progress: Callable[[str], None], preprocess: Callable[[str], str], label: str
) -> Iterator[str]:
    """Preprocessed non-blank lines of every file, reporting progress every 64 MiB."""
    nbytes = nlines = 0
    next_report = _PROGRESS_EVERY_BYTES
    for path in paths:
        chars = foreign = 0
        with open(path, "rb") as f:
            for raw in f:
                nbytes += len(raw)
                nlines += 1
                if nbytes >= next_report:
                    progress(f"{label}: read {nbytes / 2**20:,.0f} MiB, {nlines:,} lines (now {path})")
                    next_report += _PROGRESS_EVERY_BYTES
                text = raw.decode("utf-8", errors="replace")
                chars += len(text)
                foreign += undecodable_chars(text, raw)
                line = preprocess(text)
                if line:
                    yield line
            f.seek(0)
            refuse_other_encoding(str(path), chars, foreign, f.read(1 << 16), TokenizerError)


def _sample_lines(
    paths: Sequence[Path],
    limit: int,
    rng: random.Random,
    progress: Callable[[str], None],
    preprocess: Callable[[str], str] = albert_preprocess,
    label: str = "sentencepiece",
) -> list[str]:
    """Reservoir-sample at most `limit` lines (memory bounded by the sample), then shuffle."""
    sample: list[str] = []
    seen = 0
    for seen, line in enumerate(_read_lines(paths, progress, preprocess, label), start=1):
        if len(sample) < limit:
            sample.append(line)
        else:
            j = rng.randrange(seen)
            if j < limit:
                sample[j] = line
    rng.shuffle(sample)
    progress(f"{label}: training on {len(sample):,} of {seen:,} lines from {len(paths)} file(s)")
    return sample


def _run_trainer(
    lines: list[str],
    prefix: Path,
    vocab_size: int,
    *,
    character_coverage: float,
    model_type: str,
    seed: int,
    paths: Sequence[Path],
) -> None:
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_prefix=str(prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=0,
            unk_id=1,
            bos_id=-1,
            eos_id=-1,
            control_symbols=list(ALBERT_CONTROL_SYMBOLS),
            user_defined_symbols=list(ALBERT_USER_SYMBOLS),
            input_sentence_size=0,  # already sampled
            shuffle_input_sentence=False,
            max_sentence_length=1 << 16,  # document-per-line corpora would otherwise be silently skipped
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as e:
        limit = re.search(r"Vocabulary size.*value <= (\d+)", str(e))
        if limit:
            raise TokenizerError(
                f"vocab_size={vocab_size} is too large for the corpus "
                f"({', '.join(map(str, paths))}): at most {limit[1]} pieces fit"
            ) from e
        raise TokenizerError(f"sentencepiece training on {', '.join(map(str, paths))} failed: {e}") from e


# Characters every trained vocabulary spells whatever its corpus writes: ASCII letters, digits and punctuation, their
# full-width forms (U+FF01-U+FF5E) and the punctuation of Chinese text. A corpus that writes digits and Latin letters
# in one width only (People's Daily: full-width) would otherwise turn the other width, and so most web text, to [UNK].
_BASE_CHARACTERS = (
    "".join(map(chr, range(0x21, 0x7F)))
    + "".join(map(chr, range(0xFF01, 0xFF5F)))
    + "、。〃〈〉《》「」『』【】〔〕〖〗〜〝〞…—–‘’“”·￥"
)


def _base_alphabet(pipeline) -> list[str]:
    """`_BASE_CHARACTERS` as the BERT `pipeline`'s normalizer leaves them (lowercased), then the `##` form of each
    its pre-tokenizer keeps inside a word (letters, digits, and symbols BERT does not count as punctuation, such as
    ＋ and ～), so that any word or number of them can be spelled piece by piece."""
    chars = dict.fromkeys(pipeline.normalizer.normalize_str(c) for c in _BASE_CHARACTERS)
    continuing = [c for c in chars if len(pipeline.pre_tokenizer.pre_tokenize_str("a" + c)) == 1]
    return [*chars, *("##" + c for c in continuing)]


def train_wordpiece(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    vocab_size: int,
    *,
    input_sentence_size: int = 10_000_000,
    seed: int = 0,
    progress: Callable[[str], None] = print,
) -> Path:
    """Train a BERT-Chinese style `vocab.txt` in `out_dir`, laid out as albert_zh's: [PAD] [UNK] [CLS] [SEP] [MASK]
    first, then the base alphabet (`_base_alphabet`: both widths of ASCII letters, digits and punctuation, Chinese
    punctuation, `##` forms of letters and digits), each CJK character of the sample one token, then WordPiece
    pieces (`##` continuations) for Latin words. The `tokenizers` library's WordPiece trainer runs behind BERT's
    normaliser and pre-tokenizer, which isolate every CJK character; its `##字` entries are dropped (a CJK
    character is always a word of its own, so they could never be produced) and their room given to Latin pieces.
    While training only, every digit is a word of its own, so no number is learned whole: encoding spells numbers
    with digit pieces (`2`, `##0`, ...). The special tokens, the base alphabet and the CJK characters take priority
    over `vocab_size`: the learned pieces fill the room left, and a `vocab_size` smaller than those gives a larger
    vocabulary of just them. Lines are sampled as for SentencePiece."""
    from tokenizers import models, pre_tokenizers, trainers

    if input_sentence_size < 1:
        raise TokenizerError(f"input_sentence_size must be at least 1, not {input_sentence_size}")
    paths = _input_paths(inputs)
    lines = _sample_lines(paths, input_sentence_size, random.Random(seed), progress, str.strip, "wordpiece")
    if not lines:
        raise TokenizerError(f"empty corpus: no non-blank lines in {', '.join(map(str, paths))}")
    cjk_seen = {c for line in lines for c in line if is_cjk(ord(c))}
    model = bert_pipeline(
        models.WordPiece(unk_token=WordPieceBackend._SPECIAL["unk"], max_input_chars_per_word=WORDPIECE_MAX_CHARS)
    )
    specials = [WordPieceBackend._SPECIAL[role] for role in SPECIAL_ROLES]
    base = _base_alphabet(model)
    model.pre_tokenizer = pre_tokenizers.Sequence([model.pre_tokenizer, pre_tokenizers.Digits(individual_digits=True)])
    model.train_from_iterator(
        lines,
        trainers.WordPieceTrainer(vocab_size=vocab_size + len(cjk_seen), special_tokens=specials, show_progress=False),
    )
    ordered = [t for t, _ in sorted(model.get_vocab().items(), key=lambda item: item[1])]
    # The trainer's characters, not the raw ones: the normalizer maps CJK compatibility ideographs to unified ones.
    cjk = [t for t in ordered if len(t) == 1 and is_cjk(ord(t))]
    required = [*specials, *base, *cjk]
    placed = {*required, *("##" + c for c in cjk)}
    learned = [t for t in ordered if t not in placed]
    tokens = required + learned[: max(0, vocab_size - len(required))]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    WordPieceBackend(tokens, str(out_dir)).save_files(out_dir)
    progress(  # the caller says where
        f"wordpiece: trained {len(tokens)} tokens: {len(base)} of the base alphabet, {len(cjk)} CJK characters"
    )
    return out_dir / WORDPIECE_FILE
