# One image for the API and the worker. CPU by default; CUDA with
#   docker build --build-arg VARIANT=cuda -t enclave:cuda .
ARG VARIANT=cpu
FROM python:3.11-slim AS base-cpu
ENV TORCH_INDEX=https://download.pytorch.org/whl/cpu

FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 AS base-cuda
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* && ln -sf /usr/bin/python3.11 /usr/local/bin/python
ENV TORCH_INDEX=https://download.pytorch.org/whl/cu124

FROM base-${VARIANT} AS final
# Optional extras of the project, e.g. "[monitoring]" for the Flower image.
ARG EXTRAS=""
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN python -m pip install --upgrade pip && python -m pip install --index-url "$TORCH_INDEX" "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY service ./service
COPY worker ./worker
COPY enclave ./enclave
COPY migrations ./migrations
# The bundled public datasets the admin's audits run on (service/audits.py): the installed
# package cannot find them beside itself, so their folder is named here.
COPY examples ./examples
ENV ENCLAVE_EXAMPLES_DIR=/app/examples
RUN python -m pip install ".${EXTRAS}"
RUN useradd --create-home enclave
USER enclave
EXPOSE 8000
CMD ["enclave", "api", "--host", "0.0.0.0", "--port", "8000"]
