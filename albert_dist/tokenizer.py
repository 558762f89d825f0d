"""ALBERT tokenizers behind one interface.

Two backends:

* SentencePiece (`spiece.model`, English ALBERT): the text is preprocessed in Python exactly like google's
  `tokenization.py` / transformers' slow `AlbertTokenizer` (whitespace collapse, quote normalisation, NFKD accent
  stripping, lowercasing), then encoded by sentencepiece, then pieces like `▁1,` are re-split (the digit-comma quirk).
* WordPiece (`vocab.txt`, Chinese ALBERTs): the `tokenizers` library's BERT pipeline, built exactly as
  transformers builds `BertTokenizer` from a vocab.txt (BertNormalizer: clean control characters, one token per CJK
  character, lowercase and strip accents; no NFKC, so full-width ，！（５ stay themselves as in bert-base-chinese;
  BertPreTokenizer; greedy longest-match-first WordPiece). The same pipeline trains the vocabulary.

This normalization is the only one: data preparation, fine-tuning, prediction and the exported tokenizer in
transformers all feed raw text to it.

`train_sentencepiece` trains a unigram model with ALBERT's id layout (pad=0, unk=1, [CLS]=2, [SEP]=3, [MASK]=4).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from albert_dist.errors import TokenizerError
from albert_dist.storage import publish_bytes, publish_file
from albert_dist.text_encoding import refuse_other_encoding, undecodable_chars

SPIECE_FILE = "spiece.model"
SPIECE_VOCAB_FILE = "spiece.vocab"
WORDPIECE_FILE = "vocab.txt"
SPIECE_UNDERLINE = "\u2581"
# google-research/albert README: `spm_train ... --pad_id=0 --unk_id=1 --eos_id=-1 --bos_id=-1
# --control_symbols=[CLS],[SEP],[MASK] --user_defined_symbols="(,),\",-,.,–,£,€"`; albert-base-v2 has this layout.
ALBERT_CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")
ALBERT_USER_SYMBOLS = ("(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac")
MODEL_MAX_LENGTH = 512
_PROGRESS_EVERY_BYTES = 64 << 20
_WORDPIECE_MAX_CHARS = 100  # BERT: longer words become [UNK]
_SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")


# --------------------------------------------------------------------------------------------------------------
# ALBERT text preprocessing (shared by training and encoding so both see the same text)
# --------------------------------------------------------------------------------------------------------------


def albert_preprocess(text: str) -> str:
    """google's `preprocess_text` with ALBERT's flags: remove_space, keep_accents=False, do_lower_case."""
    text = " ".join(text.strip().split())
    text = text.replace("``", '"').replace("''", '"')
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    return text.lower()


# --------------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------------


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
    first, each CJK character of the sample one token, WordPiece pieces (`##` continuations) for Latin words and
    numbers. The `tokenizers` library's WordPiece trainer runs behind BERT's normaliser and pre-tokenizer, which
    isolate every CJK character; its `##字` entries are dropped (a CJK character is always a word of its own, so
    they could never be produced) and their room given to Latin pieces. Lines are sampled as for SentencePiece."""
    from tokenizers import models, trainers

    if input_sentence_size < 1:
        raise TokenizerError(f"input_sentence_size must be at least 1, not {input_sentence_size}")
    paths = _input_paths(inputs)
    lines = _sample_lines(paths, input_sentence_size, random.Random(seed), progress, str.strip, "wordpiece")
    if not lines:
        raise TokenizerError(f"empty corpus: no non-blank lines in {', '.join(map(str, paths))}")
    cjk = {c for line in lines for c in line if _is_cjk(ord(c))}
    model = _bert_pipeline(
        models.WordPiece(unk_token=_WordPieceBackend._SPECIAL["unk"], max_input_chars_per_word=_WORDPIECE_MAX_CHARS)
    )
    specials = [_WordPieceBackend._SPECIAL[role] for role in _SPECIAL_ROLES]
    model.train_from_iterator(
        lines, trainers.WordPieceTrainer(vocab_size=vocab_size + len(cjk), special_tokens=specials, show_progress=False)
    )
    ordered = sorted(model.get_vocab().items(), key=lambda item: item[1])
    tokens = [t for t, _ in ordered if not (t.startswith("##") and len(t) == 3 and _is_cjk(ord(t[2])))]
    tokens = tokens[: max(vocab_size, len(specials) + len(cjk))]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _WordPieceBackend(tokens, str(out_dir)).save_files(out_dir)
    progress(f"wordpiece: trained {len(tokens)} tokens, {len(cjk)} CJK characters")  # the caller says where
    return out_dir / WORDPIECE_FILE


# --------------------------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------------------------


