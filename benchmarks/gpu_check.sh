#!/usr/bin/env bash
# The GPU check (issue 41) on a bare GPU machine, from the source tree, in one command (about 8 minutes).
#
# Prepare here, once per session (the folder is git-ignored; about 34 MiB):
#   bash benchmarks/gpu_check.sh --prepare
# Then on the device, with `.gpu` carried:
#   bash benchmarks/gpu_check.sh            # writes gpu_check.{md,json,jsonl} and logs.txt to $OUT
# A dry run anywhere (every step at a tiny size, on the CPU):
#   OUT=runs/gpu-check-dry PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh --tiny --device cpu
# Extra arguments go to benchmarks/gpu_check.py (--steps pgd,dfme reruns two steps).
# Issue 53's run, in its order, each step under its own limit, the whole under --budget seconds:
#   bash benchmarks/gpu_check.sh --plan 53 --budget 560   # pgd, certify, audit, labelonly, stn, table4, milli
#   OUT=runs/gpu-53-dry PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh --plan 53 --tiny --device cpu
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=.gpu
if [ "${1:-}" = "--prepare" ]; then
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  mkdir -p "$GPU_DIR/whl" "$GPU_DIR/data/fashion-mnist"
  cp /usr/share/datasets/fashion-mnist/*.gz "$GPU_DIR/data/fashion-mnist/"
  # what the device image lacks (its python3 is 3.12 with torch, numpy, scipy, click, httpx, tqdm, pytest)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$GPU_DIR/whl" fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 \
    typing-inspection==0.4.5 annotated-types==0.8.0 annotated-doc==0.0.7 uvicorn==0.54.0 \
    adversarial-robustness-toolbox==1.20.1 torchattacks==3.5.1 opentelemetry-api==1.45.2
  # the standard victims the steps use, trained here once (so no step spends its limit training one)
  mkdir -p "$GPU_DIR/cache/victims"
  for v in digits-conv2 fmnist-conv2 fmnist-conv2-gaussian0.5; do
    "${PYTHON:-.venv/bin/python}" -c "import sys; sys.path.insert(0, 'src'); from stealkit.victims import benchmark_recipe, \
robust_victim, standard_victim; v = sys.argv[1]; robust_victim(benchmark_recipe()) if v.endswith('0.5') \
else standard_victim(v)" "$v"
    cp -r "runs/victims/$v" "$GPU_DIR/cache/victims/"
  done
  git rev-parse --short HEAD > "$GPU_DIR/COMMIT"
  du -sh "$GPU_DIR"
  exit 0
fi
PYTHON="${PYTHON:-python3}"
if compgen -G "$GPU_DIR/whl/*.whl" > /dev/null && ! "$PYTHON" -c "import fastapi, art, torchattacks" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$GPU_DIR"/whl/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
[ -d "$GPU_DIR/data" ] && export STEALKIT_DATA="$PWD/$GPU_DIR/data"
[ -d "$GPU_DIR/cache" ] && export STEALKIT_CACHE="${STEALKIT_CACHE:-$PWD/$GPU_DIR/cache}"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 STEALKIT_CACHE="${STEALKIT_CACHE:-/tmp/stealkit-cache}"
OUT="${OUT:-runs/gpu-check}"
exec "$PYTHON" benchmarks/gpu_check.py --out "$OUT" "$@"
