#!/usr/bin/env bash
# The papers' settings on one GPU (issues 42 and 43), one step per device call, resumable across calls.
#
#   bash benchmarks/gpu_check.sh --prepare                 # here, once: wheels + Fashion-MNIST into .gpu/
#   bash benchmarks/gpu_papers.sh stn                      # there (carry .gpu): one or more steps, comma-separated
#   bash benchmarks/gpu_papers.sh labelonly --tiny --device cpu   # a dry run of a step at a tiny size, anywhere
#
# Steps. Issue 42: stn (Li et al. Sec. 6 at n = 100k, 500 points, four sigmas), milli (Milli et al. Figures
# 2-4, Fashion-MNIST, three seeds), table4 (DFME Table 4, Fashion-MNIST, 50,000 distinct samples, the setting
# chosen on validation). Issue 43: labelonly (label-only data-free, default recipe, 100k-2M queries), probs
# (probabilities to 250k), codfe (CoDFe Figure 2 / Table 3 at 2M, DaST beside), transfer (Tables 1-2).
#
# Every step writes under $RUNS (default runs/gpu-papers) and stops itself before $LIMIT seconds (default 540,
# inside the device's 10-minute call). The machine starts bare each call, so the run folders travel: at the
# end (even after a stop at the limit) they are packed into $OUT/papers-state.tgz; copy that file to
# .gpu/papers-state.tgz and the next call unpacks it and resumes (reproduce keeps finished steps; extract
# codfe continues from its checkpoint, queries already paid are not paid again). Reports go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
steps="${1:?usage: gpu_papers.sh STEP[,STEP...] [--tiny] [--device D]}"
shift
tiny=0
device=cuda
while [ $# -gt 0 ]; do
  case "$1" in
    --tiny) tiny=1 ;;
    --device) [ $# -ge 2 ] || { echo "--device needs a value (cuda, cpu, cuda:N)" >&2; exit 2; }
              device="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
GPU_DIR=.gpu
PYTHON="${PYTHON:-python3}"
if compgen -G "$GPU_DIR/whl/*.whl" > /dev/null && ! "$PYTHON" -c "import fastapi" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$GPU_DIR"/whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
[ -d "$GPU_DIR/data" ] && export STEALKIT_DATA="$PWD/$GPU_DIR/data"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
RUNS="${RUNS:-runs/gpu-papers}"
OUT="${OUT:-$RUNS/out}"
LIMIT="${LIMIT:-540}"
export STEALKIT_CACHE="$RUNS/cache"
mkdir -p "$RUNS" "$OUT"
# the carried state is unpacked once per run folder: a second call in the same session (gpu_check.py --plan 53 runs
# one call per step) must not roll back what the first one advanced
if [ -f "$GPU_DIR/papers-state.tgz" ] && [ ! -f "$RUNS/.state-unpacked" ]; then
  tar -xzf "$GPU_DIR/papers-state.tgz" -C "$RUNS" && touch "$RUNS/.state-unpacked"
fi
# the victims prepared in .gpu/cache (gpu_check.sh --prepare), so no step spends its limit training one
if [ -d "$GPU_DIR/cache/victims" ]; then
  mkdir -p "$STEALKIT_CACHE/victims" && cp -rn "$GPU_DIR/cache/victims/." "$STEALKIT_CACHE/victims/"
fi
start=$(date +%s)
SK=("$PYTHON" -m stealkit)
left() { echo $(( LIMIT - ($(date +%s) - start) )); }
# run a command until the call's limit; SIGINT first so a run can write its checkpoint, then KILL
bounded() { timeout --signal=INT --kill-after=20 "$(left)" "$@"; echo "exit $? after $(( $(date +%s) - start )) s: $*" >> "$OUT/steps.log"; }
reproduce() {  # reproduce at full scale (or the small scale's same study when --tiny), one study
  local scale=full; [ $tiny = 1 ] && scale=small
  bounded "${SK[@]}" -q reproduce --scale "$scale" --only "$1" --jobs 1 --device "$device" --out "$RUNS/reproduce-$scale"
  cp -f "$RUNS/reproduce-$scale/report.html" "$OUT/reproduce-$scale.html" 2>/dev/null
}
curve() {  # label-only / probabilities data-free curve on Fashion-MNIST, resumable
  local mode=$1 budget=$2 marks=$3 victim=standard:fmnist-conv2
  [ $tiny = 1 ] && { victim=standard:digits-conv2; budget=3000; marks=1000,2000,3000; }
  local dir="$RUNS/$4" resume=()
  [ -f "$dir/config.json" ] && resume=(--resume)
  bounded "${SK[@]}" extract codfe --victim "$victim" --mode "$mode" --budget "$budget" --eval-at "$marks" \
    --checkpoint-every 20 --device "$device" --out "$dir" "${resume[@]}"
  cp -f "$dir/summary.json" "$OUT/$4-summary.json" 2>/dev/null
}
stn_tiny() { bounded "${SK[@]}" -q certify-study --dataset digits --quick --device "$device" --out "$RUNS/stn-tiny"; }
for step in ${steps//,/ }; do
  echo "== $step ($(left) s left)" >&2
  case "$step" in
    stn) if [ $tiny = 1 ]; then stn_tiny; else reproduce stn-certify; fi ;;
    milli) if [ $tiny = 1 ]; then bounded "${SK[@]}" -q study explanations --quick --device "$device" --out "$RUNS/milli-tiny"
           else reproduce explanations; fi ;;
    table4) if [ $tiny = 1 ]; then bounded "${SK[@]}" -q study dfme-table4 --victims digits-conv2 --columns "own pool,gaussian" \
              --taus 1,5 --schedules cyclic --max-distinct 60 --epochs 1 --device "$device" --out "$RUNS/table4-tiny"
            else reproduce dfme-table4; fi ;;
    labelonly) curve label 2000000 100000,250000,500000,1000000,1500000,2000000 labelonly-fmnist ;;
    probs) curve probs 250000 50000,100000,250000 probs-fmnist ;;
    codfe) if [ $tiny = 1 ]; then bounded "${SK[@]}" -q study codfe --quick --device "$device" --out "$RUNS/codfe-tiny"
           else reproduce codfe-figure-2-table-3; fi ;;
    transfer) if [ $tiny = 1 ]; then bounded "${SK[@]}" -q attack study --dataset digits --quick --device "$device" \
                --out "$RUNS/transfer-tiny"
              else reproduce codfe-tables-1-2; fi ;;
    *) echo "unknown step $step; expected stn, milli, table4, labelonly, probs, codfe, transfer" >&2; exit 2 ;;
  esac
done
"$PYTHON" - "$device" > "$OUT/device.json" <<'EOF'
import json, os, platform, subprocess, sys, torch
line = {"device": sys.argv[1], "torch": torch.__version__, "cuda": torch.version.cuda, "cpus": os.cpu_count(),
        "python": platform.python_version(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
try:
    line["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip()
except OSError:
    pass
stamp = ".gpu/COMMIT"
line["commit"] = open(stamp).read().strip() if os.path.exists(stamp) else None
print(json.dumps(line))
EOF
tar -czf "$OUT/papers-state.tgz" -C "$RUNS" --exclude=./out --exclude=./.state-unpacked . 2>/dev/null
ls -la "$OUT" >&2