class _SentencePieceBackend:
    """spiece.model with ALBERT's Python preprocessing; picklable through its serialized model proto."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, source: str):
        self._proto = model_proto
        self._source = source
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.special_tokens = self._find_special_tokens()

    @classmethod
    def from_file(cls, path: Path) -> _SentencePieceBackend:
        try:
            return cls(path.read_bytes(), str(path))
        except RuntimeError as e:  # sentencepiece's parse error
            raise TokenizerError(f"{path} is not a valid SentencePiece model: {e}") from e

    def __getstate__(self) -> dict:
        return {"model_proto": self._proto, "source": self._source}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_proto"], state["source"])

    def _find_special_tokens(self) -> dict[str, str]:
        sp = self._sp
        tokens = {
            "unk": sp.id_to_piece(sp.unk_id()),
            "pad": sp.id_to_piece(sp.pad_id()) if sp.pad_id() >= 0 else "<pad>",
            "cls": "[CLS]",
            "sep": "[SEP]",
            "mask": "[MASK]",
        }
        missing = [t for role, t in tokens.items() if role != "unk" and sp.piece_to_id(t) == sp.unk_id()]
        if missing:
            raise TokenizerError(f"{self._source} lacks ALBERT's special pieces {missing}")
        return tokens

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def tokenize(self, text: str) -> list[str]:
        return self.encode_batch([text])[0][0]

    def encode_batch(self, texts: list[str]) -> list[tuple[list[str], list[int]]]:
        # One thread: Ray gives the other cores to other workers.
        texts = [albert_preprocess(text) for text in texts]
        batch = self._sp.encode(texts, out_type=str, num_threads=1)
        out = []
        for text, pieces in zip(texts, batch):
            if _has_digit_comma(text):
                pieces = self._split_digit_commas(pieces)
            out.append((pieces, self._sp.piece_to_id(pieces)))
        return out

    def _split_digit_commas(self, pieces: list[str]) -> list[str]:
        """google's quirk: a piece like `▁1,` or `9,` is re-encoded without its comma, the comma kept apart."""
        out: list[str] = []
        for piece in pieces:
            if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
                sub = self._sp.encode(piece[:-1].replace(SPIECE_UNDERLINE, ""), out_type=str)
                if piece[0] != SPIECE_UNDERLINE and sub[0][0] == SPIECE_UNDERLINE:
                    sub = sub[1:] if len(sub[0]) == 1 else [sub[0][1:], *sub[1:]]
                out.extend(sub)
                out.append(piece[-1])
            else:
                out.append(piece)
        return out

    def token_to_id(self, token: str) -> int:
        return self._sp.piece_to_id(token)

    def id_to_token(self, index: int) -> str:
        return self._sp.id_to_piece(index)

    def detokenize(self, tokens: list[str]) -> str:
        return self._sp.decode_pieces(tokens)

    @staticmethod
    def is_word_start(token: str) -> bool:
        return token.startswith(SPIECE_UNDERLINE)

    def save_files(self, out_dir: Path) -> None:
        publish_bytes(out_dir / SPIECE_FILE, self._proto)

    def tokenizer_config(self) -> dict:
        return {
            "tokenizer_class": "AlbertTokenizer",
            "do_lower_case": True,
            "remove_space": True,
            "keep_accents": False,
            "bos_token": "[CLS]",
            "eos_token": "[SEP]",
        }


def _has_digit_comma(text: str) -> bool:
    """Whether `text` has a comma after a digit (as `str.isdigit` says), where the re-split can apply."""
    comma = text.find(",", 1)
    while comma > 0:
        if text[comma - 1].isdigit():
            return True
        comma = text.find(",", comma + 1)
    return False


class _WordPieceBackend:
    """BERT's vocab.txt tokenizer, run by `tokenizers` (see the module docstring); picklable through its tokens."""

    kind = "wordpiece"
    _SPECIAL = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}

    def __init__(self, tokens: list[str], source: str):
        from tokenizers import models

        self._tokens = tokens
        self._source = source
        self._ids = {t: i for i, t in enumerate(tokens)}  # a duplicate keeps its last id, as BERT's load_vocab
        missing = [t for t in self._SPECIAL.values() if t not in self._ids]
        if missing:
            raise TokenizerError(f"{source} lacks the special tokens {missing}")
        self.special_tokens = dict(self._SPECIAL)
        self._unk = self._SPECIAL["unk"]
        self._tokenizer = _bert_pipeline(
            models.WordPiece(self._ids, unk_token=self._unk, max_input_chars_per_word=_WORDPIECE_MAX_CHARS)
        )

    @classmethod
    def from_file(cls, path: Path) -> _WordPieceBackend:
        lines = path.read_text(encoding="utf-8").split("\n")  # universal newlines, as BERT's load_vocab
        if lines[-1] == "":
            lines.pop()
        return cls(lines, str(path))

    def __getstate__(self) -> dict:
        return {"tokens": self._tokens, "source": self._source}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["tokens"], state["source"])

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def tokenize(self, text: str) -> list[str]:
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def encode_batch(self, texts: list[str]) -> list[tuple[list[str], list[int]]]:
        # One text at a time: encode_batch would spread over every core, which Ray has given to other workers.
        encodings = (self._tokenizer.encode(text, add_special_tokens=False) for text in texts)
        return [(e.tokens, e.ids) for e in encodings]

    def token_to_id(self, token: str) -> int:
        return self._ids.get(token, self._ids[self._unk])

    def id_to_token(self, index: int) -> str:
        return self._tokens[index]

    @staticmethod
    def detokenize(tokens: list[str]) -> str:
        return " ".join(tokens).replace(" ##", "").strip()

    @staticmethod
    def is_word_start(token: str) -> bool:
        return not token.startswith("##")

    def save_files(self, out_dir: Path) -> None:
        publish_bytes(out_dir / WORDPIECE_FILE, "".join(t + "\n" for t in self._tokens).encode("utf-8"))

    @staticmethod
    def tokenizer_config() -> dict:
        return {"tokenizer_class": "BertTokenizer", **_BERT_OPTIONS}


