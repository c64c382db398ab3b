"""Image datasets (issue 20): the public schema (service/datasets/images.py), the readers
of every source format and the check report (worker/images.py), on tiny files written
here, and the bundled digits sample (examples/digits/)."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import yaml
from PIL import Image
from pydantic import ValidationError

from service.datasets.images import ImageSchema, encode_pixels
from worker.image_arrays import CifarUnpickler, read_idx
from worker.image_types import (
    ABOVE_MAX,
    BAD_NAME,
    EXAMPLES,
    MISSING_FILE,
    MISSING_LABEL,
    NO_CLASS_FOLDER,
    NOT_FINITE,
    REPEATED,
    TOO_LARGE,
    UNKNOWN_LABEL,
    UNREADABLE,
    WRONG_CHANNELS,
    WRONG_SIZE,
    ImageReadError,
    max_image_file_bytes,
)
from worker.images import check_images

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"


def schema(source: dict[str, Any], **fields: Any) -> ImageSchema:
    data: dict[str, Any] = {
        "name": "imgs",
        "kind": "images",
        "height": 4,
        "width": 3,
        "channels": 1,
        "classes": ["cat", "dog"],
        "pixels": {"max": 255},
        "source": source,
    }
    data.update(fields)
    return ImageSchema.model_validate(data)


def images(n: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """n distinct (C, 4, 3) uint8 images."""
    return np.random.default_rng(seed).integers(0, 256, (n, channels, 4, 3), dtype=np.uint8)


def save_png(path: Path, chw: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    hwc = np.moveaxis(chw, 0, -1)
    Image.fromarray(hwc[..., 0] if hwc.shape[-1] == 1 else hwc).save(path)


# --- the schema -----------------------------------------------------------------------


def test_the_encoded_width_is_height_width_channels() -> None:
    s = schema({"format": "folders"}, channels=3, height=5, width=7)
    assert s.n_features == 5 * 7 * 3 and s.shape == (3, 5, 7) and s.n_classes == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"classes": ["only"]}, "at least 2"),
        ({"classes": ["a", "a"]}, "duplicate class names"),
        ({"channels": 2}, "Input should be 1 or 3"),
        ({"pixels": {"min": 5, "max": 5}}, "min must be < max"),
        ({"height": 0}, "greater than or equal to 1"),
        ({"height": 4096, "width": 4096, "channels": 3}, "exceeds"),
        ({"source": {"format": "tiff"}}, "does not match any of the expected tags"),
        ({"source": {"format": "npz", "layout": "nhw"}, "channels": 3}, "no channel axis"),
        ({"source": {"format": "idx", "images": "../x"}}, "not a plain file name"),
        ({"source": {"format": "cifar", "batches": [".."]}}, "not a plain file name"),
        ({"source": {"format": "cifar", "batches": ["a", "a"]}}, "duplicate file names"),
        ({"classes": ["a", "../b"]}, "cannot be a folder name"),
        ({"source": {"format": "csv", "file_column": "x", "label_column": "x"}}, "must differ"),
        ({"colour": True}, "Extra inputs are not permitted"),
    ],
)
def test_bad_schemas_are_refused_with_a_reason(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        schema(change.pop("source", {"format": "folders"}), **change)


def test_encoding_clips_and_scales_by_the_declared_range_alone() -> None:
    s = schema({"format": "folders"}, pixels={"min": 10, "max": 20})
    raw = np.full((2, 1, 4, 3), 15.0)
    raw[0, 0, 0, 0], raw[1, 0, 0, 0] = 5.0, 99.0
    x = encode_pixels(s, raw)
    assert x.dtype == np.float32 and x[0, 0, 0, 0] == 0.0 and x[1, 0, 0, 0] == 1.0
    assert np.all(x[:, 0, 1:] == 0.5)
    with pytest.raises(ValueError, match="expected"):
        encode_pixels(s, raw[:, :, :2])


# --- readers: each format read back exactly ------------------------------------------


def test_a_folder_per_class_of_pngs_reads_back_exactly(tmp_path: Path) -> None:
    imgs = images(5)
    labels = ["cat", "dog", "dog", "cat", "dog"]
    for i, (img, label) in enumerate(zip(imgs, labels, strict=True)):
        save_png(tmp_path / label / f"{i}.png", img)
    got = check_images(schema({"format": "folders"}), tmp_path)
    order = [0, 3, 1, 2, 4]  # cat/0, cat/3, dog/1, dog/2, dog/4
    assert got.names == [f"{labels[i]}/{i}.png" for i in order]
    assert np.array_equal(got.pixels, imgs[order]) and got.pixels.dtype == np.uint8
    assert got.y.tolist() == [0, 0, 1, 1, 1]
    assert got.report.per_class == {"cat": 2, "dog": 3} and got.report.rejected == {}


def test_rgb_and_16_bit_pngs_and_jpegs(tmp_path: Path) -> None:
    rgb = images(2, channels=3)
    for i, img in enumerate(rgb):
        save_png(tmp_path / "rgb" / ["cat", "dog"][i] / f"{i}.png", img)
    got = check_images(schema({"format": "folders"}, channels=3), tmp_path / "rgb")
    assert got.pixels.shape == (2, 3, 4, 3) and np.array_equal(got.pixels, rgb)

    deep = np.arange(12, dtype=np.uint16).reshape(1, 4, 3) * 5000
    (tmp_path / "deep" / "cat").mkdir(parents=True)
    Image.fromarray(deep[0]).save(tmp_path / "deep" / "cat" / "a.png")
    got = check_images(schema({"format": "folders"}, pixels={"max": 65535}), tmp_path / "deep")
    assert np.array_equal(got.pixels[0], deep) and got.pixels.dtype.itemsize >= 2

    (tmp_path / "jpg" / "dog").mkdir(parents=True)
    flat = np.full((4, 3), 200, dtype=np.uint8)  # a flat block survives JPEG's rounding
    Image.fromarray(flat).save(tmp_path / "jpg" / "dog" / "a.jpg", quality=95)
    got = check_images(schema({"format": "folders"}), tmp_path / "jpg")
    assert got.y.tolist() == [1] and np.abs(got.pixels[0, 0].astype(int) - 200).max() <= 2


def test_a_folder_with_a_labels_csv_reads_back_exactly(tmp_path: Path) -> None:
    imgs = images(3)
    for i, img in enumerate(imgs):
        save_png(tmp_path / "sub" / f"img{i}.png", img)
    (tmp_path / "labels.csv").write_text("file,label\nsub/img2.png,dog\nsub/img0.png,cat\n")
    got = check_images(schema({"format": "csv"}), tmp_path)
    assert got.names == ["sub/img2.png", "sub/img0.png"]  # the CSV's order; img1 unlisted
    assert np.array_equal(got.pixels, imgs[[2, 0]]) and got.y.tolist() == [1, 0]

    (tmp_path / "idx.tsv").write_text("name\tk\nsub/img1.png\t1\n")
    src = {
        "format": "csv",
        "labels_file": "idx.tsv",
        "separator": "\t",
        "file_column": "name",
        "label_column": "k",
        "label_values": "index",
    }
    got = check_images(schema(src), tmp_path)
    assert np.array_equal(got.pixels, imgs[[1]]) and got.y.tolist() == [1]


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "nhw"])
def test_npz_in_each_layout_reads_back_exactly(tmp_path: Path, layout: str) -> None:
    chw = images(4)
    stored = {"nchw": chw, "nhwc": np.moveaxis(chw, 1, -1), "nhw": chw[:, 0]}[layout]
    np.savez_compressed(tmp_path / "d.npz", x=stored, y=np.array(["dog", "cat", "cat", "dog"]))
    src = {"format": "npz", "images": "x", "labels": "y", "layout": layout}
    got = check_images(schema(src), tmp_path / "d.npz")
    assert np.array_equal(got.pixels, chw) and got.y.tolist() == [1, 0, 0, 1]
    assert got.names[0] == "d.npz[0]"


def test_npz_float_pixels_and_index_labels(tmp_path: Path) -> None:
    x = np.random.default_rng(1).random((3, 1, 4, 3)).astype(np.float32)
    np.savez(tmp_path / "f.npz", images=x, labels=np.array([1, 0, 1], dtype=np.int64))
    src = {"format": "npz", "layout": "nchw", "label_values": "index"}
    got = check_images(schema(src, pixels={"max": 1}), tmp_path / "f.npz")
    assert np.array_equal(got.pixels, x) and got.y.tolist() == [1, 0, 1]
    assert np.array_equal(encode_pixels(schema(src, pixels={"max": 1}), got.pixels), x)


def write_idx(path: Path, array: np.ndarray, *, compress: bool = False) -> None:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}
    head = bytes([0, 0, codes[array.dtype], array.ndim])
    raw = head + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(raw, mtime=0) if compress else raw)


@pytest.mark.parametrize("compress", [False, True])
def test_idx_files_raw_and_gzipped_read_back_exactly(tmp_path: Path, compress: bool) -> None:
    imgs = images(6)
    labels = np.array([0, 1, 1, 0, 1, 1], dtype=np.uint8)
    write_idx(tmp_path / "im", imgs[:, 0], compress=compress)
    write_idx(tmp_path / "lb", labels, compress=compress)
    got = check_images(schema({"format": "idx", "images": "im", "labels": "lb"}), tmp_path)
    assert np.array_equal(got.pixels, imgs) and got.y.tolist() == labels.tolist()
    wide = np.arange(6, dtype=">i4").reshape(2, 3)
    write_idx(tmp_path / "wide", wide, compress=compress)
    assert read_idx(tmp_path / "wide").tolist() == [[0, 1, 2], [3, 4, 5]]


class _Py2Pickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """Writes every str and bytes as a Python 2 str (BINSTRING), with numpy's module path
    as Python 2's numpy named it: the bytes of CIFAR's own batches, written in Python 2."""

    def save_py2_str(self, obj: str | bytes) -> None:
        raw = obj.encode("latin-1") if isinstance(obj, str) else obj
        n = len(raw)
        short = n < 256
        self.write(pickle.SHORT_BINSTRING + bytes([n]) if short else pickle.BINSTRING)
        self.write(raw if short else struct.pack("<i", n) + raw)
        self.memoize(obj)

    def save_global(self, obj: Any, name: str | None = None) -> None:
        module = getattr(obj, "__module__", "")
        if module == "numpy._core.multiarray":
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n" + obj.__name__.encode() + b"\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)

    dispatch: ClassVar[dict[type, Any]] = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]
    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def cifar_batch(data: np.ndarray, labels: list[int], *, protocol: int | str = 2) -> bytes:
    batch = {b"batch_label": b"test", b"labels": labels, b"data": data, b"filenames": [b"a"]}
    if protocol == "py2":
        buf = io.BytesIO()
        _Py2Pickler(buf, protocol=2).dump({k.decode(): v for k, v in batch.items()})
        raw = buf.getvalue()
        assert b"numpy.core.multiarray" in raw and b"_codecs" not in raw
        return raw
    assert isinstance(protocol, int)
    return pickle.dumps(batch, protocol=protocol)


@pytest.mark.parametrize("protocol", [2, 4, 5, "py2"])
def test_cifar_batches_read_back_exactly(tmp_path: Path, protocol: int | str) -> None:
    imgs = images(5, channels=3)
    rows = imgs.reshape(5, -1)  # channel-major rows, as CIFAR stores them
    (tmp_path / "b1").write_bytes(cifar_batch(rows[:3], [1, 0, 1], protocol=protocol))
    (tmp_path / "b2").write_bytes(cifar_batch(rows[3:], [0, 0], protocol=protocol))
    s = schema({"format": "cifar", "batches": ["b1", "b2"]}, channels=3)
    got = check_images(s, tmp_path)
    assert np.array_equal(got.pixels, imgs) and got.y.tolist() == [1, 0, 1, 0, 0]
    assert got.names == ["b1[0]", "b1[1]", "b1[2]", "b2[0]", "b2[1]"]


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


class _Allocate:
    def __reduce__(self) -> tuple[Any, ...]:
        return (np.ndarray, ((1 << 40,),))


def test_a_malicious_pickle_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = pickle.dumps({b"data": _Exploit(marker), b"labels": [0]}, protocol=2)
    assert "system" in str(evil)
    (tmp_path / "b").write_bytes(evil)
    s = schema({"format": "cifar", "batches": ["b"]}, channels=3)
    with pytest.raises(ImageReadError, match=r"refused: the pickle asks for posix\.system"):
        check_images(s, tmp_path)
    assert not marker.exists()
    # The same bytes through the standard unpickler would have run the command.
    pickle.loads(evil)
    assert marker.exists()
    # numpy names are allowed only as numpy's own array pickle uses them.
    (tmp_path / "b").write_bytes(pickle.dumps({b"data": _Allocate()}, protocol=2))
    with pytest.raises(ImageReadError, match="not a CIFAR batch"):
        check_images(s, tmp_path)
    # BUILD cannot set attributes on the stand-ins (which would outlive this load).
    for target in (b"cnumpy\nndarray\n", b"cnumpy._core.multiarray\n_reconstruct\n"):
        (tmp_path / "b").write_bytes(target + b"(N}X\x05\x00\x00\x00pwnedK\x01stb.")
        with pytest.raises(ImageReadError, match=r"not a CIFAR batch \(AttributeError\)"):
            check_images(s, tmp_path)
        assert not hasattr(CifarUnpickler(io.BytesIO(target + b".")).load(), "pwned")
    with pytest.raises(pickle.UnpicklingError, match=r"builtins\.eval"):
        CifarUnpickler(io.BytesIO(b"cbuiltins\neval\n.")).load()


# --- the check report -----------------------------------------------------------------


def test_the_report_counts_each_problem_with_the_first_names(tmp_path: Path) -> None:
    good = images(8)
    for i in range(8):
        save_png(tmp_path / "cat" / f"ok{i}.png", good[i])
    for i in range(7):
        save_png(tmp_path / "dog" / f"big{i}.png", np.zeros((1, 5, 3), dtype=np.uint8))
    save_png(tmp_path / "dog" / "rgb.png", images(1, channels=3)[0])
    (tmp_path / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (tmp_path / "dog" / "notes.txt").write_text("hello")
    png = (tmp_path / "cat" / "ok0.png").read_bytes()
    (tmp_path / "dog" / "cut.png").write_bytes(png[: len(png) // 2])
    with (tmp_path / "dog" / "huge.png").open("wb") as fh:
        fh.truncate(max_image_file_bytes(schema({"format": "folders"})) + 1)
    save_png(tmp_path / "bird" / "b.png", good[0])
    (tmp_path / "stray.png").write_bytes(png)

    report = check_images(schema({"format": "folders"}), tmp_path).report
    assert report.images_in == 8 + 7 + 1 + 3 + 1 + 1 + 1
    assert report.images_kept == 8
    assert report.rejected == {
        NO_CLASS_FOLDER: 1,
        UNKNOWN_LABEL: 1,
        WRONG_SIZE: 7,
        UNREADABLE: 3,  # broken.png, cut.png, notes.txt
        TOO_LARGE: 1,
        WRONG_CHANNELS: 1,
    }
    assert report.examples[WRONG_SIZE] == tuple(f"dog/big{i}.png (5×3)" for i in range(EXAMPLES))
    assert report.examples[UNKNOWN_LABEL] == ("bird/b.png (label 'bird')",)
    assert report.examples[WRONG_CHANNELS] == ("dog/rgb.png (mode RGB)",)
    assert report.per_class == {"cat": 8, "dog": 0} and report.empty_classes == ["dog"]
    lines = report.lines()
    assert lines[0] == "8 images kept of 22 (14 rejected)"
    assert lines[1].startswith("  rejected, wrong size: 7 (first: dog/big0.png (5×3), ")
    assert lines[2].startswith("  rejected, unreadable file: 3 (first: ")  # most first
    assert lines[-1] == "  empty class(es), no image kept: dog"


def test_labels_csv_problems(tmp_path: Path) -> None:
    save_png(tmp_path / "a.png", images(1)[0])
    save_png(tmp_path / "b.png", images(1)[0])
    (tmp_path / "labels.csv").write_text(
        "file,label\na.png,cat\na.png,dog\n../x.png,cat\n/etc/passwd,cat\nnone.png,cat\n"
        "b.png,\n,cat\n"
    )
    got = check_images(schema({"format": "csv"}), tmp_path)
    assert got.report.images_kept == 0
    assert got.report.rejected == {REPEATED: 2, BAD_NAME: 3, MISSING_FILE: 1, MISSING_LABEL: 1}
    assert got.report.hint is not None
    (tmp_path / "labels.csv").write_text("name,label\na.png,cat\n")
    with pytest.raises(ImageReadError, match="no column 'file'"):
        check_images(schema({"format": "csv"}), tmp_path)


def test_pixel_rules_reject_or_clip(tmp_path: Path) -> None:
    x = np.full((4, 1, 4, 3), 0.5)
    x[1, 0, 0, 0] = np.nan
    x[2, 0, 1, 1] = 1.5
    x[3, 0, 2, 2] = -0.25
    np.savez(tmp_path / "p.npz", images=x, labels=np.array(["cat"] * 4))
    src = {"format": "npz", "layout": "nchw"}
    reject = check_images(schema(src, pixels={"max": 1}), tmp_path / "p.npz").report
    assert reject.rejected == {NOT_FINITE: 1, ABOVE_MAX: 1, "pixel below min": 1}
    clip = check_images(schema(src, pixels={"max": 1, "on_invalid": "clip"}), tmp_path / "p.npz")
    assert clip.report.rejected == {NOT_FINITE: 1} and clip.report.clipped == 2
    assert "  clipped to the declared pixel range: 2 images" in clip.report.lines()
    encoded = encode_pixels(schema(src, pixels={"max": 1}), clip.pixels)
    assert encoded.min() == 0.0 and encoded.max() == 1.0


def test_unknown_labels_by_name_and_by_index(tmp_path: Path) -> None:
    np.savez(tmp_path / "l.npz", images=images(4)[:, 0], labels=np.array([0, 1, 2, -1]))
    by_index = schema({"format": "npz", "layout": "nhw", "label_values": "index"})
    got = check_images(by_index, tmp_path / "l.npz")
    assert got.y.tolist() == [0, 1] and got.report.rejected == {UNKNOWN_LABEL: 2}
    by_name = schema({"format": "npz", "layout": "nhw"}, classes=["1", "2"])
    got = check_images(by_name, tmp_path / "l.npz")
    assert got.y.tolist() == [0, 1] and got.names == ["l.npz[1]", "l.npz[2]"]


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (
            lambda p: np.savez(p, images=np.zeros((2, 5, 3)), labels=np.zeros(2)),
            r"shape \(2, 5, 3\)",
        ),
        (lambda p: np.savez(p, images=np.zeros((2, 4, 3))), "no array 'labels'"),
        (lambda p: np.savez(p, images=np.zeros((2, 4, 3)), labels=np.zeros(3)), "one per image"),
        (lambda p: p.write_bytes(b"PK\x03\x04 not a zip"), "cannot read"),
        (
            lambda p: np.savez(
                p, images=np.zeros((1, 4, 3)), labels=np.array([{"a": 1}], dtype=object)
            ),
            "cannot read",
        ),
    ],
)
def test_unusable_npz_files_are_one_line(tmp_path: Path, write: Any, message: str) -> None:
    path = tmp_path / "x.npz"
    write(path)
    with pytest.raises(ImageReadError, match=message):
        check_images(schema({"format": "npz", "layout": "nhw"}), path)


def test_unusable_idx_files_are_one_line(tmp_path: Path) -> None:
    s = schema({"format": "idx", "images": "im", "labels": "lb"})
    write_idx(tmp_path / "lb", np.zeros(2, dtype=np.uint8))
    (tmp_path / "im").write_bytes(b"\x00\x00\x08\x03" + struct.pack(">3I", 2, 4, 3) + b"\0" * 5)
    with pytest.raises(ImageReadError, match="truncated"):
        check_images(s, tmp_path)
    write_idx(tmp_path / "im", np.zeros((2, 4, 3), dtype=np.uint8))
    with (tmp_path / "im").open("ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ImageReadError, match="bytes after"):
        check_images(s, tmp_path)
    (tmp_path / "im").write_bytes(b"GIF89a")
    with pytest.raises(ImageReadError, match="bad magic"):
        check_images(s, tmp_path)
    huge = b"\x00\x00\x08\x03" + struct.pack(">3I", 1 << 30, 4, 3)
    (tmp_path / "im").write_bytes(gzip.compress(huge))
    with pytest.raises(ImageReadError, match="GiB limit"):
        check_images(s, tmp_path)
    write_idx(tmp_path / "im", np.zeros((2, 5, 3), dtype=np.uint8))
    with pytest.raises(ImageReadError, match=r"shape \(2, 5, 3\)"):
        check_images(s, tmp_path)
    with pytest.raises(ImageReadError, match="has no file"):
        check_images(schema({"format": "idx", "images": "nope", "labels": "lb"}), tmp_path)


def test_cifar_rows_of_the_wrong_length(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(cifar_batch(np.zeros((2, 10), dtype=np.uint8), [0, 1]))
    s = schema({"format": "cifar", "batches": ["b"]}, channels=3)
    with pytest.raises(ImageReadError, match="rows of 10 values"):
        check_images(s, tmp_path)


# --- the bundled digits ---------------------------------------------------------------


def test_the_bundled_digits_load_with_their_schema() -> None:
    from sklearn.datasets import load_digits

    s = ImageSchema.model_validate(yaml.safe_load((DIGITS / "schema.yaml").read_text()))
    got = check_images(s, DIGITS / "digits.npz")
    bunch = load_digits()
    assert got.report.images_kept == 1797 and got.report.rejected == {}
    assert s.n_features == 64 and s.classes == [str(d) for d in range(10)]
    assert np.array_equal(got.pixels[:, 0], bunch.images) and np.array_equal(got.y, bunch.target)
    assert np.allclose(encode_pixels(s, got.pixels).reshape(1797, 64), bunch.data / 16)


def test_the_digits_script_reproduces_the_file(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_digits", DIGITS / "make.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_npz(tmp_path / "d.npz", module.digits_arrays())
    assert (tmp_path / "d.npz").read_bytes() == (DIGITS / "digits.npz").read_bytes()
