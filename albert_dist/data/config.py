"""`albert-dist data prepare`'s config: the corpus, the tokenizer, how documents become SOP instances, static masks."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from albert_dist.config import LocalOutputDir, Section, changed_from_default, local_path
from albert_dist.redaction import refuse_uri_credentials
from albert_dist.storage import is_uri, uri_path


class OutputSection(Section):
    """Data preparation's `run:`: where its outputs go (`data.output` under it; data.seed seeds it)."""

    key_hints = {
        "name": "data preparation writes to data.output, under run.output_dir",
        "seed": "data preparation is seeded by data.seed",
    }

    output_dir: LocalOutputDir = "runs"


class TokenizerSection(Section):
    kind: Literal["sentencepiece", "wordpiece"] = Field(
        "sentencepiece",
        description="sentencepiece: spiece.model (English ALBERT); wordpiece: a BERT-Chinese "
        "vocab.txt (one token per CJK character, WordPiece for Latin words).",
    )
    path: str | None = Field(
        None,
        description="An existing tokenizer (dir with spiece.model or vocab.txt, the file, or a Hugging Face "
        "Hub model id: org/name[@revision]); when empty one is trained on the corpus.",
    )
    vocab_size: int = Field(8000, ge=16)
    character_coverage: float = Field(0.99995, ge=0.98, le=1, description="SentencePiece only (it takes 0.98-1).")
    input_sentence_size: int = Field(1_000_000, gt=0, description="Lines sampled from the corpus for training.")
    model_type: Literal["unigram", "bpe"] = Field("unigram", description="SentencePiece only.")

    _local_path = field_validator("path")(classmethod(lambda cls, value: local_path(value)))

    @model_validator(mode="after")
    def _options_fit_kind(self) -> TokenizerSection:
        if self.kind == "wordpiece":
            misplaced = changed_from_default(self, ("character_coverage", "model_type"))
            if misplaced:
                raise ValueError(f"{', '.join(misplaced)} apply to kind=sentencepiece only")
        return self


class MaskingSection(Section):
    """Masked-LM masking, drawn at training time (pretraining's `masking:`). Pretraining's held-out evaluation
    draws its fixed masks as the data was prepared (data prepare's `masking:`), so runs compare on the same ones,
    and shows [MASK] at every one of them (no random or kept token a model could copy)."""

    key_hints = {"static": "static masks are chosen when preparing the data: data prepare's masking.static"}

    mlm_probability: float = Field(0.15, gt=0, lt=1)
    max_predictions_per_seq: int = Field(20, gt=0)
    max_ngram: int = Field(3, ge=1, le=10)
    whole_word: bool = True
    pad_to_multiple_of: int = Field(8, ge=1)


class PrepareMaskingSection(MaskingSection):
    """Data preparation's `masking:`: the settings recorded with the data, or with `static` the masks written."""

    static: bool = Field(
        False, description="Write masks with the data (google-research's setup) instead of drawing new ones each epoch."
    )


class PreparationSection(Section):
    """How a corpus becomes SOP instances: `data:` of data preparation but the inputs (the demo's are its own)."""

    format: Literal["auto", "sentences", "lines", "blocks", "jsonl", "parquet"] = Field(
        "auto",
        description="sentences: one sentence per line, blank line between documents (google-research); "
        "lines: one document per line; blocks: blank-line separated documents; "
        "jsonl/parquet: one document per record.",
    )
    text_field: str = "text"
    language: Literal["auto", "en", "zh"] = "auto"
    output: str = Field(
        "data/prepared",
        description="Prepared dataset directory (relative to run.output_dir), or a "
        "URI (s3://bucket/prefix, gs://...; credentials from the "
        "environment).",
    )
    max_seq_length: int = Field(128, ge=8, le=8192)
    short_seq_prob: float = Field(0.1, ge=0, le=1)
    dupe_factor: int = Field(1, ge=1)
    eval_fraction: float = Field(0.02, ge=0, lt=1, description="Share of documents held out for evaluation.")
    max_sentence_chars: int = Field(
        2000, ge=16, description="Longer sentences (runaway lines) are cut into pieces of at most this many characters."
    )
    rows_per_shard: int = Field(50_000, gt=0)
    tokenizer_actors: int | None = Field(
        None,
        ge=1,
        description="Actors that segment, tokenize and build "
        "instances; default one per CPU of the cluster "
        "left after reading.",
    )
    range_bytes: int | None = Field(
        None,
        ge=1,
        description="Files are read in ranges of about this many bytes, cut where a document ends, so "
        "one big file is many tasks (a gzip file is one: it cannot be entered in the "
        "middle); default: about four ranges per CPU of the cluster, 256 KiB to 64 MiB.",
    )
    word_segmenter: Literal["jieba"] | None = Field(
        None, description="jieba: whole-word masking of Chinese words (else each CJK character is a word)."
    )
    user_dict: str | None = Field(None, description="A jieba user dictionary (one 'word [freq] [tag]' a line).")
    seed: int = 12345

    @field_validator("output")
    @classmethod
    def _output_uri_names_a_prefix(cls, output: str) -> str:
        refuse_uri_credentials(output)
        if is_uri(output) and not output.startswith("file://") and "/" not in uri_path(output).strip("/"):
            raise ValueError(
                "name a prefix inside the bucket (s3://bucket/prefix): publishing replaces everything under it"
            )
        return output

    @model_validator(mode="after")
    def _user_dict_needs_segmenter(self) -> PreparationSection:
        if self.user_dict and self.word_segmenter is None:
            raise ValueError("user_dict needs word_segmenter: jieba")
        return self


class DataSection(PreparationSection):
    """`albert-dist data prepare`'s `data:`."""

    inputs: list[str] = Field(default_factory=list, description="Files, directories or globs (.gz allowed).")

    @field_validator("inputs")
    @classmethod
    def _inputs_without_secrets(cls, inputs: list[str]) -> list[str]:
        for item in inputs:
            refuse_uri_credentials(item)
        return inputs


class DataJobConfig(Section):
    """`albert-dist data prepare`."""

    run: OutputSection = Field(default_factory=OutputSection)
    data: DataSection = Field(default_factory=DataSection)
    tokenizer: TokenizerSection = Field(default_factory=TokenizerSection)
    masking: PrepareMaskingSection = Field(default_factory=PrepareMaskingSection)

    @model_validator(mode="after")
    def _no_option_without_effect(self) -> DataJobConfig:
        """Training options with a given tokenizer, masking options without static masks, would be ignored."""
        trained = changed_from_default(
            self.tokenizer, ("vocab_size", "character_coverage", "input_sentence_size", "model_type")
        )
        if self.tokenizer.path and trained:
            raise ValueError(
                f"tokenizer.{', tokenizer.'.join(trained)}: options of training a tokenizer, and "
                f"tokenizer.path gives one"
            )
        masking = changed_from_default(self.masking, MaskingSection.model_fields)
        if masking and not self.masking.static:
            raise ValueError(
                f"masking.{', masking.'.join(masking)}: options of static masks (masking.static: "
                "true); pretraining's masking: section sets the masks it draws"
            )
        return self
