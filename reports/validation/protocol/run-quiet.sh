#!/usr/bin/env bash
# The issue-21 measurements, in order of priority, each under bench/quiet.py (it waits until
# other processes use < 0.05 CPUs for 10 s, then reports what they used meanwhile).
# Usage: PYTHONPATH=... bash reports/validation/protocol/run-quiet.sh [MAX_WAIT_S]
set -u
WAIT=${1:-3600}
TRACE=reports/validation/cpu-tiny-llama-capped/chat.jsonl
OUT=reports/validation/protocol
P="python3 bench/validate_protocol.py $TRACE --offline"
Q="python3 bench/quiet.py --max-wait $WAIT --"
run() { name=$1; shift; echo "== $name $(date -u +%H:%M:%S)"; "$@" > "$OUT/$name.txt" 2> "$OUT/$name.log"; tail -1 "$OUT/$name.log"; }
B="--profile-timing before"   # the profile before each real run (the experiments of 2026-12-01)
run quiet-interleaved $Q $P --repeats 3 --out $OUT/quiet-interleaved
run quiet-before     $Q $P --repeats 3 $B --out $OUT/quiet-before
run quiet-breakdown  $Q $P --repeats 2 $B --breakdown --out $OUT/quiet-breakdown
run host-drift       $Q python3 bench/host_drift.py --seconds 60 --window 3 --breakdown
run quiet-pinned     $Q $P --repeats 2 $B --pin-cpu 1 --out $OUT/quiet-pinned
run quiet-warmup20   $Q $P --repeats 2 $B --warmup-s 20 --out $OUT/quiet-warmup20
run quiet-rounds6    $Q $P --repeats 2 $B --profile-rounds 6 --out $OUT/quiet-rounds6
echo "== done $(date -u +%H:%M:%S)"
