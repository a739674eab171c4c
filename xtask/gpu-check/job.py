"""A short PyTorch job with known allocations, for `cargo xtask gpu-check`.

At each mark it asks Keling (its parent, `keling trace`) for a GPU snapshot with
SIGUSR1, then prints what PyTorch believes it holds, so report.py can put
Keling's per-process bytes, NVML's and PyTorch's side by side.
"""
import json
import os
import signal
import time

import torch

SIZES_MIB = [64, 256, 1024]


def mark(name):
    torch.cuda.synchronize()
    os.kill(os.getppid(), signal.SIGUSR1)
    time.sleep(0.5)
    print(json.dumps({
        "mark": name,
        "pid": os.getpid(),
        "torch_reserved": torch.cuda.memory_reserved(),
        "torch_allocated": torch.cuda.memory_allocated(),
    }), flush=True)


def main():
    torch.empty(1, device="cuda")
    mark("context")
    bufs = []
    for mib in SIZES_MIB:
        bufs.append(torch.empty(mib << 20, dtype=torch.uint8, device="cuda"))
        mark(f"alloc {mib} MiB")
    del bufs
    torch.cuda.empty_cache()
    mark("freed")


if __name__ == "__main__":
    main()
