"""Write the bundled wine sample (examples/wine/wine.data.gz) from the copy that ships
inside scikit-learn (``sklearn.datasets.load_wine``: no download).

The file is committed; this script documents how it was made and reproduces it byte for
byte (gzip with no name and a zero timestamp; each value as Python prints the float, the
way UCI's wine.data writes it):

    .venv/bin/python examples/wine/make.py

``wine.data.gz`` is UCI's wine.data with a header row: ``class`` (the cultivar, 1, 2 or 3:
scikit-learn's class_0, class_1, class_2) then the 13 measurements, 178 rows in
scikit-learn's order.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_wine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/reproducible.py (script or loaded by path)
from reproducible import write_sample  # noqa: E402

OUT = HERE / "wine.data.gz"
COLUMNS = [
    "alcohol",
    "malic_acid",
    "ash",
    "alcalinity_of_ash",
    "magnesium",
    "total_phenols",
    "flavanoids",
    "nonflavanoid_phenols",
    "proanthocyanins",
    "color_intensity",
    "hue",
    "od280_od315",
    "proline",
]
"""scikit-learn's feature names, in its order (its ``od280/od315_of_diluted_wines``
shortened)."""


def wine_text() -> str:
    """The CSV: a header, then ``class`` (1-3) and the 13 values of each row."""
    bunch = load_wine()
    data, target = np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target)
    if data.shape != (178, len(COLUMNS)) or set(target.tolist()) != {0, 1, 2}:
        raise ValueError("scikit-learn's wine data no longer has 178 rows of 13 values, 3 classes")
    lines = [",".join(["class", *COLUMNS])]
    for label, row in zip(target.tolist(), data.tolist(), strict=True):
        lines.append(",".join([str(label + 1), *(repr(v) for v in row)]))
    return "\n".join(lines) + "\n"


def main() -> None:
    write_sample(OUT, wine_text)


if __name__ == "__main__":
    main()
