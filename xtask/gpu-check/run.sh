#!/bin/sh
# Runs on a GPU host from the bundle directory that `cargo xtask gpu-check` made:
# traces job.py with Keling and writes report.md (to $OUT when set).
# job.py reads KELING_GPU_CHECK_TRACE to wait until each mark's snapshot is written.
set -eu
cd "$(dirname "$0")"
OUT=${OUT:-$PWD}
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1 || true
cat /proc/driver/nvidia/version > "$OUT/driver.txt" 2>&1 || true
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' \
    >> "$OUT/gpus.txt" 2>&1 || echo "no usable torch for python3" >> "$OUT/gpus.txt"
rc=0
KELING_GPU_CHECK_TRACE="$OUT/trace.jsonl" PYTHONUNBUFFERED=1 \
    ./keling trace --format jsonl --output "$OUT/trace.jsonl" -- python3 job.py \
    > "$OUT/job.out" 2> "$OUT/job.err" || rc=$?
if [ "$rc" -ne 0 ]; then
    echo "keling trace / job.py exited $rc; see $OUT/job.err"; tail -20 "$OUT/job.err"
fi
# A report even after a failure: it says what is there and what is missing.
python3 report.py "$OUT/trace.jsonl" "$OUT/job.out" --stderr "$OUT/job.err" --rc "$rc" \
    --info "$OUT/gpus.txt" --info "$OUT/driver.txt" > "$OUT/report.md"
cat "$OUT/report.md"
exit "$rc"
