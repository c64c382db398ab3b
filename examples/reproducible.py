"""What the bundled samples' make.py scripts share: a gzip file whose bytes depend on its
text alone, so that each script reproduces its committed file byte for byte
(tests/unit/test_worker_audits.py checks wine, digits-table and icu3)."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path


def write_gzip(path: Path, text: str) -> None:
    """Gzip whose bytes depend on the text alone (no file name, timestamp 0)."""
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
    ):
        gz.write(text.encode("ascii"))


def write_sample(out: Path, text: Callable[[], str]) -> None:
    """A make.py's main: write ``text()`` to ``out`` and say so."""
    write_gzip(out, text())
    print(f"wrote {out}")
