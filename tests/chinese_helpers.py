"""Real Chinese sentences (with English words mixed in) and corpora built from them, for the Chinese tests."""

from __future__ import annotations

import random
from pathlib import Path

ZH_SENTENCES = [
    "我们在北京大学学习自然语言处理，老师讲得非常清楚。",
    "自然语言处理是人工智能领域中的一个重要方向。",
    "今天上海的天气很好，我们去外滩散步吧！",
    "他用ALBERT模型做中文文本分类，效果比BERT更好。",
    "这个开源项目使用Ray Data并行处理大规模语料库。",
    "研究人员发现，预训练语言模型能够学到丰富的语法知识。",
    "请把这份报告在星期五之前发给项目经理审阅。",
    "中华人民共和国的首都是北京，上海是最大的经济中心。",
    "Deep learning改变了计算机视觉和语音识别的研究方式。",
    "小明说：“我明天要去图书馆借几本历史书。”",
    "机器翻译系统需要大量高质量的双语平行语料。",
    "长江是中国最长的河流，全长约六千三百公里。",
]


def zh_corpus(path: Path, documents: int = 200, seed: int = 0) -> Path:
    """Blank-line separated documents of 2-6 of the sentences, written without spaces between them."""
    rng = random.Random(seed)
    docs = ["".join(rng.sample(ZH_SENTENCES, rng.randint(2, 6))) for _ in range(documents)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def zh_word_lines(n: int, seed: int = 0) -> list[str]:
    """`n` lines of real Chinese words (jieba's dictionary, drawn by their frequency: thousands of distinct
    characters, rare ones included) with what Chinese text mixes in: full-width and ASCII punctuation, full-width
    and ASCII digits, Latin words, emoji, spaces."""
    import jieba

    rng = random.Random(seed)
    words, weights = [], []
    with open(Path(jieba.__file__).parent / "dict.txt", encoding="utf-8") as f:
        for line in f:
            word, freq, *_ = line.split()
            words.append(word)
            weights.append(int(freq))
    extras = [
        "，",
        "。",
        "！",
        "？",
        "、",
        "；",
        "：",
        "（",
        "）",
        "“",
        "”",
        "《",
        "》",
        "……",
        "——",
        ",",
        ".",
        "!",
        "５",
        "１２",
        "２０２４年",
        "3.14",
        "100%",
        "ALBERT",
        "Python",
        "😀",
        "👍🏽",
        " ",
        "　",
        "ｅｍａｉｌ",
        "Zoë",
    ]
    lines = []
    for _ in range(n):
        parts = rng.choices(words, weights, k=rng.randint(4, 16))
        for _ in range(rng.randint(1, 4)):
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(extras))
        lines.append("".join(parts) + rng.choice("。！？"))
    return lines
