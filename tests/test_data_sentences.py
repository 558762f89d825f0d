"""Sentence splitting (no Ray): the text is split, never changed."""

import pytest

from albert_dist.data.sentences import cap_length, detect_language, split_sentences


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Dr. Smith paid $3.14 for it. He left!", ["Dr. Smith paid $3.14 for it.", "He left!"]),
        (
            "Use tools, e.g. Python, i.e. a language. Then stop.",
            ["Use tools, e.g. Python, i.e. a language.", "Then stop."],
        ),
        ("The U.S. Army is big. So is the navy.", ["The U.S. Army is big.", "So is the navy."]),
        ("Apples, pears, etc. They are fruit.", ["Apples, pears, etc.", "They are fruit."]),
        ("See Fig. 3 and No. 5 here. I said no. Fine.", ["See Fig. 3 and No. 5 here.", "I said no.", "Fine."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("It works (mostly.) Next one?", ["It works (mostly.)", "Next one?"]),
        ("Wait... what? He paused... Then spoke.", ["Wait... what?", "He paused...", "Then spoke."]),
        ("Version 2.0.1 costs 1.5 dollars. Ok.", ["Version 2.0.1 costs 1.5 dollars.", "Ok."]),
        ("J. R. R. Tolkien wrote it. Yes.", ["J. R. R. Tolkien wrote it.", "Yes."]),
        ("no terminator at all", ["no terminator at all"]),
        ("  \n\t ", []),
    ],
)
def test_english(text, expected):
    assert split_sentences(text, "en") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("他说：“你好！”然后走了。", ["他说：“你好！”", "然后走了。"]),
        ("今天很好；我们去公园……好吗？「是的。」好", ["今天很好；", "我们去公园……", "好吗？", "「是的。」", "好"]),
        ("价格是3.14元。（真的）对吗？", ["价格是3.14元。", "（真的）对吗？"]),
        ("第一句。『第二句！』第三句", ["第一句。", "『第二句！』", "第三句"]),
        ("半角的句号。Half-width! 也算? 好...对", ["半角的句号。", "Half-width!", "也算?", "好...", "对"]),
    ],
)
def test_chinese_with_closing_quotes(text, expected):
    assert split_sentences(text) == expected  # auto-detected as zh


def test_full_width_forms_end_sentences_and_stay_full_width():
    assert split_sentences("ＡＢＣ　ｆｕｌｌ width！ Ｎext one． （Ｃ） last…  Ｅnd", "en") == [
        "ＡＢＣ ｆｕｌｌ width！",
        "Ｎext one．",
        "（Ｃ） last…",
        "Ｅnd",
    ]


def test_only_whitespace_that_both_tokenizers_treat_as_spaces_is_collapsed():
    """BERT's normalizer deletes \\v, \\f, \\x1c-\\x1f and \\x85 (control characters), so "a\\vb" is one word to it:
    made a space here, the prepared ids would differ from the fine-tuning ones. Control characters stay."""
    assert split_sentences("a\u3000\t b\u00a0\u2028c\x0bd\x0ce\x1cf\x85g\x07h\x00i", "en") == [
        "a b c\x0bd\x0ce\x1cf\x85g\x07h\x00i"
    ]


def test_language_detection_by_cjk_share():
    assert detect_language("这是一个中文句子, with a few English words.") == "zh"
    assert detect_language("An English sentence mentioning 中文 once, among many other words.") == "en"


def test_cap_length_cuts_runaway_lines_at_spaces():
    line = "word " * 200_000  # 1 MB, no terminator
    pieces = cap_length(line.strip(), 1000)
    assert all(len(p) <= 1000 for p in pieces)
    assert " ".join(pieces) == line.strip()
    assert cap_length("x" * 2500, 1000) == ["x" * 1000, "x" * 1000, "x" * 500]
