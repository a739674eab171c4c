"""Real PyTorch memory patterns with known sizes, for `cargo xtask gpu-check`.

Run as `keling trace ... -- python3 job.py`. Phases, each ending in marks:
  main process     context; the caching allocator (known sizes, a free that stays
                   cached, empty_cache); pinned host memory (pin_memory=True)
  child process    the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
                   (set before CUDA starts in that process)
  IPC              this process allocates a CUDA tensor and shares it with a
                   consumer started by torch.multiprocessing (spawn); the consumer
                   writes to it; both mark while it is shared; both release.

A mark asks `keling trace` for a GPU snapshot (SIGUSR1 to its pid, passed down to
every child in KELING_GPU_CHECK_PID) and waits until the snapshot is in the trace
(KELING_GPU_CHECK_TRACE, when run.sh sets it; else a fixed sleep), then writes one
JSON line to stdout: pid, mark, t_ns (CLOCK_MONOTONIC, the trace's clock: report.py
pairs each mark with the first snapshot after it) and what PyTorch believes it holds.
Children write to the same stdout. Errors: a JSON line {"error": ...} and exit 2.
"""
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time

MIB = 1 << 20
CACHING_MIB = [64, 256, 1024]  # the 256 MiB block is freed and stays cached
EXPANDABLE_MIB = [64, 256]
PINNED_MIB = 64
IPC_MIB = 64
TIMEOUT_S = 90  # each wait for another process; the whole job ends within 5x
PID_ENV = "KELING_GPU_CHECK_PID"
TRACE_ENV = "KELING_GPU_CHECK_TRACE"
SNAPSHOT = b'"gpu_snapshot"'  # the type field's value; serde writes no spaces, others may


def emit(obj):
    """One line, one write(2): lines of several processes never interleave."""
    os.write(1, (json.dumps(obj, sort_keys=True) + "\n").encode())


