"""Turns a gpu-check run into report.md (markdown on stdout).

    python3 report.py TRACE.jsonl JOB.out [--stderr JOB.err] [--rc N] [--info FILE]...

Per mark and per process: Keling's video and host bytes, its driver figure, NVML's
figure (the nvml_check written right after the snapshot, else the nearest), what
PyTorch said, and the differences; every escape, RM class and control seen with how
Keling classified it; a verdict (nothing undecoded, driver figure == NVML for every
process at its last snapshot before it exited). Fields an older or newer trace lacks
are named in the report, never a crash.
"""
import collections
import json
import sys

MIB = 1 << 20
NO_GPU = (1 << 32) - 2
ALL_GPUS = (1 << 32) - 1

# keling-agent/src/gpu/names.rs CLASSES (the trace gives class numbers).
CLASS_NAMES = {
    0x0: "NV01_ROOT", 0x1: "NV01_ROOT_NON_PRIV", 0x41: "NV01_ROOT_CLIENT",
    0x80: "NV01_DEVICE_0", 0x2080: "NV20_SUBDEVICE_0", 0x3E: "NV01_MEMORY_SYSTEM",
    0x3F: "NV01_MEMORY_LOCAL_PRIVILEGED", 0x40: "NV01_MEMORY_LOCAL_USER",
    0x42: "NV_MEMORY_EXTENDED_USER", 0x70: "NV01_MEMORY_VIRTUAL",
    0x71: "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR", 0xC2: "NV01_MEMORY_LOCAL_PHYSICAL",
    0xE0: "NV_MEMORY_EXPORT", 0xF8: "NV_MEMORY_FABRIC", 0xF9: "NV_MEMORY_FABRIC_IMPORT_V2",
    0xFB: "NV_MEMORY_FABRIC_IMPORTED_REF", 0xFD: "NV_MEMORY_MULTICAST_FABRIC",
    0xFE: "NV_MEMORY_MAPPER", 0x50A0: "NV50_MEMORY_VIRTUAL", 0x9067: "FERMI_CONTEXT_SHARE_A",
    0x90F1: "FERMI_VASPACE_A", 0xA06C: "KEPLER_CHANNEL_GROUP_A",
    0xC36F: "VOLTA_CHANNEL_GPFIFO_A", 0xC46F: "TURING_CHANNEL_GPFIFO_A",
    0xC56F: "AMPERE_CHANNEL_GPFIFO_A", 0xC86F: "HOPPER_CHANNEL_GPFIFO_A",
    0xC96F: "BLACKWELL_CHANNEL_GPFIFO_A", 0xCA6F: "BLACKWELL_CHANNEL_GPFIFO_B",
    0xC5C0: "TURING_COMPUTE_A", 0xC6C0: "AMPERE_COMPUTE_A", 0xC7C0: "AMPERE_COMPUTE_B",
    0xC9C0: "ADA_COMPUTE_A", 0xCBC0: "HOPPER_COMPUTE_A", 0xCDC0: "BLACKWELL_COMPUTE_A",
    0xCEC0: "BLACKWELL_COMPUTE_B", 0xC7B5: "AMPERE_DMA_COPY_B", 0xC8B5: "HOPPER_DMA_COPY_A",
}

DECODED, NO_MEMORY, UNDECODED = "decoded", "carries no memory", "undecoded"


class Missing:
    """Fields the trace or job output lacks: (where, field) -> times."""

    def __init__(self):
        self.seen = collections.Counter()

    def get(self, d, key, where):
        if isinstance(d, dict) and key in d:
            return d[key]
        self.seen[(where, key)] += 1
        return None


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def b(n):
    """Exact bytes, with MiB beside when large; text for what is not a number."""
    if n is None:
        return "missing"
    if not is_int(n):
        return str(n)
    return f"{n} ({n / MIB:.1f} MiB)" if abs(n) >= MIB else str(n)


