"""A short probe of this host's speed, for the CPU profile scaled to it (``hardware=auto``).

A CPU profile (``conf/hardware/cpu_gloo_local.yaml``) is fitted to one machine; another host of
the same class runs every cell faster or slower by one factor (issue 40: 0 of 20 unseen cells
within ±30 % on a host ~1.6x faster than the fit host, 20 of 20 after one speed factor). The
profile's terms are of three kinds, so the probe measures one figure for each, on one core (a
rank of a CPU cell runs on one thread, `lcab.bench.worker`):

* **attention** — an attention block (QKᵀ, softmax, ·V) in float32, GFLOP/s: scales the kernel
  plateaus (``kernels.*.fwd_tflops``, ``bwd_tflops``) and ``matmul_tflops``;
* **memory** — a large tensor copy, GB/s: scales ``memory_gbps`` (merges and accumulators);
* **loopback** — bytes sent through a TCP socket on 127.0.0.1, GB/s: scales the links (gloo on
  one host is TCP over loopback).

Each figure is the best of many short repetitions (the machine's own speed: a repetition that
other work interrupted is slower, never faster); the attention and copy figures are timed on
the thread's own CPU clock, so time spent waiting for a core that other processes hold does not
count (the loopback figure, two threads and the kernel, is wall time). The profile's
``host_probe`` section holds the same figures for the host it was fitted on;
`lcab.plan.hardware.auto_profile` multiplies each term by this host's figure over that one. The
probe takes about 3.5 seconds (2.5 of them `ATTENTION_SPAN_S`) and is cached per host
(hostname, CPU model, cores, torch version) in ``$LCAB_CACHE_DIR`` or ``~/.cache/lcab/``;
``python -m lcab.plan.host_probe`` prints the figures.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

PROBE_VERSION = 4
"""Bumped when what the probe measures changes (older cache entries are measured again)."""

MAX_AGE_S = 7 * 24 * 3600.0
"""A cached probe older than this is measured again (a host's load and clocks change; one probe
taken while the host was busy does not stay for ever)."""


@dataclass(frozen=True)
class HostFigures:
    """One host's probe figures (see module docstring)."""

    attention_gflops: float
    memory_gbps: float
    loopback_gbps: float


def cache_dir() -> Path:
    """``$LCAB_CACHE_DIR``, else ``~/.cache/lcab``."""
    env = os.environ.get("LCAB_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "lcab"


def host_key() -> str:
    """What identifies a host's speed: hostname, CPU model, core count, torch version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")  # without importing torch (seconds on a slow host)
    except PackageNotFoundError:
        torch_version = "none"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{socket.gethostname()}|{model}|{os.cpu_count()}|torch {torch_version}"


#: Seconds of calls before a figure is taken (the first calls fault in memory).
WARMUP_S = 0.3

#: Seconds over which the attention figure is sampled. On the 2-core VMs this project runs on,
#: a fresh process sometimes runs matrix products at a third of the host's speed for its first
#: 1-1.5 s, whatever the buffers (29 against 83-88 GFLOP/s on the same idle host, 2026-11-27;
#: in one process in three, the first five rounds of fresh buffers were slow, the sixth fast).
#: The best round over 2.5 s is the host's speed; one short sample was not.
ATTENTION_SPAN_S = 2.5


def _best(run: Callable[[], float], repeats: int, warmup_s: float = WARMUP_S) -> float:
    """The largest rate of ``repeats`` runs (each returns a rate), after ``warmup_s`` of runs."""
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        run()
    return max(run() for _ in range(repeats))


def probe_attention(
    tokens: int = 512, heads: int = 8, head_dim: int = 32, span_s: float = ATTENTION_SPAN_S
) -> float:
    """GFLOP/s of a float32 attention block on one thread (4·h·S²·d FLOPs a call).

    The best round of 10 calls on fresh buffers over ``span_s`` seconds (`ATTENTION_SPAN_S`).
    """
    import torch

    flops = 4 * heads * tokens * tokens * head_dim

    def round_of_calls() -> float:
        q, k, v = (torch.randn(heads, tokens, head_dim) for _ in range(3))
        best = 0.0
        for _ in range(10):
            start = time.thread_time()  # this thread's CPU time: others' load is not in it
            torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v
            best = max(best, flops / max(time.thread_time() - start, 1e-9) / 1e9)
        return best

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start, best = time.perf_counter(), round_of_calls()
        while time.perf_counter() - start < span_s:
            best = max(best, round_of_calls())
        return best
    finally:
        torch.set_num_threads(threads)


def probe_memory(mib: int = 64) -> float:
    """GB/s of a tensor copy (bytes read + written) on one thread."""
    import torch

    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)

    def once() -> float:
        start = time.thread_time()
        dst.copy_(src)
        return 2 * src.numel() * 4 / max(time.thread_time() - start, 1e-9) / 1e9

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _best(once, 10)
    finally:
        torch.set_num_threads(threads)


def probe_loopback(mib: int = 64) -> float:
    """GB/s through a TCP socket on 127.0.0.1 (one sender thread, one receiver).

    64 MiB a send: with 16 MiB the best of 8 sends read 2.8-4.8 GB/s in eight fresh processes
    on one idle host, with 64 MiB 2.2-2.5 (2026-11-27); the short sends sometimes finish in a
    burst the sustained rate of a gloo transfer never reaches.
    """
    payload = b"\0" * (mib * 2**20)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sender = socket.create_connection(("127.0.0.1", port))
        receiver, _ = server.accept()
    with sender, receiver:
        buffer = bytearray(4 * 2**20)

        def once() -> float:
            thread = threading.Thread(target=sender.sendall, args=(payload,))
            start = time.perf_counter()
            thread.start()
            left = len(payload)
            while left:
                left -= receiver.recv_into(buffer, min(len(buffer), left))
            thread.join()
            return len(payload) / (time.perf_counter() - start) / 1e9

        once()
        return _best(once, 8)


def measure() -> HostFigures:
    """The figures of the host this runs on, measured now (about a second)."""
    return HostFigures(probe_attention(), probe_memory(), probe_loopback())


def available_cores() -> int:
    """Cores this process may run on (its affinity where the OS tells, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_busy() -> bool:
    """Whether other work holds the cores: the last minute's load average above their count."""
    try:
        return os.getloadavg()[0] > available_cores()
    except OSError:
        return False


def host_figures(fresh: bool = False) -> HostFigures:
    """The figures of the host this runs on: cached for this host, else measured (and cached).

    An entry older than `MAX_AGE_S` is measured again, and so is everything when the cache
    cannot be read (a cache that cannot be written is not an error either). Figures measured
    while the host is busy (`host_busy`) are used but not cached, unless ``fresh`` asked for them.
    """
    path = cache_dir() / "host_probe.json"
    key = f"{host_key()}|v{PROBE_VERSION}"
    try:
        cached = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    entry = cached.get(key)
    if not fresh and isinstance(entry, dict):
        try:
            if time.time() - float(entry["measured_at"]) < MAX_AGE_S:
                return HostFigures(**entry["figures"])
        except (KeyError, TypeError, ValueError):
            pass
    figures = measure()
    if host_busy() and not fresh:  # a loaded host's figures are not its speed: use them once
        return figures
    cached[key] = {"figures": asdict(figures), "measured_at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1))
        tmp.replace(path)
    except OSError:
        pass
    return figures
