"""Text that is not UTF-8: how much of it shows another encoding, which one it likely is, and the one-line error
that says how to convert it (Chinese Windows tools save GBK; Notepad's "Unicode" is UTF-16)."""

import codecs

from albert_dist.errors import AlbertDistError, DataError

#: a text with more than this share of undecodable characters (or NULs) is in another encoding, not UTF-8 with stray
#: bad bytes
FOREIGN_ENCODING_SHARE = 0.05


def undecodable_chars(text: str, data: bytes) -> int:
    """Characters of `text` (decoded from `data` with errors replaced) that show another encoding: replacement
    characters that were not in `data` already, and NULs (UTF-16's high bytes of ASCII, valid UTF-8)."""
    return text.count("\ufffd") - data.count(b"\xef\xbf\xbd") + text.count("\x00")


def not_utf8_error(
    location: str, data: bytes, detail: str, error: type[AlbertDistError] = DataError
) -> AlbertDistError:
    """The error for a file that is not UTF-8, naming the encoding its start shows: UTF-16 (Windows' "Unicode":
    a byte-order mark, NULs between ASCII characters, or Chinese in it), else GB18030 when its text reads as
    Chinese in it (GBK and GB2312, its subsets, are what Chinese Windows tools save text in)."""
    head = data[: 1 << 16]
    bom = head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    if bom or head.count(b"\x00") > len(head) // 4 or _chinese_share(head, "utf-16-le") > 0.9:
        advice = 'it is UTF-16 (Windows\' "Unicode"): convert it with iconv -f UTF-16 -t UTF-8 FILE > NEW_FILE'
    elif _chinese_share(head, "gb18030") >= 0.5:
        advice = (
            "it reads as Chinese in GB18030 (GBK, GB2312; Big5 if it is Traditional Chinese): convert it with "
            "iconv -f GB18030 -t UTF-8 FILE > NEW_FILE"
        )
    else:
        advice = "convert it to UTF-8 first (iconv -f ENCODING -t UTF-8 FILE > NEW_FILE)"
    return error(f"{location}: not UTF-8 text ({detail}); {advice}")


def _chinese_share(data: bytes, encoding: str) -> float:
    """The share of CJK ideographs and punctuation (full-width forms too) among the non-ASCII characters of `data`
    read in `encoding`; 0 when it does not decode (a random byte string rarely reads as Chinese in one)."""
    try:
        text = codecs.getincrementaldecoder(encoding)().decode(data[: len(data) & ~1], final=False)
    except UnicodeDecodeError:
        return 0.0
    foreign = [c for c in text if ord(c) > 0x7F]
    chinese = sum("\u4e00" <= c <= "\u9fff" or "\u3000" <= c <= "\u303f" or "\uff00" <= c <= "\uffef" for c in foreign)
    return chinese / len(foreign) if foreign else 0.0


def refuse_other_encoding(
    location: str, chars: int, undecodable: int, head: bytes, error: type[AlbertDistError] = DataError
) -> None:
    """Stop on text in another encoding: more than `FOREIGN_ENCODING_SHARE` of its `chars` characters
    `undecodable` (`undecodable_chars`); fewer are stray bad bytes, replaced and counted. `head`: the file's first
    bytes, to name the encoding."""
    if undecodable > max(16, FOREIGN_ENCODING_SHARE * chars):
        detail = f"{undecodable:,} of {chars:,} characters cannot be decoded or are NULs"
        raise not_utf8_error(location, head, detail, error)


def first_undecodable(data: bytes) -> str | None:
    """Where `data` stops being UTF-8 text (`line N, byte 0xXX`: an undecodable byte, or a NUL, which UTF-16 puts
    between ASCII characters), None when all of it is."""
    try:
        data.decode("utf-8")
        at = None
    except UnicodeDecodeError as err:
        at = err.start
    nul = data.find(b"\x00", 0, at)
    at = nul if nul >= 0 else at
    if at is None:
        return None
    line = data.count(b"\n", 0, at) + 1
    return f"line {line}, byte 0x{data[at]:02x}"
