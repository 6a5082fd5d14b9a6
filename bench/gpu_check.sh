#!/usr/bin/env bash
# CosyVoice2 at scale on one GPU, in one command, under 7 minutes on an H200:
#
#   bench/gpu_check.sh [--quick] [more bench.cosyvoice2_scale options]
#   PYTHON=/path/to/venv/bin/python bench/gpu_check.sh
#
# Writes a model directory with the released CosyVoice2-0.5B sizes and RANDOM weights to a temp dir (speed does
# not depend on the weights), then prints tables: batched vs one-by-one LM steps, token2wav chunk cost along an
# utterance and batched, flow estimator latency torch vs TensorRT fp16 at 1/4/8/16 streams (with the fp16
# engine's SNR against torch fp32), and 1/4/8/16 concurrent streams of 250 speech tokens each through the real
# scheduler: first-chunk latency p50/p95, aggregate real-time factor and the mean LM batch (batched only, for time;
# bench.cosyvoice2_scale without --no-serial also runs one request at a time).
#
# It needs a CUDA build of torch and transformers in the Python it is given ($PYTHON, else python3), and TensorRT (the
# `trt` extra) for the TensorRT rows, which are skipped without it. Where `.whl/` holds wheels (bench/gpu_wheels.sh
# makes them on a CPU machine: rtvoice and what the engine imports beyond torch), they are installed first into
# /tmp/site, without the network, so a bare GPU machine with torch runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

"$PY" - <<'PYEOF'
import sys
try:
    import torch, transformers
except ImportError as error:
    sys.exit(f"gpu_check: {error}; give a Python with rtvoice's cosyvoice extra in PYTHON=...")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device (a CPU build, or no driver/GPU). "
             "Use a CUDA build of torch on a GPU machine; on a CPU, run: python -m bench.cosyvoice2_scale --tiny")
try:
    import tensorrt
    trt = f"TensorRT {tensorrt.__version__}"
except ImportError:
    trt = "no TensorRT (the TensorRT rows will be skipped; pip install -e '.[trt]')"
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}, {trt}", flush=True)
PYEOF

# The bench keeps to its own budget (sections that would overrun are skipped and say so; each engine level gets its
# own share of what is left, so a slow level cannot starve the next); the timeout is a backstop. Under 7 minutes in
# all: the model directory is written first (about 30 s), then 330 s of sections.
export RTVOICE_BENCH_BUDGET_S="${RTVOICE_BENCH_BUDGET_S:-330}"
exec timeout --signal=INT 400 "$PY" -m bench.cosyvoice2_scale --device cuda --no-serial "$@"
