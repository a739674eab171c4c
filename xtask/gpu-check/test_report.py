"""report.py on synthetic runs, with the trace's field names as keling-agent's
output/jsonl.rs writes them. Self-contained: `python3 xtask/gpu-check/test_report.py`."""
import json
import os
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no __pycache__ next to the sources
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

MIB = 1 << 20
CTX = 5 * MIB  # context memory the driver holds per process (made up)


def gpu_proc(pid, video, host=0, driver=None, undecoded=0, gpu=0):
    driver = video if driver is None else driver
    return {"pid": pid, "gpu_mem_bytes": video, "gpu_mem_peak_bytes": video,
            "gpu_host_bytes": host, "gpu_host_peak_bytes": host, "gpu_egm_bytes": 0,
            "gpu_driver_bytes": driver, "gpu_allocs": 1, "gpu_frees": 0,
            "undecoded": undecoded,
            "gpus": [{"gpu": gpu, "bytes": video, "peak_bytes": video, "host_bytes": host,
                      "peak_host_bytes": host, "egm_bytes": 0, "driver_bytes": driver,
                      "allocs": 1, "frees": 0}]}


class Run:
    """A trace and a job.out built step by step: mark() writes both sides."""

    def __init__(self):
        self.trace, self.job, self.ts, self.seq = [], [], 1000, 0

    def line(self, **kw):
        self.ts += 10
        kw.setdefault("ts_ns", self.ts)
        self.trace.append(kw)

    def mark(self, pid, name, role, procs, reserved, allocated, nvml_delta=None, **extra):
        self.ts += 10
        self.job.append(dict(mark=name, role=role, pid=pid, ppid=1, t_ns=self.ts,
                             torch_reserved=reserved, torch_allocated=allocated,
                             snapshot_seen=True, **extra))
        self.seq += 1
        self.line(type="gpu_snapshot", seq=self.seq, gpus=[], processes=procs)
        diffs = []
        for p in procs:
            n = p["gpu_driver_bytes"] + (nvml_delta or {}).get(p["pid"], 0)
            diffs.append({"pid": p["pid"], "gpu": 0, "nvml_bytes": n,
                          "keling_driver_bytes": p["gpu_driver_bytes"],
                          "keling_caller_bytes": p["gpu_mem_bytes"],
                          "diff_bytes": n - p["gpu_driver_bytes"]})
        self.line(type="nvml_check", processes=diffs)

    def write(self, d):
        t, j = os.path.join(d, "trace.jsonl"), os.path.join(d, "job.out")
        with open(t, "w") as f:
            for l in self.trace:
                f.write(json.dumps(l) + "\n")
        with open(j, "w") as f:
            for l in self.job:
                f.write(json.dumps(l) + "\n")
        return t, j