def diff(a, c):
    return a - c if is_int(a) and is_int(c) else None


def signed(n):
    if n is None:
        return "n/a"
    return ("+" if n > 0 else "") + b(n) if n else "0"


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def table(out, head, rows):
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for r in rows:
        out.append("| " + " | ".join(cell(x) for x in r) + " |")
    out.append("")


def read_lines(path, what, keep=None):
    """JSON objects of a file (those `keep` accepts), the count of lines that were
    not objects, and an error."""
    objs, bad = [], 0
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    v = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(v, dict):
                    if keep is None or keep(v):
                        objs.append(v)
                else:
                    bad += 1
    except OSError as e:
        return [], 0, f"cannot read {what} {path}: {e}"
    return objs, bad, None


def gpu_name(g):
    if g is None:
        return "gpu?"
    if g == NO_GPU:
        return "no GPU"
    return f"gpu{g}"


def class_name(c):
    if not is_int(c):
        return f"class {c}"
    return CLASS_NAMES.get(c, "unknown to Keling's names")


class Trace:
    def __init__(self, lines, miss):
        self.lines = lines
        self.miss = miss
        self.snapshots = []  # (file index, line)
        self.nvml = []
        self.exits = {}  # pid -> ts_ns of its exit
        self.summary = None
        for i, l in enumerate(lines):
            t = l.get("type")
            if t == "gpu_snapshot":
                self.snapshots.append((i, l))
            elif t == "nvml_check":
                self.nvml.append((i, l))
            elif t == "exit" and is_int(l.get("pid")):
                self.exits[l["pid"]] = l.get("ts_ns")
            elif t == "summary":
                self.summary = l

    def snapshot_after(self, t_ns):
        for i, s in self.snapshots:
            ts = s.get("ts_ns")
            if is_int(ts) and ts >= t_ns:
                return i, s
        return None

    def nvml_for(self, snap_index):
        """The nvml_check written for the snapshot at this index (the next line of
        that type before the next snapshot), else the nearest one in time, with a note."""
        later = [n for n in self.snapshots if n[0] > snap_index]
        limit = later[0][0] if later else len(self.lines)
        for i, n in self.nvml:
            if snap_index < i < limit:
                return n, None
        if not self.nvml:
            return None, "missing: no nvml_check line in the trace (NVML unavailable to Keling?)"
        ts = self.lines[snap_index].get("ts_ns")
        if not is_int(ts):
            return None, "missing: no nvml_check written with this snapshot"
        best = min(self.nvml, key=lambda n: abs((n[1].get("ts_ns") or 0) - ts))[1]
        ms = abs((best.get("ts_ns") or 0) - ts) / 1e6
        return best, f"no nvml_check with this snapshot; nearest one {ms:.0f} ms away"

    def procs(self, snap):
        out = {}
        ps = self.miss.get(snap, "processes", "gpu_snapshot")
        for p in ps if isinstance(ps, list) else []:
            if isinstance(p, dict) and is_int(p.get("pid")):
                out[p["pid"]] = p
        return out


def nvml_of(nvml_line, pid, miss):
    """NVML's figure for pid summed over GPUs, Keling's driver figure as the line
    has it, and a note; None where not known."""
    if nvml_line is None:
        return None, None, "missing"
    entries = [e for e in (nvml_line.get("processes") or []) if isinstance(e, dict)
               and e.get("pid") == pid]
    if not entries:
        return 0, 0, "not listed by NVML (and no Keling bytes): 0"
    theirs, ours, note = 0, 0, ""
    for e in entries:
        n = miss.get(e, "nvml_bytes", "nvml_check process")
        k = miss.get(e, "keling_driver_bytes", "nvml_check process")
        if n is None:
            theirs = None
            note = "NVML gave no figure (not listed, or unavailable e.g. under MPS)"
        elif theirs is not None:
            theirs += n
        ours = ours + k if ours is not None and is_int(k) else None
    return theirs, ours, note


