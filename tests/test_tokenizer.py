"""Tokenizer: real SentencePiece training, id parity with transformers, WordPiece for Chinese vocabularies."""

from __future__ import annotations

import pickle
import random
import string
from pathlib import Path

import pytest
import sentencepiece as spm
import transformers
from chinese_helpers import ZH_SENTENCES, zh_word_lines

from albert_dist.errors import TokenizerError
from albert_dist.tokenizer import training as tokenizer_module
from albert_dist.tokenizer.albert_tokenizer import AlbertTokenizer, load_tokenizer, truncate_longest_first
from albert_dist.tokenizer.backends import ALBERT_USER_SYMBOLS, albert_preprocess
from albert_dist.tokenizer.training import train_sentencepiece, train_wordpiece

ENGLISH_TEXTS = [
    "Hello world",
    "The QUICK Brown fox, jumps over the lazy dog.",
    "   extra   spaces\tand a tab\nand a newline   ",
    "Crème brûlée à la façon de Zoë, naïve café résumé",
    "ÅNGSTRÖM units; ﬁne ligatures and ＦＵＬＬＷＩＤＴＨ letters",
    "``Quoted'' text with (parentheses) - dashes – and £5 or €10",
    "It cost 1,234 dollars in 2019, then 2,5 million.",
    "Numbers: 1, 2, 3, 10, 100,",
    "a,b 1,a 12,345,678",
    "CamelCaseIdentifier and snake_case_name() return None",
    "emoji 🙂 and a snowman ☃ are unknown",
    "ǅ ǈ ß İstanbul x\u00a0y\u2003z",
]
PAIRS = [
    ("Return the number of items.", "Raise ValueError if the value is NOT present."),
    ("Crème  brûlée", "``quoted''  text   here"),
    ("short", "a much longer second segment of text that goes on and on about the iterator protocol"),
]


def _google_encode_pieces(pieces: list[str], sp: spm.SentencePieceProcessor) -> list[str]:
    """Reference: google-research/albert tokenization.encode_pieces' digit-comma re-split, applied to pieces."""
    out = []
    for piece in pieces:
        if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
            cur = sp.encode(piece[:-1].replace("\u2581", ""), out_type=str)
            if piece[0] != "\u2581" and cur[0][0] == "\u2581":
                cur = cur[1:] if len(cur[0]) == 1 else [cur[0][1:], *cur[1:]]
            out.extend([*cur, piece[-1]])
        else:
            out.append(piece)
    return out