def good_run(nvml_delta=None, undecoded=False):
    r = Run()
    r.line(type="gpu_ioctl", fd=3, device="nvidiactl", call="SYS_PARAMS", cmd=0xC00846D6,
           status=0, ret=0, via_xfer=False, outcome="no_memory_escape", pid=100, tid=100)
    r.line(type="gpu_ioctl", fd=3, device="nvidiactl", call="RM_CONTROL", cmd=0xC020462A,
           status=0, ret=0, via_xfer=False, outcome="decoded", control_cmd=0x20800110,
           control=None, pid=100, tid=100)
    r.line(type="gpu_object", client=1, parent=1, handle=2, **{"class": 0x80}, kind="device",
           gpu=0, pid=100, tid=100)
    r.line(type="gpu_alloc", client=1, parent=2, handle=0x10, **{"class": 0x40},
           kind="video_memory", mem_kind="video", gpu=0, bytes=CTX, call="RM_ALLOC",
           via_xfer=False, pid=100, tid=100)
    r.line(type="gpu_alloc", client=1, parent=2, handle=0x11, **{"class": 0x50A0},
           kind="virtual_memory", mem_kind="video", gpu=0, bytes=0, call="RM_ALLOC",
           via_xfer=False, pid=100, tid=100)
    if undecoded:
        r.line(type="gpu_ioctl", fd=3, device="nvidiactl", call="RM_0x99", cmd=0xC0104699,
               status=0, ret=0, via_xfer=False, outcome="undecoded",
               undecoded="unknown_escape", pid=100, tid=100)
    v = CTX + 2 * MIB
    r.mark(100, "context", "main", [gpu_proc(100, v)], 2 * MIB, 512, nvml_delta)
    r.mark(100, "alloc 64 MiB", "main", [gpu_proc(100, v + 64 * MIB)], 66 * MIB, 64 * MIB,
           nvml_delta, requested_bytes=64 * MIB)
    r.mark(100, "pinned 64 MiB", "main", [gpu_proc(100, v + 64 * MIB, host=64 * MIB + 4096)],
           66 * MIB, 64 * MIB, nvml_delta, pinned_bytes=64 * MIB)
    r.mark(200, "context", "expandable child",
           [gpu_proc(100, v), gpu_proc(200, CTX + 20 * MIB)], 20 * MIB, 512, nvml_delta,
           expandable=True)
    r.line(type="exit", comm="python3", exit_code=0, signal=None, pid=200, tid=200)
    r.line(type="gpu_export", client=1, handle=0x20, file_id=7, position=0, gpu=0,
           bytes=64 * MIB, pid=100, tid=100)
    r.line(type="gpu_ref", client=9, parent=10, handle=0x30, how="import", src_client=None,
           src_handle=None, gpu=0, mem_kind="video", bytes=64 * MIB, pid=300, tid=300)
    r.mark(300, "ipc: consumer mapped and wrote", "ipc consumer",
           [gpu_proc(100, v + 64 * MIB), gpu_proc(300, CTX)], 2 * MIB, 0, nvml_delta,
           shared_bytes=64 * MIB, data_ok=True)
    r.line(type="gpu_free", client=9, handle=0x30, **{"class": 0x40}, kind="video_memory",
           mem_kind="video", gpu=0, bytes=0, freed_pid=None, call="RM_FREE", pid=300, tid=300)
    r.line(type="exit", comm="python3", exit_code=0, signal=None, pid=300, tid=300)
    r.mark(100, "ipc: producer released", "main", [gpu_proc(100, v)], 0, 0, nvml_delta)
    r.line(type="exit", comm="python3", exit_code=0, signal=None, pid=100, tid=100)
    reasons = dict.fromkeys(["finn_serialized", "unknown_layout", "fault", "unknown_escape",
                             "table_full", "unknown_object"], 0)
    if undecoded:
        reasons["unknown_escape"] = 1
    procs = [dict(gpu_proc(p, 0), ppid=1, comm="python3", exit_code=0, switches=1,
                  voluntary_switches=1, involuntary_switches=0, on_cpu_ns=1, threads=[])
             for p in (100, 200, 300)]
    r.line(type="summary", duration_ns=1, events=10, drops=0, decode_errors=0,
           undecoded=reasons, gpus=[], processes=procs)
    return r