def per_gpu(p):
    return {g.get("gpu"): g for g in (p.get("gpus") or []) if isinstance(g, dict)}


def mark_rows(tr, marks, miss, out):
    out.append("## Per mark and process\n")
    out.append("Keling video = `gpu_mem_bytes` (per caller, what quotas use); host = "
               "`gpu_host_bytes` (pinned); driver = `gpu_driver_bytes` (the driver's "
               "per-process figure, which NVML's `usedGpuMemory` should equal); PyTorch "
               "figures only for the process that made the mark.\n")
    rows, pairing = [], {}
    for k, m in enumerate(marks):
        pid, name = m.get("pid"), m.get("mark", "?")
        t = m.get("t_ns")
        if is_int(t):
            hit = tr.snapshot_after(t)
        else:
            miss.seen[("job.out mark", "t_ns")] += 1
            hit = tr.snapshots[k] if k < len(tr.snapshots) else None  # old job.py: by order
        if hit is None:
            rows.append([name, pid, m.get("role", ""), "no gpu_snapshot after this mark"]
                        + [""] * 9)
            continue
        si, snap = hit
        pairing[k] = (si, snap)
        nv, nv_note = tr.nvml_for(si)
        procs = tr.procs(snap)
        order = ([pid] if pid in procs else []) + [q for q in sorted(procs) if q != pid]
        if pid not in procs:
            rows.append([name, pid, m.get("role", ""), "not in the snapshot (no GPU figures)",
                         "", "", "", "", b(m.get("torch_reserved")),
                         b(m.get("torch_allocated")), "", "", ""])
        for q in order:
            p = procs[q]
            video = miss.get(p, "gpu_mem_bytes", "gpu_snapshot process")
            host = miss.get(p, "gpu_host_bytes", "gpu_snapshot process")
            drv = miss.get(p, "gpu_driver_bytes", "gpu_snapshot process")
            theirs, _, note = nvml_of(nv, q, miss)
            nv_cell = b(theirs) if theirs is not None else (nv_note or note or "missing")
            if theirs is not None and nv_note:
                nv_cell += f" ({nv_note})"
            mine = q == pid
            res = m.get("torch_reserved") if mine else None
            alloc = m.get("torch_allocated") if mine else None
            pinned = m.get("pinned_bytes") if mine else None
            rows.append([
                name if mine else "", q, m.get("role", "") if mine else "(other process)",
                b(video), b(host), b(drv), nv_cell, signed(diff(theirs, drv)),
                b(res) if mine else "-", b(alloc) if mine else "-",
                signed(diff(video, res)) if mine else "-",
                signed(diff(host, pinned)) if mine and pinned is not None else "-",
                f"seq {snap.get('seq', '?')}",
            ])
    table(out, ["mark", "pid", "role", "Keling video", "Keling host", "driver figure",
                "NVML", "NVML - driver", "PyTorch reserved", "PyTorch allocated",
                "video - reserved", "host - pinned", "snapshot"], rows)
    return pairing


def change_rows(tr, marks, pairing, miss, out):
    out.append("## Changes between a process's marks\n")
    out.append("What each step added, as Keling counted it and as PyTorch said: for "
               "known sizes the two columns of a kind should be equal.\n")
    rows, last = [], {}
    for k, m in enumerate(marks):
        if k not in pairing:
            continue
        pid = m.get("pid")
        p = tr.procs(pairing[k][1]).get(pid, {})
        now = {"video": p.get("gpu_mem_bytes", 0 if p == {} else None),
               "host": p.get("gpu_host_bytes", 0 if p == {} else None),
               "res": m.get("torch_reserved"), "pin": m.get("pinned_bytes")}
        prev = last.get(pid)
        last[pid] = now
        if prev is None:
            continue
        dv, dr = diff(now["video"], prev["video"]), diff(now["res"], prev["res"])
        dh = diff(now["host"], prev["host"])
        dp = diff(now["pin"], prev["pin"]) if now["pin"] is not None else None
        if dp is None and now["pin"] is not None and prev["pin"] is None:
            dp = now["pin"]
        verdict = "equal" if dv is not None and dv == dr else (
            f"video - reserved {signed(diff(dv, dr))}" if dv is not None and dr is not None
            else "n/a")
        rows.append([m.get("mark", "?"), pid, signed(dv), signed(dr), verdict, signed(dh),
                     signed(dp) if dp is not None else "-"])
    table(out, ["mark", "pid", "Δ Keling video", "Δ PyTorch reserved", "video vs reserved",
                "Δ Keling host", "Δ pinned (job)"], rows)


