"""How much memory a block of the GPU check holds at its peak, on CUDA or on a CPU."""

from __future__ import annotations

import contextlib
import ctypes
import resource
import threading

import torch
from sync_check import device_sync


class PeakMemory:
    """Peak memory growth while the block runs: CUDA's allocator peak, or on a CPU the resident set
    sampled every millisecond (torch's CPU tensors bypass Python's allocator, so tracemalloc misses them)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak, self._stop = device, 0, threading.Event()

    def __enter__(self) -> PeakMemory:
        device_sync(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._base = self.peak = rss_bytes()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *_: object) -> None:
        device_sync(self.device)
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, rss_bytes())
        self.peak = max(self.peak - self._base, resource.getpagesize())


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def return_freed_memory() -> None:
    """Have glibc hand large freed blocks back at once (as MALLOC_MMAP_THRESHOLD_ does in
    benchmarks/hf_engine), so the CPU's resident set shows what is held, not what the allocator kept."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).mallopt(-3, 131072)  # M_MMAP_THRESHOLD
