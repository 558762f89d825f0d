"""Chinese sentence splitting: no spaces, full-width punctuation (kept as it is), quotes and brackets."""

import pytest

from albert_dist.data.sentences import split_sentences


@pytest.mark.parametrize(
    "text, expected",
    [
        ("他问：“你去哪儿？”我说：“回家！”", ["他问：“你去哪儿？”", "我说：“回家！”"]),
        ("他走了。“等等！”她喊道。", ["他走了。", "“等等！”", "她喊道。"]),
        ("他说：‘好。’然后走了", ["他说：‘好。’", "然后走了"]),
        ("「今天天气很好。」她说。", ["「今天天气很好。」", "她说。"]),
        ("真的吗？！太好了！", ["真的吗？！", "太好了！"]),
        ("这是第一句……这是第二句。", ["这是第一句……", "这是第二句。"]),
        ("《红楼梦》是名著；《西游记》也是。", ["《红楼梦》是名著；", "《西游记》也是。"]),
        ("价格是３．１４元，约合０.５美元。下一句", ["价格是３．１４元，约合０.５美元。", "下一句"]),
        ("他用ALBERT模型。Dr. Smith说Hello. 好的。", ["他用ALBERT模型。", "Dr. Smith说Hello. 好的。"]),
        ("没有标点的一段文字", ["没有标点的一段文字"]),
        ("第一句。\u3000第二句。", ["第一句。", "第二句。"]),
    ],
)
def test_chinese_sentences(text, expected):
    assert split_sentences(text) == expected  # auto-detected as zh
