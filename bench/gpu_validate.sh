#!/usr/bin/env bash
# Profile and validate an 8B-shaped Llama (random weights, bf16) on one CUDA GPU (issue 7).
#
#   bash bench/gpu_validate.sh [OUT_DIR]        # default: reports/validation/gpu-<gpu>-<date>
#
# Needs: a CUDA GPU with >= 60 GB (weights 16 GB + KV for the profile grid), torch with CUDA,
# kvsim installed (pip install -e .). No downloads: weights are random (shape = llama-3.1-8b).
# Budget: ~2 min to build the model, ~1 min to profile, ~2-4 min to validate (< 10 min total).
# Writes into OUT_DIR: env.txt (GPU, driver, torch, date), profile.json (fitted cost model and
# its error per operation group), chat.jsonl (the workload), timed/ and offline/ (validation.json
# + validation.html: step-time / throughput / TTFT / TPOT / E2E errors and the decision check),
# and summary.txt (the printed tables). Commit OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

python - <<'EOF' || { echo "gpu_validate: no CUDA device visible to torch" >&2; exit 1; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
EOF

GPU=$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-'))")
OUT=${1:-reports/validation/gpu-${GPU}-$(date -u +%Y%m%d)}
mkdir -p "$OUT"
MODEL=llama-3.1-8b
COMMON=(--device cuda --model "$MODEL" --dtype bf16 --block-size 16 --threads 8)
ENGINE=(--num-gpu-blocks 8192 --max-num-seqs 64 --max-num-batched-tokens 2048)

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit: /' || true
} | tee "$OUT/env.txt"

# 1. Profile: grid up to 64 decodes, 2048-token steps, 4096-token contexts.
kvsim profile "${COMMON[@]}" --out "$OUT/profile.json" \
  --max-num-seqs 64 --max-num-batched-tokens 2048 --max-context 4096 | tee "$OUT/summary.txt"

# 2. Workload: 200 chat requests (multi-turn sessions share prefixes), 8 conversations/s.
kvsim gen chat --out "$OUT/chat.jsonl" -n 200 --rate 8 --seed 0 > /dev/null

# 3. Validate with real arrival times, then offline (all at t=0: decisions must be identical).
for mode in timed offline; do
  extra=(); [ "$mode" = offline ] && extra=(--offline)
  echo "== $mode ==" | tee -a "$OUT/summary.txt"
  kvsim validate "$OUT/chat.jsonl" "${COMMON[@]}" "${ENGINE[@]}" "${extra[@]}" \
    --profile "$OUT/profile.json" --out "$OUT/$mode" | tee -a "$OUT/summary.txt"
done
echo "results in $OUT (target on a GPU: median step-time and throughput error <= 10%)"