def classify(tr, miss):
    """(section, name, code, classification, detail) -> count."""
    seen = collections.Counter()

    def add(section, name, code, how, detail=""):
        seen[(section, name, code, how, detail)] += 1

    for l in tr.lines:
        t = l.get("type")
        if t == "gpu_ioctl":
            call = miss.get(l, "call", "gpu_ioctl") or "?"
            outcome = miss.get(l, "outcome", "gpu_ioctl")
            if outcome == "undecoded" or (outcome is None and "undecoded" in l):
                how = UNDECODED
                detail = l.get("undecoded") or "reason missing"
            elif outcome == "no_memory_escape":
                how, detail = NO_MEMORY, ""
            elif outcome == "decoded":
                how, detail = DECODED, "changed no memory"
            else:
                how, detail = f"outcome {outcome!r}", ""
            status, ret = l.get("status"), l.get("ret")
            failed = ""
            if status:
                failed = f"; failed, RM status {status:#x}" if is_int(status) else "; failed"
            elif ret:
                failed = f"; ioctl returned {ret}"
            add("escape", call, "", how, detail + failed)
            if is_int(l.get("class")) and l["class"]:
                add("class", class_name(l["class"]), l["class"], how,
                    f"in {call}; " + detail + failed)
            if "control_cmd" in l:
                cc = l["control_cmd"]
                name = l.get("control") or "not named by Keling"
                code = f"{cc:#x}" if is_int(cc) else str(cc)
                add("control", name, code, how, detail + failed)
        elif t == "gpu_alloc":
            cls = miss.get(l, "class", "gpu_alloc")
            nbytes = miss.get(l, "bytes", "gpu_alloc")
            kind = l.get("kind", "?")
            mem = l.get("mem_kind", "?")
            if is_int(nbytes) and nbytes > 0:
                how, detail = DECODED, f"{mem} memory ({kind})"
            else:
                how, detail = NO_MEMORY, f"0-byte {kind}"
            call = l.get("call", "RM_ALLOC?")
            add("escape", call, "", DECODED, "allocation")
            add("class", class_name(cls), cls, how, detail + f", via {call}")
        elif t == "gpu_object":
            cls = miss.get(l, "class", "gpu_object")
            add("escape", "RM_ALLOC / RM_ALLOC_MEMORY (object)", "", DECODED, "object")
            add("class", class_name(cls), cls, NO_MEMORY, f"object ({l.get('kind', '?')})")
        elif t == "gpu_free":
            add("escape", l.get("call", "RM_FREE?"), "", DECODED,
                f"free of {l.get('kind', '?')}")
        elif t == "gpu_ref":
            how = l.get("how", "?")
            if how == "dup":
                add("escape", "RM_DUP_OBJECT", "", DECODED, "0-byte reference")
            else:
                add("escape", "RM_CONTROL", "", DECODED, "import")
                add("control", "IMPORT_OBJECT(S)_FROM_FD (gpu_ref import)", "0x3d06/0x3d0c",
                    DECODED, f"0-byte reference to {l.get('mem_kind', '?')} memory")
        elif t == "gpu_export":
            add("escape", "RM_CONTROL", "", DECODED, "export")
            add("control", "EXPORT_OBJECT(S)_TO_FD (gpu_export)", "0x3d05/0x3d0b",
                DECODED, "no bytes")
        elif t == "gpu_teardown":
            add("teardown", l.get("reason", "?"), "", DECODED,
                "objects freed with their parent or file")
    return seen


