# rtvoice server image: the embedded Piper voice, on a CPU, by default.
#
#   docker build -t rtvoice .
#   docker build -t rtvoice-cosyvoice --build-arg EXTRAS=cosyvoice .     # + CosyVoice2, CPU torch
#
# For NVIDIA GPUs pass a CUDA base and a CUDA build of torch, e.g.
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04 --build-arg EXTRAS=cosyvoice,trt \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 .
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A CUDA base has no Python: take the distribution's (its versions are the base image's to pin).
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; fi \
 && python3 -m venv /opt/rtvoice
ENV PATH=/opt/rtvoice/bin:$PATH

# The wheel, built from the sources alone (as `pip install .` would).
FROM base AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY engine ./engine
COPY web ./web
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM base
ARG EXTRAS=""
# torch only with the cosyvoice extra, from PyTorch's own index: CPU wheels unless told otherwise
# (a bare `pip install torch` pulls a CUDA build of several GB).
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"
COPY --from=wheel /wheels /wheels
# rtvoice is the wheel built above; its dependencies follow pyproject.toml's ranges.
# hadolint ignore=DL3013
RUN if [ -n "$EXTRAS" ]; then pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"; fi \
 && wheel="$(echo /wheels/rtvoice-*.whl)" \
 && pip install "${wheel}${EXTRAS:+[$EXTRAS]}" \
 && rm -rf /wheels

# Not root. Registered voices (and TensorRT engines, when the model directory is read-only) go to the data
# directory, a volume, so they outlive the container.
RUN groupadd --system --gid 10001 rtvoice \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/rtvoice rtvoice \
 && mkdir -p /var/lib/rtvoice && chown 10001:10001 /var/lib/rtvoice
ENV RTVOICE_HOST=0.0.0.0 RTVOICE_PORT=8000 RTVOICE_DATA_DIR=/var/lib/rtvoice
VOLUME ["/var/lib/rtvoice"]
USER 10001:10001
# Settings may also come from a .env mounted here.
WORKDIR /srv/rtvoice

EXPOSE 8000
# Healthy once /readyz answers 200 on the configured port (urlopen raises on 503 or no answer).
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s CMD ["python3", "-c", "import os, urllib.request as r; \
r.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('RTVOICE_PORT', '8000'), timeout=2)"]
CMD ["rtvoice", "serve"]
