#!/usr/bin/env bash
# Profile and validate an 8B-shaped Llama (random weights, bf16) on one CUDA GPU (issue 7).
#
#   bash bench/gpu_validate.sh [OUT_DIR]        # default: reports/validation/gpu-<gpu>-<date>
#
# Needs: a CUDA GPU with >= 60 GB (weights 16 GB + KV for the profile grid), torch with CUDA,
# kvsim importable and `kvsim` on PATH. No downloads: weights are random (shape = llama-3.1-8b).
#
# Stages, each under its own time limit (seconds; override with the variables), so that a slow
# stage is cut off and reported instead of swallowing the whole device lease:
#   PROFILE_S=180  kvsim profile (quick grid: decode batches to 64, 2048-token steps, 4096 context)
#   OFFLINE_S=150  kvsim validate --offline (every request at t=0: decisions must be identical)
#   TIMED_S=150    kvsim validate at the trace's arrival times
# Progress lines with UTC times go to stdout and to OUT_DIR/summary.txt as they happen.
# Writes into OUT_DIR (6 files, no HTML): env.txt, summary.txt, chat.jsonl, profile.json,
# offline/validation.json, timed/validation.json. Commit OUT_DIR.
#
# A first attempt (2026-11-29, H200, full grid, 200 requests, HTML, no stage limits) ran past
# 530 s and nothing came back; this version is staged so the next one reports where time goes.
set -uo pipefail
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}   # DEVICE=cpu MODEL=tiny-llama DTYPE=fp32: a dry run of the stages
no_cuda() { echo "gpu_validate: no CUDA device visible to torch" >&2; exit 1; }
[ "$DEVICE" = cpu ] || python - <<'EOF' || no_cuda
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
EOF

GPU=$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-')
                                       if torch.cuda.is_available() else 'cpu')")
OUT=${1:-reports/validation/gpu-${GPU}-$(date -u +%Y%m%d)}
mkdir -p "$OUT"
COMMON=(--device "$DEVICE" --model "${MODEL:-llama-3.1-8b}" --dtype "${DTYPE:-bf16}" --block-size 16
        --threads 8)
ENGINE=(--num-gpu-blocks 8192 --max-num-seqs 64 --max-num-batched-tokens 2048)

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }

# stage LIMIT NAME CMD...: run CMD (output appended to summary.txt and shown), killed at LIMIT s.
stage() {
  local limit=$1 name=$2 rc
  shift 2
  log "$name: start (limit ${limit}s)"
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$OUT/summary.txt"
  rc=${PIPESTATUS[0]}
  log "$name: exit $rc$([ "$rc" = 124 ] && echo ' (time limit)')"
  return "$rc"
}

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit: /' || true
} | tee "$OUT/env.txt"

kvsim gen chat --out "$OUT/chat.jsonl" -n 100 --rate 8 --seed 0 > /dev/null
stage "${PROFILE_S:-180}" profile kvsim profile "${COMMON[@]}" --out "$OUT/profile.json" --quick \
  --max-num-seqs 64 --max-num-batched-tokens 2048 --max-context 4096 || exit 1
for mode in offline timed; do
  extra=(); [ "$mode" = offline ] && extra=(--offline)
  limit_var=$(echo "${mode}_S" | tr a-z A-Z)
  stage "${!limit_var:-150}" "validate $mode" kvsim validate "$OUT/chat.jsonl" "${COMMON[@]}" \
    "${ENGINE[@]}" "${extra[@]}" --profile "$OUT/profile.json" --no-html --out "$OUT/$mode" \
    || true
done
log "results in $OUT (target on a GPU: median step-time and throughput error <= 10%)"