def calls_section(tr, miss, out):
    seen = classify(tr, miss)
    out.append("## Escapes, RM classes and controls seen\n")
    out.append("From the `gpu_ioctl`, `gpu_alloc`, `gpu_object`, `gpu_free`, `gpu_ref`, "
               "`gpu_export` and `gpu_teardown` lines; classification as Keling made it.\n")
    for section, title in (("escape", "Escapes"), ("class", "RM classes"),
                           ("control", "RM_CONTROL commands"), ("teardown", "Teardowns")):
        rows = sorted(((k, n) for k, n in seen.items() if k[0] == section),
                      key=lambda kn: (str(kn[0][1]), str(kn[0][2]), kn[0][3], kn[0][4]))
        out.append(f"### {title}\n")
        if not rows:
            out.append("none seen\n")
            continue
        if section == "class":
            table(out, ["class", "name", "count", "Keling", "detail"],
                  [[f"{k[2]:#x}" if is_int(k[2]) else k[2], k[1], n, k[3], k[4]]
                   for k, n in rows])
        elif section == "control":
            table(out, ["control", "name", "count", "Keling", "detail"],
                  [[k[2], k[1], n, k[3], k[4]] for k, n in rows])
        else:
            table(out, ["name", "count", "Keling", "detail"],
                  [[k[1], n, k[3], k[4]] for k, n in rows])
    return seen


def final_checks(tr, miss):
    """Per pid: its last snapshot before it exited, and NVML against the driver
    figure on each GPU there."""
    res = []
    pids = sorted({q for _, s in tr.snapshots for q in tr.procs(s)})
    for pid in pids:
        end = tr.exits.get(pid)
        cands = [(i, s) for i, s in tr.snapshots if pid in tr.procs(s)
                 and (not is_int(end) or not is_int(s.get("ts_ns")) or s["ts_ns"] < end)]
        if not cands:
            continue
        i, snap = cands[-1]
        nv, note = tr.nvml_for(i)
        p = tr.procs(snap)[pid]
        gpus = per_gpu(p)
        if nv is None:
            res.append((pid, snap, None, "missing", note))
            continue
        entries = {e.get("gpu"): e for e in (nv.get("processes") or [])
                   if isinstance(e, dict) and e.get("pid") == pid}
        added = False
        for g in sorted(set(gpus) | set(entries), key=lambda g: (g is None, g or 0)):
            if g == NO_GPU:
                continue
            e = entries.get(g)
            drv = miss.get(gpus[g], "driver_bytes", "gpu_snapshot gpus[]") if g in gpus \
                else (e or {}).get("keling_driver_bytes")
            added = True
            if drv is None:
                how = "driver figure missing"
                theirs = (e or {}).get("nvml_bytes")
            elif e is None:
                theirs = 0  # NVML listed nothing and Keling had no bytes there
                how = "equal (both 0)" if not drv else "NVML lists nothing"
            else:
                theirs = e.get("nvml_bytes")
                if theirs is None:
                    how = "NVML gave no figure"
                else:
                    how = "equal" if theirs == drv else f"NVML - driver {signed(diff(theirs, drv))}"
            res.append((pid, snap, g, how, (drv, theirs, note)))
        if not added:
            res.append((pid, snap, None, "equal (both 0)", (0, 0, note)))
    return res


