"""`AlbertTokenizer`: one interface over both backends, what data preparation, fine-tuning and prediction encode with,
saved in transformers' layout."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from albert_dist.errors import TokenizerError
from albert_dist.hub.download import local_dir
from albert_dist.storage import publish_bytes
from albert_dist.tokenizer.backends import (
    SPECIAL_ROLES,
    SPIECE_FILE,
    SPIECE_UNDERLINE,
    WORDPIECE_FILE,
    SentencePieceBackend,
    WordPieceBackend,
    is_cjk,
)

MODEL_MAX_LENGTH = 512


class AlbertTokenizer:
    """ALBERT tokenizer over a `spiece.model` or a WordPiece `vocab.txt` (a directory holding one, the file, or a
    Hugging Face Hub model id).

    Text containing literal special tokens such as "[MASK]" is tokenized as plain text. `special_ids` holds the
    pad, [CLS], [SEP] and [MASK] ids, not unk (which stands for real text).
    """

    def __init__(self, path: str | os.PathLike):
        file = _resolve_tokenizer_file(local_dir(path))
        if file.name.endswith(".model"):
            self._backend = SentencePieceBackend.from_file(file)
        else:
            self._backend = WordPieceBackend.from_file(file)
        ids = {role: self._backend.token_to_id(tok) for role, tok in self._backend.special_tokens.items()}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (ids[r] for r in SPECIAL_ROLES)
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

    def save_fast(self, out_dir: str | os.PathLike) -> None:
        """Write `tokenizer.json`, the whole pipeline transformers' AutoTokenizer loads as the fast tokenizer (the
        WordPiece backend's; a SentencePiece one writes none)."""
        self._backend.save_fast(Path(out_dir))


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


def languages(tokenizer: AlbertTokenizer) -> list[str]:
    """The model card's language: ["zh"] for a vocabulary of which a fifth or more are CJK characters (a Chinese
    BERT vocab.txt is mostly those; an English one has next to none), else ["en"]."""
    tokens = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
    pieces = (token.removeprefix("##").lstrip(SPIECE_UNDERLINE) for token in tokens)
    cjk = sum(1 for piece in pieces if piece and all(is_cjk(ord(c)) for c in piece))
    return ["zh"] if cjk * 5 >= len(tokens) else ["en"]


def load_tokenizer(path: str | os.PathLike) -> AlbertTokenizer:
    """The tokenizer in `path`: a directory with `spiece.model` (preferred) or `vocab.txt`, either file, or a hub
    model id."""
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
