#!/bin/sh
# Runs on a GPU host from the bundle directory that `cargo xtask gpu-check` made:
# traces job.py with Keling and writes report.md (to $OUT when set).
set -eu
cd "$(dirname "$0")"
OUT=${OUT:-$PWD}
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1 || true
cat /proc/driver/nvidia/version > "$OUT/driver.txt" 2>&1 || true
./keling trace --format jsonl --output "$OUT/trace.jsonl" -- python3 job.py > "$OUT/job.out" 2> "$OUT/job.err" || {
    echo "keling trace failed; see $OUT/job.err"; tail -20 "$OUT/job.err"; exit 1; }
python3 report.py "$OUT/trace.jsonl" "$OUT/job.out" > "$OUT/report.md"
cat "$OUT/report.md"
