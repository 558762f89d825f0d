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

import unicodedata
from pathlib import Path

import sentencepiece as spm

from albert_dist.errors import TokenizerError
from albert_dist.storage import publish_bytes

SPIECE_FILE = "spiece.model"


SPIECE_VOCAB_FILE = "spiece.vocab"


WORDPIECE_FILE = "vocab.txt"


FAST_TOKENIZER_FILE = "tokenizer.json"  # the whole pipeline, which transformers' AutoTokenizer loads as it is


SPIECE_UNDERLINE = "\u2581"


# google-research/albert README: `spm_train ... --pad_id=0 --unk_id=1 --eos_id=-1 --bos_id=-1
# --control_symbols=[CLS],[SEP],[MASK] --user_defined_symbols="(,),\",-,.,–,£,€"`; albert-base-v2 has this layout.
ALBERT_CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")


ALBERT_USER_SYMBOLS = ("(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac")


WORDPIECE_MAX_CHARS = 100  # BERT: longer words become [UNK]


SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")


def albert_preprocess(text: str) -> str:
    """google's `preprocess_text` with ALBERT's flags: remove_space, keep_accents=False, do_lower_case."""
    text = " ".join(text.strip().split())
    text = text.replace("``", '"').replace("''", '"')
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    return text.lower()


class SentencePieceBackend:
    """spiece.model with ALBERT's Python preprocessing; picklable through its serialized model proto."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, source: str):
        self._proto = model_proto
        self._source = source
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.special_tokens = self._find_special_tokens()

    @classmethod
    def from_file(cls, path: Path) -> SentencePieceBackend:
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
        self.save_fast(out_dir)

    def save_fast(self, out_dir: Path) -> None:
        tokenizer = self.fast_tokenizer()
        if tokenizer is not None:
            publish_bytes(out_dir / FAST_TOKENIZER_FILE, tokenizer.to_str(pretty=True).encode("utf-8"))

    def fast_tokenizer(self):
        """The unigram model as a whole `tokenizers.Tokenizer`, as transformers v5 builds AlbertTokenizer from
        spiece.model, with sentencepiece's whitespace handling (runs of it one space, the ends trimmed) and its
        user-defined symbols left to the model. Google's re-split of `1,` pieces has no equivalent in `tokenizers`:
        a digit before a comma may be tokenized otherwise. None for a BPE model (transformers converts its
        spiece.model itself)."""
        from sentencepiece import sentencepiece_model_pb2
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
        from tokenizers.models import Unigram

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(self._proto)
        if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
            return None
        vocab = [(p.piece, p.score) for p in proto.pieces]
        tokenizer = Tokenizer(Unigram(vocab, unk_id=self._sp.unk_id(), byte_fallback=False))
        # [CLS], [SEP], [MASK] matched whole; ALBERT's user-defined symbols stay pieces of the model, as in
        # sentencepiece, where they split no word
        control = sentencepiece_model_pb2.ModelProto.SentencePiece.CONTROL
        tokenizer.add_special_tokens([AddedToken(p.piece, normalized=False) for p in proto.pieces if p.type == control])
        charsmap = proto.normalizer_spec.precompiled_charsmap
        tokenizer.normalizer = normalizers.Sequence(
            [
                normalizers.Replace("``", '"'),
                normalizers.Replace("''", '"'),
                normalizers.NFKD(),
                normalizers.StripAccents(),
                normalizers.Lowercase(),
                *([normalizers.Precompiled(charsmap)] if charsmap else []),
                normalizers.Replace(Regex(r"\s+"), " "),
                normalizers.Strip(),
            ]
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="always")
        cls, sep = self.special_tokens["cls"], self.special_tokens["sep"]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, self._sp.piece_to_id(cls)), (sep, self._sp.piece_to_id(sep))],
        )
        return tokenizer

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


class WordPieceBackend:
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
        self._tokenizer = bert_pipeline(
            models.WordPiece(self._ids, unk_token=self._unk, max_input_chars_per_word=WORDPIECE_MAX_CHARS)
        )

    @classmethod
    def from_file(cls, path: Path) -> WordPieceBackend:
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
        self.save_fast(out_dir)

    def save_fast(self, out_dir: Path) -> None:
        publish_bytes(out_dir / FAST_TOKENIZER_FILE, self.fast_tokenizer().to_str(pretty=True).encode("utf-8"))

    def fast_tokenizer(self):
        """This pipeline as a whole `tokenizers.Tokenizer`, as transformers' BertTokenizerFast saves it: [CLS] A
        [SEP] (B [SEP]) around the pieces, the special tokens matched whole, `##` joined back when decoding."""
        from tokenizers import AddedToken, decoders, processors

        tokenizer = bert_pipeline(self._tokenizer.model)
        tokenizer.add_special_tokens(
            [AddedToken(self._tokens[i], special=True, normalized=False) for i in sorted(self._special_ids())]
        )
        cls, sep = self._SPECIAL["cls"], self._SPECIAL["sep"]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, self._ids[cls]), (sep, self._ids[sep])],
        )
        tokenizer.decoder = decoders.WordPiece(prefix="##")
        return tokenizer

    def _special_ids(self) -> set[int]:
        return {self._ids[t] for t in self._SPECIAL.values()}

    @staticmethod
    def tokenizer_config() -> dict:
        return {"tokenizer_class": "BertTokenizer", **_BERT_OPTIONS}


# What transformers' BertTokenizer reads from tokenizer_config.json and builds its BertNormalizer from: the
# pipeline below uses the same values, so the export tokenizes as this module does.
_BERT_OPTIONS = {"do_lower_case": True, "tokenize_chinese_chars": True, "strip_accents": None}


def bert_pipeline(model):
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


def is_cjk(cp: int) -> bool:
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
