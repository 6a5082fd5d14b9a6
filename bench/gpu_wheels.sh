#!/usr/bin/env bash
# Wheels for the GPU machine, made here on the CPU machine: bench/gpu_check.sh installs them there.
#
#   bench/gpu_wheels.sh            # writes .whl/ (ignored by git), at most 60 MiB
#
# The GPU machine has Python 3.12 with torch, transformers, onnxruntime, numpy, safetensors, tokenizers, pyyaml,
# prometheus-client, httpx, grpcio and protobuf, no network, and nothing else (docs/decisions.md). This downloads,
# for that Python, the wheels of every other package the bench imports through the engine, at the versions this
# checkout's .venv runs, and builds rtvoice itself as a wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_PY="${VENV_PY:-.venv/bin/python}"
OUT="${OUT_DIR:-.whl}"
LIMIT_MIB=60
# What the engine imports that the GPU machine lacks (transformers needs soundfile, and soundfile cffi), with what
# they need in turn.
NAMES=(pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-extensions typing-inspection
  piper-tts rapidfuzz soxr soundfile cffi pycparser kaldi-native-fbank wetext kaldifst contractions textsearch
  anyascii pyahocorasick)

rm -rf "$OUT" && mkdir -p "$OUT"
pins=()
for name in "${NAMES[@]}"; do
  version=$("$VENV_PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") || {
    echo "gpu_wheels: $name is not installed in $VENV_PY (run make test-deps first)" >&2
    exit 2
  }
  pins+=("$name==$version")
done
"$VENV_PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$OUT" "${pins[@]}"
"$VENV_PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$OUT" .
size_mib=$(du -sm "$OUT" | cut -f1)
echo "gpu_wheels: $(ls "$OUT" | wc -l) wheels, ${size_mib} MiB in $OUT"
if [ "$size_mib" -gt "$LIMIT_MIB" ]; then
  echo "gpu_wheels: over ${LIMIT_MIB} MiB: a device call carries 64 MiB in all" >&2
  exit 1
fi