def main(argv):
    args, opts = [], {"--stderr": None, "--rc": None, "--info": []}
    it = iter(argv)
    for a in it:
        if a in opts:
            v = next(it, None)
            if a == "--info":
                opts[a].append(v)
            else:
                opts[a] = v
        else:
            args.append(a)
    if len(args) != 2:
        return None, "usage: report.py TRACE.jsonl JOB.out [--stderr F] [--rc N] [--info F]..."
    miss = Missing()
    out = ["# Keling gpu-check\n"]
    # Scheduler events (switches, forks, ...) are most of a trace and not used here.
    lines, bad_trace, err_trace = read_lines(
        args[0], "trace", lambda v: str(v.get("type", "")).startswith("gpu_")
        or v.get("type") in ("nvml_check", "exit", "summary"))
    job, bad_job, err_job = read_lines(args[1], "job output")
    tr = Trace(lines, miss)
    marks = [j for j in job if "mark" in j]
    infos = [j for j in job if "info" in j]
    errors = [j for j in job if "error" in j]

    out.append("## Run\n")
    for f in opts["--info"]:
        try:
            with open(f, errors="replace") as fh:
                text = fh.read().strip()
            out.append(f"`{f}`:\n\n```\n{text[:2000]}\n```\n")
        except (OSError, TypeError):
            out.append(f"`{f}`: not readable\n")
    for i in infos:
        out.append("- job: " + ", ".join(f"{k} {v}" for k, v in sorted(i.items())))
    if opts["--rc"] not in (None, "0"):
        out.append(f"- **keling trace / the job exited {opts['--rc']}**")
    for e in errors:
        out.append(f"- **job error (pid {e.get('pid')}): {e.get('error')}**")
    for err in (err_trace, err_job):
        if err:
            out.append(f"- **{err}**")
    if bad_trace:
        out.append(f"- {bad_trace} trace lines were not JSON objects (a cut-off last line?)")
    if bad_job:
        out.append(f"- {bad_job} job.out lines were not JSON objects")
    out.append(f"- {len(lines)} GPU, exit and summary lines in the trace, "
               f"{len(tr.snapshots)} gpu_snapshot, "
               f"{len(tr.nvml)} nvml_check, {len(marks)} marks")
    if tr.summary is None:
        out.append("- **the trace has no summary line** (keling trace did not end cleanly?)")
    else:
        out.append(f"- NVIDIA ioctls seen at: {tr.summary.get('ioctl_backend', 'not said')}")
        for k in ("drops", "decode_errors"):
            v = miss.get(tr.summary, k, "summary")
            if v:
                out.append(f"- **summary {k}: {v}** (the event tables may be incomplete; "
                           "the snapshot figures come from the kernel's maps and are not)")
    unseen = [m.get("mark") for m in marks if m.get("snapshot_seen") is False]
    if unseen:
        out.append(f"- marks whose snapshot the job did not see in time: {unseen}")
    if opts["--stderr"] and (errors or opts["--rc"] not in (None, "0")):
        try:
            with open(opts["--stderr"], errors="replace") as fh:
                tail = fh.read().splitlines()[-20:]
            out.append("\nLast lines of the job's stderr:\n\n```\n" + "\n".join(tail) + "\n```")
        except OSError:
            pass
    out.append("")

    pairing = mark_rows(tr, marks, miss, out)
    change_rows(tr, marks, pairing, miss, out)
    seen = calls_section(tr, miss, out)

    out.append("## After the job (summary line)\n")
    if tr.summary is not None:
        rows = []
        for p in tr.summary.get("processes") or []:
            if not isinstance(p, dict):
                continue
            rows.append([p.get("pid"), p.get("comm", ""), p.get("exit_code"),
                         b(miss.get(p, "gpu_mem_bytes", "summary process")),
                         b(p.get("gpu_mem_peak_bytes")),
                         b(miss.get(p, "gpu_host_bytes", "summary process")),
                         b(miss.get(p, "gpu_driver_bytes", "summary process")),
                         p.get("undecoded"), "yes" if p.get("gpu_mem_held_after_exit") else ""])
        table(out, ["pid", "comm", "exit", "video", "video peak", "host", "driver",
                    "undecoded", "held after exit"], rows)
    else:
        out.append("missing\n")

    out.append("## Verdict\n")
    und_lines = sum(n for k, n in seen.items() if k[3] == UNDECODED)
    if not seen:
        out.append("- **no NVIDIA call was seen in the trace**: Keling saw no GPU device, "
                   "or the job made no GPU call; nothing below is a result")
    reasons = tr.summary.get("undecoded") if tr.summary else None
    if isinstance(reasons, dict):
        total = sum(v for v in reasons.values() if is_int(v))
        by = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()) if v) or "none"
        und_ok = total == 0 and und_lines == 0
        out.append(f"- undecoded (target 0): **{total}** by the kernel's counters ({by}); "
                   f"{und_lines} undecoded call lines in the trace -> "
                   f"{'PASS' if und_ok else 'FAIL'}")
    else:
        und_ok = und_lines == 0 if tr.lines else None
        miss.seen[("summary", "undecoded")] += 1
        out.append(f"- undecoded (target 0): the summary's counters are missing; "
                   f"{und_lines} undecoded call lines in the trace -> "
                   f"{'PASS (lines only)' if und_ok else 'FAIL' if und_ok is False else 'UNKNOWN'}")
    checks = final_checks(tr, miss)
    rows, nv_ok = [], (True if checks else None)
    for pid, snap, g, how, extra in checks:
        if how == "missing":
            rows.append([pid, snap.get("seq", "?"), "", "", extra, "MISSING"])
            nv_ok = None if nv_ok is not False else nv_ok
            continue
        drv, theirs, note = extra
        ok = how.startswith("equal")
        if how == "driver figure missing":
            nv_ok = None if nv_ok is not False else nv_ok
        elif not ok:
            nv_ok = False
        rows.append([pid, snap.get("seq", "?"), gpu_name(g), b(drv),
                     b(theirs) + (f" ({note})" if note else ""),
                     how if ok else f"**{how}**"])
    out.append("- driver figure vs NVML per process at its last snapshot before it exited "
               f"(target equal): {'PASS' if nv_ok else 'FAIL' if nv_ok is False else 'UNKNOWN'}\n")
    if rows:
        table(out, ["pid", "snapshot", "GPU", "driver figure", "NVML", "result"], rows)
    else:
        out.append("  no process appears in any gpu_snapshot\n")
    job_checks = []
    exp = [m.get("expandable") for m in marks if m.get("role") == "expandable child"]
    if exp:
        job_checks.append("expandable_segments in effect in the child: "
                          + ("yes" if any(exp) else "no" if False in exp else "unknown"))
    else:
        job_checks.append("expandable_segments child: no marks")
    ipc = [m for m in marks if str(m.get("mark", "")).startswith("ipc:")]
    if ipc:
        ok = [m.get("data_ok") for m in ipc if "data_ok" in m]
        job_checks.append("IPC: consumer and producer saw each other's writes: "
                          + ("yes" if ok and all(ok) else "no" if ok else "unknown"))
    else:
        job_checks.append("IPC: no marks")
    for c in job_checks:
        out.append(f"- {c}")
    if not seen and und_ok:
        und_ok = None
    overall = "PASS" if und_ok and nv_ok and not errors else "FAIL" if (
        und_ok is False or nv_ok is False or errors) else "INCOMPLETE"
    out.append(f"\n**Overall: {overall}**\n")

    out.append("## Missing from the trace or job output\n")
    if miss.seen:
        for (where, key), n in sorted(miss.seen.items()):
            out.append(f"- `{key}` in {where} lines: missing ({n} reads)")
    else:
        out.append("nothing")
    out.append("")
    return "\n".join(out), None


if __name__ == "__main__":
    text, err = main(sys.argv[1:])
    if err:
        print(err, file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(text)
