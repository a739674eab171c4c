#!/bin/sh
# Runs on a GPU host from the bundle directory that `cargo xtask gpu-check` made:
# traces job.py with Keling twice, once with each way of seeing NVIDIA ioctls
# (`--ioctl-backend auto`, which takes the driver's entry where kprobes attach,
# then `tracepoints`), and writes report.md and report-tracepoints.md (to $OUT
# when set). Each report checks its own trace against NVML.
# job.py reads KELING_GPU_CHECK_TRACE to wait until each mark's snapshot is written.
set -eu
cd "$(dirname "$0")"
OUT=${OUT:-$PWD}
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1 || true
cat /proc/driver/nvidia/version > "$OUT/driver.txt" 2>&1 || true
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' \
    >> "$OUT/gpus.txt" 2>&1 || echo "no usable torch for python3" >> "$OUT/gpus.txt"
# trace_job SUFFIX BACKEND: one traced run of job.py and its report.
trace_job() {
    rc=0
    KELING_GPU_CHECK_TRACE="$OUT/trace$1.jsonl" PYTHONUNBUFFERED=1 \
        ./keling trace --ioctl-backend "$2" --format jsonl --output "$OUT/trace$1.jsonl" \
        -- python3 job.py > "$OUT/job$1.out" 2> "$OUT/job$1.err" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "keling trace --ioctl-backend $2 / job.py exited $rc; see $OUT/job$1.err"
        tail -20 "$OUT/job$1.err"
    fi
    # A report even after a failure: it says what is there and what is missing.
    python3 report.py "$OUT/trace$1.jsonl" "$OUT/job$1.out" --stderr "$OUT/job$1.err" \
        --rc "$rc" --info "$OUT/gpus.txt" --info "$OUT/driver.txt" > "$OUT/report$1.md"
    return "$rc"
}
rc=0
trace_job "" auto || rc=$?
cat "$OUT/report.md"
trace_job -tracepoints tracepoints || rc=$?
grep -E "^- NVIDIA ioctls seen at|^\*\*Overall" "$OUT/report-tracepoints.md" || true
exit "$rc"
