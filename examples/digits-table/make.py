"""Write the bundled handwritten digits as a table (examples/digits-table/
digits-table.data.gz) from the copy that ships inside scikit-learn
(``sklearn.datasets.load_digits``: no download): the images of examples/digits, each
8 × 8 image one row of 64 numeric columns, row-major, then its digit.

The file is committed; this script documents how it was made and reproduces it byte for
byte (gzip with no name and a zero timestamp):

    .venv/bin/python examples/digits-table/make.py

``digits-table.data.gz``: a header (``pixel_0_0`` … ``pixel_7_7``, scikit-learn's feature
names, then ``digit``), then 1,797 rows of integers, in scikit-learn's order.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/reproducible.py (script or loaded by path)
from reproducible import write_sample  # noqa: E402

OUT = HERE / "digits-table.data.gz"
COLUMNS = [f"pixel_{r}_{c}" for r in range(8) for c in range(8)]


def digits_text() -> str:
    """The CSV: a header, then each image's 64 pixel counts (0-16) and its digit (0-9)."""
    bunch = load_digits()
    data, target = np.asarray(bunch.data), np.asarray(bunch.target)
    if data.shape != (1797, 64) or not np.array_equal(data, np.round(data)):
        raise ValueError("scikit-learn's digits are no longer 1,797 rows of 64 integers")
    if data.min() < 0 or data.max() > 16 or set(target.tolist()) != set(range(10)):
        raise ValueError("scikit-learn's digits are no longer counts 0-16 of 10 digits")
    lines = [",".join([*COLUMNS, "digit"])]
    for label, row in zip(target.tolist(), data.astype(np.int64).tolist(), strict=True):
        lines.append(",".join(str(v) for v in [*row, label]))
    return "\n".join(lines) + "\n"


def main() -> None:
    write_sample(OUT, digits_text)


if __name__ == "__main__":
    main()