@pytest.fixture(scope="module")
def english_dir(stdlib_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("spm_en")
    train_sentencepiece(stdlib_corpus, out, vocab_size=3000, progress=lambda _: None)
    return out


@pytest.fixture(scope="module")
def english(english_dir):
    return load_tokenizer(english_dir)


@pytest.fixture(scope="module")
def hf_english(english, tmp_path_factory):
    """transformers' tokenizer loaded through AutoTokenizer from the directory our `save` wrote."""
    saved = english.save(tmp_path_factory.mktemp("saved_en"))
    return transformers.AutoTokenizer.from_pretrained(saved)


# ---- SentencePiece training ----


def test_trained_model_has_albert_layout(english, english_dir):
    assert (english.pad_id, english.unk_id, english.cls_id, english.sep_id, english.mask_id) == (0, 1, 2, 3, 4)
    assert english.convert_ids_to_tokens(range(5)) == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    assert english.convert_ids_to_tokens(range(5, 5 + len(ALBERT_USER_SYMBOLS))) == list(ALBERT_USER_SYMBOLS)
    assert english.special_ids == {0, 2, 3, 4}
    assert english.vocab_size == 3000 and english.kind == "sentencepiece"
    assert (english_dir / "spiece.vocab").read_text(encoding="utf-8").startswith("<pad>\t0\n<unk>\t0\n[CLS]\t0\n")
    assert not [p for p in english_dir.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_training_lowercases_and_strips_accents(english):
    pieces = english.convert_ids_to_tokens(range(5, english.vocab_size))
    assert not any(c.isupper() or c in "éèàç" for p in pieces for c in p)


def test_training_is_deterministic_and_samples(stdlib_corpus, tmp_path):
    messages: list[str] = []
    a = train_sentencepiece(
        stdlib_corpus, tmp_path / "a", 500, input_sentence_size=300, seed=7, progress=messages.append
    )
    b = train_sentencepiece(
        stdlib_corpus, tmp_path / "b", 500, input_sentence_size=300, seed=7, progress=lambda _: None
    )
    assert (a.parent / "spiece.vocab").read_bytes() == (b.parent / "spiece.vocab").read_bytes()
    assert any(m.startswith("sentencepiece: training on 300 of ") for m in messages)


def test_training_reports_progress_on_large_inputs(stdlib_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "_PROGRESS_EVERY_BYTES", 100_000)
    messages: list[str] = []
    train_sentencepiece([stdlib_corpus], tmp_path, 500, input_sentence_size=200, progress=messages.append)
    assert sum("sentencepiece: read" in m for m in messages) >= 3


def test_chinese_sentencepiece_training(tmp_path):
    rng = random.Random(0)
    chars = [chr(0x4E00 + i) for i in range(400)]
    weights = [1 / (rank + 1) for rank in range(len(chars))]  # Zipf-like: a long tail of rare characters
    lines = []
    for _ in range(1500):
        sentence = "".join(rng.choices(chars, weights, k=rng.randint(8, 40)))
        lines.append(sentence + rng.choice("。！？"))
    corpus = tmp_path / "zh.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")

    model = train_sentencepiece(corpus, tmp_path / "zh", 1000, character_coverage=0.9995, progress=lambda _: None)
    tok = load_tokenizer(model)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    ids = tok.encode(lines[0])
    assert tok.unk_id not in ids
    assert tok.decode(ids) == albert_preprocess(lines[0])  # NFKD turns the full-width ！？ into !?


# ---- parity with transformers ----


@pytest.fixture(scope="module")
def raw_sp(english_dir):
    return spm.SentencePieceProcessor(model_file=str(english_dir / "spiece.model"))


@pytest.mark.parametrize("text", ENGLISH_TEXTS)
def test_ids_match_google_reference(english, hf_english, raw_sp, text):
    """transformers' normalizer, then raw sentencepiece, then google's digit-comma re-split: what the
    checkpoints were pretrained with (google tokenization.py == transformers v4's slow AlbertTokenizer)."""
    normalized = hf_english.backend_tokenizer.normalizer.normalize_str(text)
    reference = _google_encode_pieces(raw_sp.encode(normalized, out_type=str), raw_sp)
    assert english.encode(text) == [raw_sp.piece_to_id(p) for p in reference]


# transformers v5 rebuilt AlbertTokenizer on `tokenizers` from spiece.model without the slow class, which loses
# google's digit-comma re-split (v5 keeps pieces like "1,"; v4's AlbertConverter at least penalised them by -100).
# (Its earlier split of user-defined pieces such as "(" off the raw text is gone in 5.25: those texts agree.)
# Also, tokenizers' Unigram may break exact score ties differently from sentencepiece (seen here: "000" inside a
# sentence as "0", "00" versus "00", "0"), which is why no text below repeats a digit run.
KNOWN_V5_DIFFERENCES = {
    "It cost 1,234 dollars in 2019, then 2,5 million.": "digit-comma",
    "Numbers: 1, 2, 3, 10, 100,": "digit-comma",
    "a,b 1,a 12,345,678": "digit-comma",
}


@pytest.mark.parametrize("text", ENGLISH_TEXTS)
def test_ids_match_transformers_v5(english, hf_english, raw_sp, text):
    hf_ids = hf_english.encode(text, add_special_tokens=False)
    kind = KNOWN_V5_DIFFERENCES.get(text)
    if kind is None:
        assert english.encode(text) == hf_ids
        return
    assert english.encode(text) != hf_ids, "a documented transformers v5 difference has disappeared"
    hf_pieces = hf_english.convert_ids_to_tokens(hf_ids)
    if kind == "digit-comma":  # re-splitting v5's pieces the google way gives exactly our ids
        assert english.encode(text) == hf_english.convert_tokens_to_ids(_google_encode_pieces(hf_pieces, raw_sp))
    else:  # v5 has no "▁" piece before a user-defined symbol that follows a space
        ours = english.tokenize(text)
        assert ["\u2581", "("] == ours[ours.index("(") - 1 : ours.index("(") + 1]
        assert hf_pieces[hf_pieces.index("(") - 1] != "\u2581"


def test_autotokenizer_from_model_dir_matches(english, english_dir):
    hf = transformers.AlbertTokenizer.from_pretrained(english_dir)
    assert hf.encode(ENGLISH_TEXTS[1], add_special_tokens=False) == english.encode(ENGLISH_TEXTS[1])


@pytest.mark.parametrize("max_length", [None, 9, 12, 20])
@pytest.mark.parametrize("pair", PAIRS)
def test_pairs_match_transformers(english, hf_english, pair, max_length):
    ours = english.encode_pair(*pair, max_length=max_length)
    theirs = hf_english(
        *pair, truncation="longest_first" if max_length else False, max_length=max_length, return_token_type_ids=True
    )
    assert ours == {k: theirs[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


def test_batch_matches_transformers(english, hf_english):
    texts, pairs = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    ours = english.batch_encode(texts, pairs, max_length=24, pad_to_multiple_of=8)
    theirs = hf_english(
        texts,
        pairs,
        truncation=True,
        max_length=24,
        padding="longest",
        pad_to_multiple_of=8,
        return_token_type_ids=True,
    )
    assert ours == {k: theirs[k] for k in ours}


# ---- model inputs ----


def test_pair_layout(english):
    a, b = english.encode("hello world"), english.encode("the second one")
    enc = english.encode_pair("hello world", "the second one")
    assert enc["input_ids"] == [2, *a, 3, *b, 3]
    assert enc["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert enc["attention_mask"] == [1] * (len(a) + len(b) + 3)
    assert english.encode_pair("hello world")["input_ids"] == [2, *a, 3]


def test_truncation_longest_first():
    a, b = list(range(10)), list(range(100, 104))
    assert truncate_longest_first(a, b, 10) == (a[:6], b)
    assert truncate_longest_first(a, b, 7) == (a[:4], b[:3])
    assert truncate_longest_first(b, a, 7) == (b[:3], a[:4])
    assert truncate_longest_first(a, None, 3) == (a[:3], None)
    assert truncate_longest_first(a, b, 20) == (a, b)


def test_batch_padding(english):
    texts = ["one", "a somewhat longer sentence about iterators and generators"]
    longest = english.batch_encode(texts)
    width = max(len(english.encode(t)) for t in texts) + 2
    assert all(len(row) == width for row in longest["input_ids"])
    assert longest["input_ids"][0][-1] == english.pad_id and longest["attention_mask"][0][-1] == 0

    padded = english.batch_encode(texts, pad_to_multiple_of=8, return_tensors="pt")
    assert padded["input_ids"].shape == (2, -(-width // 8) * 8)
    assert padded["attention_mask"].sum(1).tolist() == [len(english.encode(t)) + 2 for t in texts]

    fixed = english.batch_encode(texts, max_length=6, padding="max_length")
    assert [len(r) for r in fixed["input_ids"]] == [6, 6] and fixed["input_ids"][1][-1] == english.sep_id


def test_word_starts_sentencepiece(english):
    ids = english.encode_pair("tokenization iterators", "x")["input_ids"]
    tokens = english.convert_ids_to_tokens(ids)
    starts = english.word_starts(ids)
    assert starts[0] and starts[-1]  # [CLS], [SEP]
    assert starts[1:-1] == [t.startswith("\u2581") or t == "[SEP]" for t in tokens[1:-1]]
    assert starts.count(False) > 0  # the words split into several pieces


def test_decode_round_trip(english):
    assert english.decode(english.encode_pair("Hello  World", "Naïve")["input_ids"]) == "hello world naive"


def test_pickle_round_trip(english):
    clone = pickle.loads(pickle.dumps(english))
    assert clone.encode(ENGLISH_TEXTS[6]) == english.encode(ENGLISH_TEXTS[6])
    assert clone.vocab_size == english.vocab_size and clone.special_ids == english.special_ids


# ---- WordPiece (Chinese vocab.txt) ----

ZH_TEXTS = [
    "我们在北京学习中文。",
    "今天天气很好！Hello, WORLD?",
    "中文和English混合，还有未知字符：龘。",
    "Tokenizer 的 tokenization 很重要",
    "naïve  中国  résumé",
]


@pytest.fixture(scope="module")
def zh_dir(tmp_path_factory):
    chars = sorted(set("".join(ZH_TEXTS)) - set("龘") - {" "})
    words = ["hello", "world", "token", "##izer", "##ization", "eng", "##lish", "naive", "resume", "re", "##sume"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *(c.lower() for c in chars)]
    out = tmp_path_factory.mktemp("zh_vocab")
    (out / "vocab.txt").write_text("".join(dict.fromkeys(t + "\n" for t in vocab)), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def chinese(zh_dir):
    return load_tokenizer(zh_dir)


def test_wordpiece_basics(chinese):
    assert chinese.kind == "wordpiece"
    assert (chinese.pad_id, chinese.unk_id, chinese.cls_id, chinese.sep_id, chinese.mask_id) == (0, 1, 2, 3, 4)
    assert chinese.tokenize("我们Tokenizer龘") == ["我", "们", "token", "##izer", "[UNK]"]
    assert chinese.tokenize("Hello,WORLD") == ["hello", ",", "world"]
    ids = chinese.encode("中国tokenization")
    assert chinese.word_starts(ids) == [True, True, True, False]
    assert chinese.decode(chinese.encode_pair("tokenization", "中国")["input_ids"]) == "tokenization 中 国"


@pytest.mark.parametrize("text", ZH_TEXTS)
def test_wordpiece_matches_bert_tokenizer(chinese, zh_dir, text):
    hf = transformers.BertTokenizer.from_pretrained(zh_dir)
    assert chinese.encode(text) == hf.encode(text, add_special_tokens=False)
    assert chinese.encode_pair(text, ZH_TEXTS[0]) == dict(hf(text, ZH_TEXTS[0], return_token_type_ids=True))


def test_wordpiece_save_loads_in_transformers(chinese, tmp_path):
    chinese.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(hf).__name__ == "BertTokenizer"
    assert [hf.encode(t, add_special_tokens=False) for t in ZH_TEXTS] == [chinese.encode(t) for t in ZH_TEXTS]
    assert load_tokenizer(tmp_path / "vocab.txt").encode(ZH_TEXTS[2]) == chinese.encode(ZH_TEXTS[2])


def test_wordpiece_pickle(chinese):
    assert pickle.loads(pickle.dumps(chinese)).encode(ZH_TEXTS[1]) == chinese.encode(ZH_TEXTS[1])


WEB_LINE = "这款USB-C充电器只要99元, 比XP时代快10倍! 评分4.5/5~"


def _full_width(text: str) -> str:
    """ASCII `!`..`~` as their full-width forms U+FF01..U+FF5E."""
    return "".join(chr(ord(c) + 0xFEE0) for c in text)


def _full_width_lines(n: int, seed: int = 0) -> list[str]:
    """Chinese as People's Daily writes it: a few hundred common hanzi, and digits, Latin letters and punctuation
    all full-width; the numbers recur, so a trainer that merges digits learns them whole."""
    rng = random.Random(seed)
    common = (
        "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就"
        "下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都"
        "三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从款评"
        "充电元倍快代"
    )
    hanzi = sorted({c for c in "".join(ZH_SENTENCES) + common if "\u4e00" <= c <= "\u9fff"})
    numbers = [_full_width(str(rng.randrange(10 ** rng.randint(1, 12)))) for _ in range(40)]
    latin = [_full_width(w) for w in ("USB", "XP", "CEO", "GDP", "WTO", "CPU", "IT", "Windows")]
    lines = []
    for _ in range(n):
        parts = ["".join(rng.choices(hanzi, k=rng.randint(2, 8))) for _ in range(rng.randint(2, 6))]
        for _ in range(rng.randint(1, 3)):
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(numbers + latin))
        lines.append("".join(p + rng.choice("，、；：") for p in parts[:-1]) + parts[-1] + rng.choice("。！？"))
    return lines


@pytest.fixture(scope="module")
def full_width_wordpiece(tmp_path_factory):
    out = tmp_path_factory.mktemp("wordpiece_full_width")
    corpus = out / "corpus.txt"
    corpus.write_text("\n".join(_full_width_lines(3000)) + "\n", encoding="utf-8")
    train_wordpiece(corpus, out, 1000, progress=lambda _: None)
    return out


def test_wordpiece_from_full_width_text_reads_half_width_text(full_width_wordpiece):
    """A vocabulary trained on text that writes digits, Latin letters and punctuation only full-width still spells
    their ordinary ASCII forms, through our tokenizer and through transformers on the saved tokenizer."""
    ours = load_tokenizer(full_width_wordpiece)
    tokens = ours.tokenize(WEB_LINE)
    share = tokens.count("[UNK]") / len(tokens)
    print(f"[UNK] share of the web line: {share:.1%} ({tokens})")
    assert "[UNK]" not in tokens, f"{share:.1%} of the tokens are [UNK]: {tokens}"
    hf = transformers.AutoTokenizer.from_pretrained(ours.save(full_width_wordpiece / "export"))
    fast = transformers.BertTokenizerFast.from_pretrained(full_width_wordpiece / "export")
    for theirs in (hf, fast):
        assert theirs.encode(WEB_LINE, add_special_tokens=False) == ours.encode(WEB_LINE)
        assert theirs.unk_token_id not in theirs.encode(WEB_LINE, add_special_tokens=False)


def test_wordpiece_holds_the_base_alphabet_and_learns_no_numbers(full_width_wordpiece):
    vocab = (full_width_wordpiece / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) <= 1000
    ascii_alphabet = string.ascii_lowercase + string.digits + string.punctuation
    full_width = "".join(chr(cp) for cp in range(0xFF01, 0xFF5F)).lower()
    word_chars = string.ascii_lowercase + string.digits + _full_width(string.ascii_lowercase + string.digits)
    expected = [*ascii_alphabet, *full_width, *"、。〈〉《》「」『』【】〔〕…—‘’“”", *("##" + c for c in word_chars)]
    assert [t for t in expected if t not in vocab] == []
    pieces = [t.removeprefix("##") for t in vocab]
    assert [t for t in pieces if t.isdigit() and len(t) > 1] == []  # str.isdigit holds for full-width digits too
    ours = load_tokenizer(full_width_wordpiece)
    for number in ("9017917664794", _full_width("9017917664794"), "70548"):
        assert ours.tokenize(number) == [number[0], *("##" + d for d in number[1:])]


def test_wordpiece_base_alphabet_takes_priority_over_vocab_size(tmp_path):
    """A vocab_size too small for the base alphabet and the corpus's CJK characters is exceeded, not enforced."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(_full_width_lines(50)) + "\n", encoding="utf-8")
    train_wordpiece(corpus, tmp_path, 16, progress=lambda _: None)
    vocab = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    hanzi = {c for line in _full_width_lines(50) for c in line if "\u4e00" <= c <= "\u9fff"}
    assert hanzi <= set(vocab) and {"a", "##a", "9", "##9", "ａ", "##９", "，", "。"} <= set(vocab)
    assert load_tokenizer(tmp_path).tokenize("USB 99") == ["u", "##s", "##b", "9", "##9"]


# ---- native encoders over thousands of real lines ----


@pytest.fixture(scope="module")
def real_lines(stdlib_corpus):
    """2,000 lines of standard-library docstrings and 2,000 of Chinese words mixed with full-width punctuation and
    digits, Latin words and emoji."""
    english = [line for line in stdlib_corpus.read_text(encoding="utf-8").splitlines() if line.strip()][:2000]
    return english + zh_word_lines(2000)


@pytest.fixture(scope="module")
def mixed_wordpiece(real_lines, tmp_path_factory):
    """A vocabulary trained on every other line: the others hold characters it lacks."""
    out = tmp_path_factory.mktemp("wordpiece_mixed")
    corpus = out / "corpus.txt"
    corpus.write_text("\n".join(real_lines[::2]) + "\n", encoding="utf-8")
    train_wordpiece(corpus, out, 4000, progress=lambda _: None)
    return out


def _python_bert_tokenizer(directory: Path):
    """transformers' pure-Python BERT tokenizer: v5's BertTokenizerLegacy, v4's (slow) BertTokenizer."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as python_class
    except ImportError:
        python_class = transformers.BertTokenizer
    return python_class(str(directory / "vocab.txt"))


def test_native_wordpiece_gives_the_pure_python_and_autotokenizer_ids(mixed_wordpiece, real_lines):
    ours = load_tokenizer(mixed_wordpiece)
    batch = ours.tokenize_batch(real_lines)
    python = _python_bert_tokenizer(mixed_wordpiece)
    assert [ids for _, ids in batch] == [python.convert_tokens_to_ids(python.tokenize(line)) for line in real_lines]
    hf = transformers.AutoTokenizer.from_pretrained(ours.save(mixed_wordpiece / "export"))
    assert [ids for _, ids in batch] == [hf(line, add_special_tokens=False)["input_ids"] for line in real_lines]
    assert [tokens for tokens, _ in batch] == [ours.convert_ids_to_tokens(ids) for _, ids in batch]
    assert sum(ids.count(ours.unk_id) for _, ids in batch) > 100  # the lines do reach [UNK]


def test_sentencepiece_batch_gives_the_per_line_ids(english, raw_sp, real_lines):
    """The batch encoder against what google's tokenizer does one line at a time."""
    expected = []
    for line in real_lines:
        pieces = _google_encode_pieces(raw_sp.encode(albert_preprocess(line), out_type=str), raw_sp)
        expected.append((pieces, [raw_sp.piece_to_id(p) for p in pieces]))
    assert english.tokenize_batch(real_lines) == expected
    assert (
        sum(
            pieces != raw_sp.encode(albert_preprocess(line), out_type=str)
            for line, (pieces, _) in zip(real_lines, expected)
        )
        > 10
    )  # digit-comma re-splits happen


# ---- errors ----


def test_missing_input_file(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(TokenizerError, match="nope.txt"):
        train_sentencepiece(missing, tmp_path / "out", 100)


def test_a_corpus_in_another_encoding_trains_nothing(tmp_path):
    """GBK text decoded as UTF-8 is replacement characters: no vocabulary is trained on them."""
    text = "".join(f"第{i}段。今天天气很好，我们去公园散步。\n" for i in range(50))
    (tmp_path / "gbk.txt").write_bytes(text.encode("gbk"))
    for train in (train_sentencepiece, train_wordpiece):
        with pytest.raises(TokenizerError, match=r"gbk.txt: not UTF-8 text .*iconv -f GB18030 -t UTF-8"):
            train(tmp_path / "gbk.txt", tmp_path / "out", 100, progress=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_empty_corpus(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match="empty corpus.*empty.txt"):
        train_sentencepiece(empty, tmp_path / "out", 100, progress=lambda _: None)
    assert not (tmp_path / "out" / "spiece.model").exists()


def test_vocab_too_large(tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("a tiny corpus with few words\nanother tiny line\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"vocab_size=5000 is too large.*small.txt.*at most \d+ pieces"):
        train_sentencepiece(small, tmp_path / "out", 5000, progress=lambda _: None)


def test_directory_without_tokenizer(tmp_path):
    with pytest.raises(TokenizerError, match=f"no tokenizer in {tmp_path}"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="not found.*absent"):
        AlbertTokenizer(tmp_path / "absent")


def test_vocab_without_special_tokens(tmp_path):
    (tmp_path / "vocab.txt").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"vocab.txt lacks the special tokens"):
        load_tokenizer(tmp_path)
