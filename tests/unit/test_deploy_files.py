"""docker-compose.yml and the Dockerfile keep the trust boundary (no Docker engine runs
here; `.ci/run` also runs `docker-compose config` when the tool is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_has_the_production_services() -> None:
    services = _compose()["services"]
    assert {"api", "worker", "postgres", "redis", "migrate"} <= set(services)
    for name in ("api", "worker"):
        env = services[name]["environment"]
        assert env["ENCLAVE_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["ENCLAVE_BROKER_URL"].startswith("redis://")


def test_private_data_is_mounted_only_into_the_worker() -> None:
    services = _compose()["services"]
    mounts = {
        name: [str(v).split(":")[0] for v in svc.get("volumes", [])]
        for name, svc in services.items()
    }
    holders = [name for name, vols in mounts.items() if "private-data" in vols]
    assert holders == ["worker"]
    assert "ports" not in services["worker"]  # the worker listens on nothing


def test_the_gpu_is_an_override_and_the_image_has_a_cuda_variant() -> None:
    """The base file runs anywhere (CPU); docker-compose.gpu.yml reserves a GPU for the
    worker only and builds it from the CUDA image."""
    base = _compose()["services"]
    assert all("deploy" not in svc for svc in base.values())
    gpu = yaml.safe_load((REPO / "docker-compose.gpu.yml").read_text())["services"]
    assert set(gpu) == {"worker"}
    devices = gpu["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert gpu["worker"]["build"]["args"]["VARIANT"] == "cuda"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "ARG VARIANT=cpu" in dockerfile and "base-cuda" in dockerfile
    assert "torch==2.13.0" in dockerfile


def test_flower_is_optional_and_sees_no_private_data() -> None:
    services = _compose()["services"]
    flower = services["flower"]
    assert flower["profiles"] == ["monitoring"]  # not started by a plain `up`
    assert "volumes" not in flower  # neither the private data nor the releases
    assert all(p.startswith("127.0.0.1:") for p in flower["ports"])
    assert flower["build"]["args"]["EXTRAS"] == "[monitoring]"
    assert 'ARG EXTRAS=""' in (REPO / "Dockerfile").read_text()


def test_the_image_carries_the_bundled_datasets_and_names_their_folder(tmp_path: Path) -> None:
    """The installed package's parent folder is site-packages, not the repository: the
    image copies examples/ and ENCLAVE_EXAMPLES_DIR points the audits at it."""
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "COPY examples ./examples" in dockerfile
    assert "ENV ENCLAVE_EXAMPLES_DIR=/app/examples" in dockerfile
    assert "WORKDIR /app" in dockerfile
    code = "from service.audits import PUBLIC_DATASETS as P; print(P['adult'].folder)"
    env = {**os.environ, "ENCLAVE_EXAMPLES_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(tmp_path / "adult")
