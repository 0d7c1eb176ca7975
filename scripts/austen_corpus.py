"""Jane Austen's six novels as one plain text (public domain), for the second plain-text run of issue 53.

Debian's ``r-cran-janeaustenr`` (the R package janeaustenr, MIT; the novels' text from Project Gutenberg, public
domain) keeps the novels as R objects in a lazy-load database (``data/Rdata.rdb``, indexed by ``Rdata.rdx``): one
character vector per novel, a line of the printed book each. This reads them with ``rdata`` (PyPI, a reader
of R's serialisation; not a dependency of tcircuits) and writes them in the order they were published, a blank
line between two:

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb build/janeaustenr
    .venv/bin/pip install rdata
    .venv/bin/python scripts/austen_corpus.py build/janeaustenr/usr/lib/R/site-library/janeaustenr/data \\
        build/corpus/austen.txt

The text of 2026-12-07 (janeaustenr 1.0.0-1): 4,025,033 characters, 73,427 lines, SHA-256
887d811d970b962381ef54f0d0dde7d14e7ce7aa2c85fdef0a8a97a47e4390d0.
"""

from __future__ import annotations

import gzip
import hashlib
import sys
import zlib
from pathlib import Path

#: The novels by their names in janeaustenr, in the order they were published (1811-1817).
NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion")


def novels(folder: Path) -> dict[str, list[str]]:
    """Each novel's lines, read from the lazy-load database in ``folder``."""
    import rdata

    def read(raw: bytes):
        return rdata.conversion.convert(rdata.parser.parse_data(raw))

    index = read(gzip.decompress((folder / "Rdata.rdx").read_bytes()))["variables"]
    database = (folder / "Rdata.rdb").read_bytes()
    out = {}
    for name in NOVELS:
        offset, length = (int(v) for v in index[name])
        chunk = database[offset:offset + length]  # 4 bytes of the inflated length, then a zlib stream
        out[name] = [str(line) for line in read(zlib.decompress(chunk[4:]))]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0], "\nusage: austen_corpus.py JANEAUSTENR_DATA_FOLDER OUT.txt", file=sys.stderr)
        return 2
    read = novels(Path(argv[0]))
    text = "\n".join("\n".join(read[name]).strip("\n") + "\n" for name in NOVELS)  # a blank line between novels
    Path(argv[1]).write_text(text, encoding="utf-8")
    print(f"wrote {argv[1]}: {len(text):,} characters, {text.count(chr(10)):,} lines, "
          f"SHA-256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
