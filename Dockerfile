# rtvoice server image. CPU by default; for NVIDIA GPUs pass a CUDA base, e.g.
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04 --build-arg EXTRAS=cosyvoice,trt .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG EXTRAS=""
ARG TORCH_SPEC="torch==2.13.0"
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 RTVOICE_HOST=0.0.0.0 RTVOICE_PORT=8000

RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
      && rm -rf /var/lib/apt/lists/*; fi \
 && python3 -m venv /opt/rtvoice
ENV PATH=/opt/rtvoice/bin:$PATH

WORKDIR /srv/rtvoice
COPY pyproject.toml README.md ./
COPY app ./app
COPY engine ./engine
COPY web ./web
RUN pip install --upgrade pip \
 && if [ -n "$EXTRAS" ]; then pip install "$TORCH_SPEC" && pip install -e ".[$EXTRAS]"; else pip install -e .; fi

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s CMD python3 -c \
  "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz').status != 200)"
CMD ["rtvoice", "serve"]