# What transformers' BertTokenizer reads from tokenizer_config.json and builds its BertNormalizer from: the
# pipeline below uses the same values, so the export tokenizes as this module does.
_BERT_OPTIONS = {"do_lower_case": True, "tokenize_chinese_chars": True, "strip_accents": None}


def _bert_pipeline(model):
    """A `tokenizers.Tokenizer` around the WordPiece `model` with BERT's normalizer and pre-tokenizer, configured
    as transformers' BertTokenizer does from `_BERT_OPTIONS`."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers

    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=_BERT_OPTIONS["tokenize_chinese_chars"],
        strip_accents=_BERT_OPTIONS["strip_accents"],
        lowercase=_BERT_OPTIONS["do_lower_case"],
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


def _is_cjk(cp: int) -> bool:
    """BERT's CJK ranges: the characters its normalizer makes words of their own."""
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


# --------------------------------------------------------------------------------------------------------------
# Public tokenizer
# --------------------------------------------------------------------------------------------------------------


class AlbertTokenizer:
    """ALBERT tokenizer over a `spiece.model` or a WordPiece `vocab.txt` (a directory holding one, or the file).

    Text containing literal special tokens such as "[MASK]" is tokenized as plain text. `special_ids` holds the
    pad, [CLS], [SEP] and [MASK] ids, not unk (which stands for real text).
    """

    def __init__(self, path: str | os.PathLike):
        file = _resolve_tokenizer_file(Path(path))
        if file.name.endswith(".model"):
            self._backend = _SentencePieceBackend.from_file(file)
        else:
            self._backend = _WordPieceBackend.from_file(file)
        ids = {role: self._backend.token_to_id(tok) for role, tok in self._backend.special_tokens.items()}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (ids[r] for r in _SPECIAL_ROLES)
        self.special_ids = frozenset(ids[r] for r in ("pad", "cls", "sep", "mask"))

    @property
    def kind(self) -> str:
        """'sentencepiece' or 'wordpiece'."""
        return self._backend.kind

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    def tokenize(self, text: str) -> list[str]:
        return self._backend.tokenize(text)

    def encode(self, text: str) -> list[int]:
        """Token ids without special tokens."""
        return self._backend.encode_batch([text])[0][1]

    def tokenize_batch(self, texts: Sequence[str]) -> list[tuple[list[str], list[int]]]:
        """Each text's tokens and their ids (no special tokens), through the backend's native encoder."""
        return self._backend.encode_batch(list(texts))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        ids = [i for i in ids if not (skip_special_tokens and i in self.special_ids)]
        return self._backend.detokenize(self.convert_ids_to_tokens(ids))

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self._backend.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._backend.id_to_token(int(i)) for i in ids]

    def word_starts(self, ids: Iterable[int]) -> list[bool]:
        """True where a token begins a whole word (special tokens count as words); for whole-word masking."""
        return [i in self.special_ids or self._backend.is_word_start(self._backend.id_to_token(int(i))) for i in ids]

    # ---- model inputs ----

    def build_inputs(self, ids_a: Sequence[int], ids_b: Sequence[int] | None = None) -> dict[str, list[int]]:
        """`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` with token types 0 for the first part, 1 for B and its SEP."""
        input_ids = [self.cls_id, *ids_a, self.sep_id]
        token_type_ids = [0] * len(input_ids)
        if ids_b is not None:
            input_ids += [*ids_b, self.sep_id]
            token_type_ids += [1] * (len(ids_b) + 1)
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": [1] * len(input_ids)}

    def encode_pair(
        self, text_a: str, text_b: str | None = None, max_length: int | None = None, truncation: bool = True
    ) -> dict[str, list[int]]:
        return self.encode_pairs([text_a], None if text_b is None else [text_b], max_length, truncation)[0]

    def encode_pairs(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        max_length: int | None = None,
        truncation: bool = True,
    ) -> list[dict[str, list[int]]]:
        """`encode_pair` of each text (and its pair), the texts encoded in one batch."""
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text pairs")
        ids_a = [ids for _, ids in self.tokenize_batch(texts)]
        ids_b = [ids for _, ids in self.tokenize_batch(text_pairs)] if text_pairs is not None else [None] * len(texts)
        return [self._pair_inputs(a, b, max_length, truncation) for a, b in zip(ids_a, ids_b)]

    def _pair_inputs(
        self, ids_a: list[int], ids_b: list[int] | None, max_length: int | None, truncation: bool
    ) -> dict[str, list[int]]:
        if max_length is not None and truncation:
            budget = max_length - (2 if ids_b is None else 3)
            if budget < 0:
                raise ValueError(f"max_length={max_length} cannot hold the special tokens")
            ids_a, ids_b = truncate_longest_first(ids_a, ids_b, budget)
        return self.build_inputs(ids_a, ids_b)

    def batch_encode(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        max_length: int | None = MODEL_MAX_LENGTH,
        padding: str = "longest",
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
    ) -> dict:
        """Encode, truncate to `max_length`, right-pad with `pad_id`; lists, or torch tensors for "pt"."""
        if padding not in ("longest", "max_length"):
            raise ValueError(f"padding must be 'longest' or 'max_length', not {padding!r}")
        if padding == "max_length" and max_length is None:
            raise ValueError("padding='max_length' needs max_length")
        rows = self.encode_pairs(texts, text_pairs, max_length)
        width = max_length if padding == "max_length" else max((len(r["input_ids"]) for r in rows), default=0)
        if pad_to_multiple_of:
            width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
        pad_values = {"input_ids": self.pad_id, "token_type_ids": 0, "attention_mask": 0}
        batch = {key: [r[key] + [value] * (width - len(r[key])) for r in rows] for key, value in pad_values.items()}
        if return_tensors == "pt":
            import torch

            return {key: torch.tensor(value, dtype=torch.long) for key, value in batch.items()}
        if return_tensors is not None:
            raise ValueError(f"return_tensors must be None or 'pt', not {return_tensors!r}")
        return batch

    # ---- persistence ----

    def save(self, out_dir: str | os.PathLike) -> Path:
        """Write the vocabulary file and the json configs `transformers.AutoTokenizer` reads."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self._backend.save_files(out_dir)
        specials = {f"{role}_token": tok for role, tok in self._backend.special_tokens.items()}
        # As albert-base-v2 ships it: [MASK] swallows the space before it.
        specials["mask_token"] = {
            "content": specials["mask_token"],
            "lstrip": self.kind == "sentencepiece",
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        config = {**self._backend.tokenizer_config(), **specials, "model_max_length": MODEL_MAX_LENGTH}
        publish_bytes(out_dir / "tokenizer_config.json", _json_bytes(config))
        publish_bytes(out_dir / "special_tokens_map.json", _json_bytes(specials))
        return out_dir


def truncate_longest_first(
    ids_a: list[int], ids_b: list[int] | None, budget: int
) -> tuple[list[int], list[int] | None]:
    """transformers' (tokenizers') 'longest_first': keep the shorter sequence whole if it fits in half the budget,
    else give it `budget // 2` and the longer one the rest (on equal lengths A counts as the shorter)."""
    if ids_b is None:
        return ids_a[:budget], None
    if len(ids_a) + len(ids_b) <= budget:
        return ids_a, ids_b
    shorter = min(len(ids_a), len(ids_b))
    keep_shorter = shorter if 2 * shorter <= budget else budget // 2
    keep_a, keep_b = (keep_shorter, budget - keep_shorter)
    if len(ids_a) > len(ids_b):
        keep_a, keep_b = keep_b, keep_a
    return ids_a[:keep_a], ids_b[:keep_b]


def load_tokenizer(path: str | os.PathLike) -> AlbertTokenizer:
    """The tokenizer in `path`: a directory with `spiece.model` (preferred) or `vocab.txt`, or either file."""
    return AlbertTokenizer(path)


def _resolve_tokenizer_file(path: Path) -> Path:
    if path.is_file():
        return path
    if path.is_dir():
        for name in (SPIECE_FILE, WORDPIECE_FILE):
            if (path / name).is_file():
                return path / name
        raise TokenizerError(f"no tokenizer in {path}: expected {SPIECE_FILE} or {WORDPIECE_FILE}")
    raise TokenizerError(f"tokenizer path not found: {path}")


def _json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
