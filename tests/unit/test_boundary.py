"""The trust boundary, checked on the source: the service never imports the enclave
runtime and never touches the private data volume."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN_IMPORTS = ("worker", "enclave", "torch", "opacus")


def _service_files() -> list[Path]:
    return sorted((REPO / "service").rglob("*.py"))


def test_service_never_imports_the_worker_or_torch() -> None:
    offenders = []
    for path in _service_files():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                if n.split(".")[0] in FORBIDDEN_IMPORTS:
                    offenders.append(f"{path.relative_to(REPO)}: {n}")
    assert offenders == []


def test_service_never_reads_the_data_volume() -> None:
    """Only config.py may name the data directory (to define the setting)."""
    offenders = [
        str(p.relative_to(REPO))
        for p in _service_files()
        if p.name != "config.py" and ("data_dir" in p.read_text() or "read_csv(" in p.read_text())
    ]
    assert offenders == []


def test_privacy_math_is_pure() -> None:
    for path in sorted((REPO / "service" / "privacy").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                assert (mod or "").split(".")[0] not in {"torch", "fastapi", "sqlalchemy"}, path