def fail(msg, code=2):
    emit({"error": msg, "pid": os.getpid()})
    print(f"job.py: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


_KELING = []


def keling_pid():
    """The pid of `keling trace`: from the environment (children), else our parent
    when it is keling (the main process sets the environment for its children)."""
    if os.environ.get(PID_ENV):
        return int(os.environ[PID_ENV])
    if _KELING:
        return _KELING[0]
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = "?"
    if comm != "keling":
        print(f"job.py: parent {ppid} is {comm!r}, not keling: marks send no signal",
              file=sys.stderr, flush=True)
        ppid = None
    _KELING.append(ppid)
    return ppid


def wait_for_snapshot(path, offset, deadline_s=10.0):
    """True once a gpu_snapshot line appears in the trace after `offset`, False
    after the deadline, None when the trace cannot be read."""
    tail = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            time.sleep(1.0)  # cannot watch the trace: give keling time instead
            return None
        if SNAPSHOT in tail + data:
            return True
        offset += len(data)
        tail = (tail + data)[-len(SNAPSHOT):]
        time.sleep(0.05)
    return False


def torch_figures(torch):
    d = {"torch_reserved": None, "torch_allocated": None}
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        d["torch_reserved"] = torch.cuda.memory_reserved()
        d["torch_allocated"] = torch.cuda.memory_allocated()
        try:
            segs = torch.cuda.memory_snapshot()
            d["torch_segments"] = len(segs)
            flags = [s.get("is_expandable") for s in segs if "is_expandable" in s]
            d["expandable"] = any(flags) if flags else None
        except Exception as e:  # older or newer torch: say so, go on
            d["torch_segments_error"] = repr(e)
    host_stats = getattr(torch.cuda, "host_memory_stats", None)
    if host_stats is not None:
        try:
            s = host_stats()
            for k in ("reserved_bytes.current", "allocated_bytes.current"):
                if k in s:
                    d["torch_host_" + k.split(".")[0]] = s[k]
        except Exception:
            pass
    return d


def mark(torch, name, role, **extra):
    figures = torch_figures(torch)  # synchronizes first: the driver has it all
    target = keling_pid()
    trace = os.environ.get(TRACE_ENV)
    offset = None
    if trace:
        try:
            offset = os.path.getsize(trace)
        except OSError:
            offset = None
    t_ns = time.monotonic_ns()
    seen = None
    if target is not None:
        try:
            os.kill(target, signal.SIGUSR1)
        except OSError as e:
            fail(f"cannot signal keling (pid {target}): {e}")
        if offset is not None:
            seen = wait_for_snapshot(trace, offset)
        else:
            time.sleep(1.0)
    emit(dict(figures, mark=name, role=role, pid=os.getpid(), ppid=os.getppid(),
              t_ns=t_ns, snapshot_seen=seen, **extra))


def import_torch():
    try:
        import torch
    except Exception as e:
        fail(f"cannot import torch: {e!r}")
    if not torch.cuda.is_available():
        fail("CUDA is unavailable to torch (no GPU, no driver, or a CPU-only build): "
             f"torch {torch.__version__}, CUDA build {torch.version.cuda}")
    return torch


def caching(torch, role, sizes_mib, pinned):
    """Allocations of known sizes; a free that stays cached; empty_cache."""
    torch.empty(1, device="cuda")
    mark(torch, "context", role)
    bufs = {}
    for mib in sizes_mib:
        bufs[mib] = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
        mark(torch, f"alloc {mib} MiB", role, requested_bytes=mib * MIB)
    freed = sizes_mib[1]
    del bufs[freed]
    mark(torch, f"free {freed} MiB (stays cached)", role)
    torch.cuda.empty_cache()
    mark(torch, "empty_cache", role)
    bufs.clear()
    torch.cuda.empty_cache()
    mark(torch, "all freed, empty_cache", role)
    if not pinned:
        return
    p = torch.empty(PINNED_MIB * MIB, dtype=torch.uint8, pin_memory=True)
    p.fill_(1)
    if not p.is_pinned():
        fail("torch.empty(pin_memory=True) returned unpinned memory")
    mark(torch, f"pinned {PINNED_MIB} MiB", role, pinned_bytes=PINNED_MIB * MIB)
    del p
    empty_host = getattr(torch._C, "_host_emptyCache", None)
    if empty_host is not None:
        empty_host()
    mark(torch, "pinned freed", role, pinned_bytes=0 if empty_host else None,
         host_cache_emptied=empty_host is not None)


def ipc_consumer(queue, consumed, release, expect):
    """Spawned: maps the producer's tensor, writes to it, marks, releases. The tensor
    comes through a queue, not as an argument: the Process object would keep an
    argument alive until exit."""
    faulthandler.dump_traceback_later(3 * TIMEOUT_S, exit=True)
    import torch
    try:
        t = queue.get(timeout=TIMEOUT_S)
    except Exception as e:
        fail(f"ipc consumer: no tensor from the producer: {e!r}")
    t.add_(1.0)
    torch.cuda.synchronize()
    ok = float(t[0].item()) == expect
    mark(torch, "ipc: consumer mapped and wrote", "ipc consumer",
         shared_bytes=t.numel() * t.element_size(), data_ok=ok)
    consumed.set()
    if not release.wait(TIMEOUT_S):
        fail("ipc consumer: the producer never said release")
    del t
    import gc
    gc.collect()
    torch.cuda.synchronize()
    mark(torch, "ipc: consumer released", "ipc consumer")


def ipc_producer(torch, role):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    n = IPC_MIB * MIB // 4
    t = torch.full((n,), 1.0, dtype=torch.float32, device="cuda")
    mark(torch, "ipc: producer allocated", role, requested_bytes=IPC_MIB * MIB)
    queue, consumed, release = ctx.Queue(), ctx.Event(), ctx.Event()
    sys.stdout.flush()
    p = ctx.Process(target=ipc_consumer, args=(queue, consumed, release, 2.0))
    p.start()
    queue.put(t)  # pickled by torch's reductions: a CUDA IPC handle, not the data
    if not consumed.wait(TIMEOUT_S):
        p.kill()
        fail("ipc: the consumer did not map the tensor in time")
    torch.cuda.synchronize()
    ok = float(t[0].item()) == 2.0
    mark(torch, "ipc: both hold it", role, shared_bytes=IPC_MIB * MIB, data_ok=ok)
    release.set()
    p.join(TIMEOUT_S)
    if p.exitcode is None:
        p.kill()
        fail("ipc: the consumer did not end in time")
    if p.exitcode != 0:
        fail(f"ipc: the consumer exited {p.exitcode}")
    del t
    torch.cuda.ipc_collect()  # blocks the consumer held, kept until it let go
    torch.cuda.empty_cache()
    mark(torch, "ipc: producer released", role)


def expandable_child():
    """Re-run of this file with the allocator setting in its environment."""
    faulthandler.dump_traceback_later(3 * TIMEOUT_S, exit=True)
    torch = import_torch()
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    caching(torch, "expandable child", EXPANDABLE_MIB, pinned=False)
    emit({"info": "expandable child", "pid": os.getpid(), "alloc_conf": conf})


def main():
    faulthandler.dump_traceback_later(5 * TIMEOUT_S, exit=True)
    target = keling_pid()
    if target is not None:
        os.environ[PID_ENV] = str(target)  # for every child and grandchild
    torch = import_torch()
    emit({"info": "job", "pid": os.getpid(), "keling_pid": target,
          "torch": torch.__version__, "cuda": torch.version.cuda,
          "device": torch.cuda.get_device_name(0),
          "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")})
    caching(torch, "main", CACHING_MIB, pinned=True)

    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    sys.stdout.flush()
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--expandable"],
                           env=env, timeout=3 * TIMEOUT_S)
    except subprocess.TimeoutExpired:
        fail("the expandable_segments child did not end in time")
    if r.returncode != 0:
        fail(f"the expandable_segments child exited {r.returncode}")
    mark(torch, "expandable child ended", "main")

    ipc_producer(torch, "main")
    emit({"info": "done", "pid": os.getpid()})


if __name__ == "__main__":
    if sys.argv[1:] == ["--expandable"]:
        expandable_child()
    else:
        main()
