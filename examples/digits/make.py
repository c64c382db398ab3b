"""Write the bundled handwritten-digits sample (examples/digits/digits.npz) from the copy
that ships inside scikit-learn (``sklearn.datasets.load_digits``: no download).

The file is committed; this script documents how it was made and reproduces it byte for
byte (fixed zip timestamps, arrays in a fixed order):

    .venv/bin/python examples/digits/make.py

``digits.npz`` holds ``images`` (1797 × 8 × 8 uint8, values 0–16: the count of set pixels
in each 4 × 4 block of the original 32 × 32 bitmaps) and ``labels`` (1797 uint8, the digit
0–9), in scikit-learn's order.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent
OUT = HERE / "digits.npz"


def digits_arrays() -> dict[str, np.ndarray]:
    """The images and labels, as the schema (schema.yaml) describes them."""
    bunch = load_digits()
    images = np.asarray(bunch.images)
    if not (np.array_equal(images, np.round(images)) and images.min() >= 0 and images.max() <= 16):
        raise ValueError("scikit-learn's digits are no longer integers in [0, 16]")
    return {
        "images": images.astype(np.uint8),
        "labels": np.asarray(bunch.target).astype(np.uint8),
    }


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An .npz as numpy.savez_compressed writes it, but with a fixed timestamp per member
    (numpy stamps the current time), so the bytes depend on the arrays alone."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, array in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def main() -> None:
    write_npz(OUT, digits_arrays())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
