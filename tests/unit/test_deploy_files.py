"""docker-compose.yml and the Dockerfile keep the trust boundary (no Docker engine runs
here; `.ci/run` also runs `docker-compose config` when the tool is installed)."""

from __future__ import annotations

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


def test_worker_reserves_a_gpu_and_the_image_has_a_cuda_variant() -> None:
    worker = _compose()["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert worker["build"]["args"]["VARIANT"] == "cuda"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "ARG VARIANT=cpu" in dockerfile and "base-cuda" in dockerfile
    assert "torch==2.13.0" in dockerfile
