"""Turns a gpu-check run into report.md: Keling vs NVML vs PyTorch at each mark,
and every ioctl Keling could not decode."""
import collections
import json
import sys

trace_path, job_path = sys.argv[1], sys.argv[2]
lines = [json.loads(l) for l in open(trace_path) if l.strip()]
marks = [json.loads(l) for l in open(job_path) if l.startswith("{")]
snapshots = [l for l in lines if l["type"] == "gpu_snapshot"]
nvml = [l for l in lines if l["type"] == "nvml_check"]
summary = lines[-1] if lines and lines[-1]["type"] == "summary" else {}

print("# Keling gpu-check\n")
print("| mark | PyTorch reserved | Keling bytes (job pid) | NVML bytes | NVML - Keling |")
print("|---|---|---|---|---|")
for i, m in enumerate(marks):
    pid = m["pid"]
    snap = snapshots[i] if i < len(snapshots) else {"processes": []}
    ours = sum(p["gpu_mem_bytes"] for p in snap["processes"] if p["pid"] == pid)
    # The nvml_check written right after this snapshot.
    after = [n for n in nvml if n["ts_ns"] >= snap.get("ts_ns", 0)]
    theirs = None
    if after:
        vals = [d["nvml_bytes"] for d in after[0]["processes"] if d["pid"] == pid and d["nvml_bytes"] is not None]
        theirs = sum(vals) if vals else None
    diff = "n/a" if theirs is None else theirs - ours
    print(f"| {m['mark']} | {m['torch_reserved']} | {ours} | {theirs if theirs is not None else 'n/a'} | {diff} |")

print("\n## Calls Keling could not decode\n")
undecoded = collections.Counter()
calls = collections.Counter()
for l in lines:
    if l["type"] == "gpu_ioctl":
        calls[(l["call"], l.get("via_xfer", False))] += 1
        if "undecoded" in l:
            undecoded[(l["call"], hex(l["cmd"]), l["undecoded"])] += 1
    elif l["type"] in ("gpu_alloc", "gpu_object", "gpu_free"):
        calls[(l["type"] + " " + str(l.get("class")), l.get("via_xfer", False))] += 1
if not undecoded:
    print("none")
for (call, cmd, reason), n in sorted(undecoded.items()):
    print(f"- {call} cmd {cmd}: {reason} x {n}")
print("\n## What the driver was asked (call or event+class, via XFER) x count\n")
for (call, xfer), n in sorted(calls.items()):
    print(f"- {call}{' (XFER)' if xfer else ''}: {n}")
print("\n## Summary undecoded by reason\n")
print(json.dumps(summary.get("undecoded", {})))
