"""Real-text corpora that ship in Debian packages, written as plain text for `bench_recipes.py`.

    apt-get install manpages-zh python3-doc
    python benchmarks/corpora.py zh-manpages /work/corpora/zh_manpages.txt
    python benchmarks/corpora.py en-pydocs /work/corpora/en_pydocs.txt

Each is written as blank-line separated documents (data prepare's `blocks` format), one paragraph a line:
- `zh-manpages`: Debian's Simplified Chinese manual pages (`/usr/share/man/zh_CN`), modern technical prose. roff
  requests are dropped, a paragraph ends at each paragraph or section macro, font and character escapes are
  removed, and paragraphs without a Chinese character (option tables, examples) are left out. manpages-zh
  1.6.4.0: 794 pages, 1.69M characters, 0.84M of them Han.
- `en-pydocs`: the reStructuredText sources of Python's documentation (python3-doc), English prose: directives,
  comments, headings and indented blocks (code, directive bodies) are dropped, inline markup is reduced to its
  text.
(Debian's fortunes-zh `chinese` file, the other Chinese corpus, is rebuilt as benchmarks/README.md shows.)
"""

from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path
from typing import Iterator

MANPAGES = Path("/usr/share/man/zh_CN")
PYDOCS = Path("/usr/share/doc/python3-doc/html/_sources")
HAN = re.compile(r"[\u4e00-\u9fff]")
ROFF_PARAGRAPH = re.compile(r"^\.(PP|P|LP|SH|SS|TP|IP|HP|sp|br)\b")
ROFF_ESCAPES = re.compile(r"\\f[BIRP]|\\f\(..|\\\(..|\\[-e&|^ ]|\\s[-+]?\d")
RST_ROLE = re.compile(r":[\w:-]+:`(?:[^`<]*<)?([^`>]*)>?`")  # :func:`name` and :ref:`text <target>` → their text
RST_MARKUP = re.compile(r"``|\*\*|(?<!\w)\*(?=\S)|(?<=\S)\*(?!\w)|`_?_?")
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


def read_manpage(path: Path) -> str:
    data = gzip.open(path).read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("gb18030", errors="replace")


def documents(corpus: str) -> Iterator[str]:
    if corpus == "zh-manpages":
        pages = sorted(MANPAGES.glob("man*/*.gz"))
        texts = (manpage_text(read_manpage(p)) for p in pages)
    else:
        pages = sorted(PYDOCS.rglob("*.rst.txt"))
        texts = (rst_text(p.read_text(encoding="utf-8")) for p in pages)
    if not pages:
        raise SystemExit(f"no pages under {MANPAGES if corpus == 'zh-manpages' else PYDOCS}: "
                         "apt-get install manpages-zh python3-doc")
    return (text for text in texts if text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", choices=["zh-manpages", "en-pydocs"])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    docs = list(documents(args.corpus))
    text = "\n\n".join(docs) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {len(docs)} documents, {len(text):,} characters, {len(HAN.findall(text)):,} Han")


if __name__ == "__main__":
    main()