class ReportTest(unittest.TestCase):
    def run_report(self, r, extra=()):
        with tempfile.TemporaryDirectory() as d:
            t, j = r.write(d)
            text, err = report.main([t, j, *extra])
        self.assertIsNone(err)
        return text

    def test_a_clean_run_passes(self):
        text = self.run_report(good_run())
        self.assertIn("**Overall: PASS**", text)
        self.assertIn("undecoded (target 0): **0**", text)
        # Per mark: the marking process first, its PyTorch figures, the differences.
        self.assertIn("| alloc 64 MiB | 100 | main | 74448896 (71.0 MiB) |", text)
        self.assertIn("| alloc 64 MiB | 100 | +67108864 (64.0 MiB) | +67108864 (64.0 MiB) "
                      "| equal |", text)
        self.assertIn("| pinned 64 MiB | 100 | 0 | 0 | equal | +67112960 (64.0 MiB) "
                      "| +67108864 (64.0 MiB) |", text)
        # Every escape, class and control with Keling's classification.
        self.assertIn("| SYS_PARAMS | 1 | carries no memory |", text)
        self.assertIn("| 0x40 | NV01_MEMORY_LOCAL_USER | 1 | decoded | video memory", text)
        self.assertIn("| 0x50a0 | NV50_MEMORY_VIRTUAL | 1 | carries no memory |", text)
        self.assertIn("| 0x80 | NV01_DEVICE_0 | 1 | carries no memory | object (device)",
                      text)
        self.assertIn("| 0x20800110 | not named by Keling | 1 | decoded |", text)
        self.assertIn("IMPORT_OBJECT(S)_FROM_FD", text)
        self.assertIn("EXPORT_OBJECT(S)_TO_FD", text)
        # Each process judged at its last snapshot before its exit.
        self.assertIn("| 200 | 4 | gpu0 | 26214400 (25.0 MiB) | 26214400 (25.0 MiB) "
                      "| equal |", text)
        self.assertIn("| 300 | 5 | gpu0 |", text)
        self.assertIn("| 100 | 6 | gpu0 |", text)
        self.assertIn("expandable_segments in effect in the child: yes", text)
        self.assertIn("saw each other's writes: yes", text)

    def test_undecoded_and_nvml_differences_fail(self):
        text = self.run_report(good_run(nvml_delta={300: 2 * MIB}, undecoded=True))
        self.assertIn("**Overall: FAIL**", text)
        self.assertIn("undecoded (target 0): **1**", text)
        self.assertIn("unknown_escape 1", text)
        self.assertIn("| RM_0x99 | 1 | undecoded | unknown_escape |", text)
        self.assertIn("**NVML - driver +2097152 (2.0 MiB)**", text)

    def test_an_old_trace_and_job_say_what_is_missing(self):
        r = Run()
        r.job = [{"mark": "context", "pid": 100, "torch_reserved": 2 * MIB,
                  "torch_allocated": 512}, {"mark": "freed", "pid": 100}]
        r.trace = [{"type": "gpu_snapshot", "ts_ns": 5, "processes": [
                       {"pid": 100, "gpu_mem_bytes": 7 * MIB}]},
                   {"type": "gpu_ioctl", "call": "RM_CONTROL", "cmd": 1, "undecoded": "fault"},
                   {"type": "gpu_alloc"}]
        with tempfile.TemporaryDirectory() as d:
            t, j = r.write(d)
            with open(t, "a") as f:
                f.write('{"type": "gpu_snap')  # cut off
            text, err = report.main([t, j, "--rc", "1", "--stderr", os.path.join(d, "none")])
        self.assertIsNone(err)
        self.assertIn("1 trace lines were not JSON objects", text)
        self.assertIn("the trace has no summary line", text)
        self.assertIn("exited 1", text)
        self.assertIn("`gpu_driver_bytes` in gpu_snapshot process lines: missing", text)
        self.assertIn("`t_ns` in job.out mark lines: missing", text)
        self.assertIn("`outcome` in gpu_ioctl lines: missing", text)
        self.assertIn("| RM_CONTROL | 1 | undecoded | fault |", text)
        self.assertIn("no gpu_snapshot after this mark", text)
        self.assertIn("**Overall: FAIL**", text)

    def test_no_files_at_all(self):
        text, err = report.main(["/nonexistent/trace.jsonl", "/nonexistent/job.out"])
        self.assertIsNone(err)
        self.assertIn("cannot read trace", text)
        self.assertIn("**Overall: INCOMPLETE**", text)
        self.assertIsNotNone(report.main(["only-one"])[1])


if __name__ == "__main__":
    unittest.main()
