"""Server telemetry during a window: blocks/<id>/telemetry.jsonl (records.TelemetrySample) at 2 Hz or more.

Three sources, each written where it can be read: "nvml" (nvidia-ml-py: utilisation, SM clock, memory used and power
of the server container's GPU(s), `GPUS` as docker/serve.sh passes it to --gpus, when NVML initialises on this host), "process" (the server's process tree from /proc: CPU % of one
core summed over its processes, and resident memory) and "host" (every CPU of this host from /proc/stat, busy % of
their capacity: a load generator, or a CPU-bound server such as the simulator, that waits for a core measures that
wait; the statistics warn when a measure window ran on a saturated host). The statistics average them over each
level's measure window. A Docker server's processes live in the container, which the host's /proc tree of `docker/serve.sh` does not
reach: there the process source sees only the docker client, and `note` says so. The sampler never raises into the
run: an error is logged once and sampling goes on (or stops quietly).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ttsrecords.records import JsonlWriter, TelemetrySample

log = logging.getLogger("loadtest.telemetry")
INTERVAL_S = 0.5  # 2 Hz: the contract's minimum rate
MIB = 2**20


def container_gpus(spec: str, count: int) -> list[int | str]:
    """The host GPUs a container started with `docker run --gpus SPEC` gets (docker/serve.sh GPUS): "all", a count
    N (the first N), or "device=0,2" (indices or GPU-UUIDs, quoted or not). Telemetry and the preflight's GPU checks
    read these only: on an 8-GPU node the other seven would dilute utilisation to 1/8 and add their power."""
    s = spec.strip().strip("'\"")
    if s == "all":
        return list(range(count))
    if s.isdigit():
        if int(s) < 1:
            raise ValueError(f"GPUS={spec}: want all, a count >= 1 or device=I[,J...]")
        return list(range(min(int(s), count)))
    if s.startswith("device="):
        out: list[int | str] = []
        for tok in s.removeprefix("device=").split(","):
            tok = tok.strip()
            if tok.isdigit() and int(tok) < count:
                out.append(int(tok))
            elif tok.startswith(("GPU-", "MIG-")):
                out.append(tok)
            else:
                raise ValueError(f"GPUS={spec}: {tok!r} is not a GPU of this host (indices 0..{count - 1} or GPU-UUIDs)")
        if out:
            return out
    raise ValueError(f"GPUS={spec}: want all, a count or device=I[,J...] (docker run --gpus)")


def gpus_spec() -> str:
    """docker/serve.sh's GPUS (default all): the GPU(s) the server's container gets."""
    return os.environ.get("GPUS") or "all"


class Nvml:
    """The server's GPUs through nvidia-ml-py; `open()` returns None where NVML does not initialise (no driver, no
    GPU). Only the GPUs of the server's container (container_gpus of GPUS) are read; `indices` are the host's."""

    def __init__(self, lib, handles: list, indices: list | None = None):
        self.lib, self.handles = lib, handles
        self.indices = indices if indices is not None else list(range(len(handles)))

    @classmethod
    def open(cls, lib=None, spec: str | None = None) -> Nvml | None:
        try:
            if lib is None:
                import pynvml as lib  # nvidia-ml-py
            lib.nvmlInit()
            chosen = container_gpus(spec or gpus_spec(), lib.nvmlDeviceGetCount())
            handles, indices = [], []
            for g in chosen:
                h = lib.nvmlDeviceGetHandleByUUID(g) if isinstance(g, str) else lib.nvmlDeviceGetHandleByIndex(g)
                handles.append(h)
                indices.append(g if isinstance(g, int) else lib.nvmlDeviceGetIndex(h))
            return cls(lib, handles, indices)
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound / DriverNotLoaded, a bad GPUS, ...
            log.info("NVML not available (%s: %s): no GPU telemetry", type(e).__name__, str(e)[:200])
            return None

    def read(self, t: float) -> list[TelemetrySample]:
        out = []
        lib = self.lib
        for i, h in zip(self.indices, self.handles, strict=True):
            out.append(TelemetrySample(
                t=t, source="nvml", gpu=i,
                gpu_util_pct=_try(lambda h=h: float(lib.nvmlDeviceGetUtilizationRates(h).gpu)),
                sm_clock_mhz=_try(lambda h=h: float(lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM))),
                mem_used_mib=_try(lambda h=h: lib.nvmlDeviceGetMemoryInfo(h).used / MIB),
                power_w=_try(lambda h=h: lib.nvmlDeviceGetPowerUsage(h) / 1000.0)))
        return out


def _try(fn: Callable[[], float]) -> float | None:
    try:
        return fn()
    except Exception:  # a counter this GPU does not support (power on some boards): unknown, not an error
        return None


class ProcessTree:
    """CPU time and resident memory of a process and all its descendants, from /proc (Linux)."""

    def __init__(self, root_pid: int, proc: str | os.PathLike = "/proc"):
        self.root = root_pid
        self.proc = Path(proc)
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._last: tuple[float, dict[tuple[int, str], float]] | None = None

    def _stat(self, pid: int) -> tuple[int, str, float] | None:
        """(ppid, start time, utime + stime in ticks) of one process; None when it is gone."""
        try:
            text = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        rest = text[text.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
        return int(rest[1]), rest[19], float(rest[11]) + float(rest[12])

    def pids(self) -> list[int]:
        """The root and its descendants (alive now)."""
        children: dict[int, list[int]] = {}
        for p in self.proc.iterdir():
            if p.name.isdigit():
                st = self._stat(int(p.name))
                if st is not None:
                    children.setdefault(st[0], []).append(int(p.name))
        out, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            if (self.proc / str(pid)).exists():
                out.append(pid)
            todo += children.get(pid, [])
        return out

    def read(self, t: float) -> TelemetrySample | None:
        """One sample: CPU % since the last read (None on the first) and RSS now; None once the tree is gone."""
        cpu: dict[tuple[int, str], float] = {}
        rss = 0.0
        for pid in self.pids():
            st = self._stat(pid)
            if st is None:
                continue
            cpu[(pid, st[1])] = st[2]
            try:
                rss += int((self.proc / str(pid) / "statm").read_text().split()[1]) * self.page
            except (OSError, IndexError, ValueError):
                pass
        if not cpu:
            return None
        pct = None
        if self._last is not None and t > self._last[0]:
            t0, before = self._last
            used = sum(v - before.get(k, 0.0) for k, v in cpu.items())  # a process born since counts from zero
            pct = 100.0 * used / self.ticks / (t - t0)
        self._last = (t, cpu)
        return TelemetrySample(t=t, source="process", cpu_pct=pct, rss_mib=rss / MIB)


class HostCpu:
    """Busy share of all CPUs of this host between two reads, from the aggregate line of /proc/stat (Linux)."""

    def __init__(self, proc: str | os.PathLike = "/proc"):
        self.stat = Path(proc) / "stat"
        self._last: tuple[float, float] | None = None  # (total, idle) jiffies at the last read

    def read(self, t: float) -> TelemetrySample | None:
        """One sample: busy % since the last read (None on the first); None where /proc/stat cannot be read."""
        try:
            fields = self.stat.read_text().splitlines()[0].split()
        except (OSError, IndexError):
            return None
        if not fields or fields[0] != "cpu":
            return None
        v = [float(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal (guest is in user)
        total, idle = sum(v), v[3] + v[4]
        pct = None
        if self._last is not None and total > self._last[0]:
            pct = 100.0 * (1.0 - (idle - self._last[1]) / (total - self._last[0]))
        self._last = (total, idle)
        return TelemetrySample(t=t, source="host", host_cpu_pct=pct)


def other_cpu_pct(host_busy_pct: float | None, cpus: int, suite_cpu_pct: float | None) -> float | None:
    """CPU the rest of the box used, % of one core: the host's busy share of all its CPUs, less what the suite's own
    process tree used over the same interval (never below 0: the two are read a moment apart)."""
    if host_busy_pct is None or suite_cpu_pct is None:
        return None
    return max(0.0, host_busy_pct * cpus - suite_cpu_pct)


class Telemetry:
    """`with Telemetry(path, pid): ...` samples every interval_s on a thread: one sample at the start, one at the
    stop, and the ones in between; every line flushed. With `suite_pid` (the runner's own pid, where the server is
    its child: the simulator and the real CPU server) the host line also says what other jobs on the box used."""

    def __init__(self, path: str | os.PathLike, root_pid: int | None, *, interval_s: float = INTERVAL_S,
                 nvml: Nvml | None = None, proc: str | os.PathLike = "/proc", clock: Callable[[], float] = time.time,
                 suite_pid: int | None = None):
        self.path = Path(path)
        self.interval_s = interval_s
        self.nvml = nvml
        self.tree = ProcessTree(root_pid, proc) if root_pid is not None and Path(proc).is_dir() else None
        self.host = HostCpu(proc) if (Path(proc) / "stat").is_file() else None
        self.suite = ProcessTree(suite_pid, proc) if suite_pid is not None and self.host is not None else None
        self.cpus = os.cpu_count() or 1
        self.clock = clock
        self.samples = 0
        self.errors: list[str] = []
        self._writer: JsonlWriter | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        """Read every source once and append its lines; an error is logged once and never raised."""
        try:
            if self._writer is None:
                self._writer = JsonlWriter(self.path)
            t = self.clock()
            rows = self.nvml.read(t) if self.nvml is not None else []
            proc = self.tree.read(t) if self.tree is not None else None
            host = self.host.read(t) if self.host is not None else None
            if host is not None and self.suite is not None:
                suite = self.suite.read(t)
                host = replace(host, other_cpu_pct=other_cpu_pct(host.host_cpu_pct, self.cpus,
                                                                 None if suite is None else suite.cpu_pct))
            for row in rows + [x for x in (proc, host) if x is not None]:
                self._writer.write(row.to_dict())
                self.samples += 1
        except Exception as e:
            if not self.errors:
                log.error("telemetry sampler: %s: %s (sampling goes on; later errors are not logged)",
                          type(e).__name__, e)
            self.errors.append(f"{type(e).__name__}: {e}")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def start(self) -> Telemetry:
        self.sample_once()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample_once()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> Telemetry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def describe(nvml: Nvml | None, backend: str) -> dict[str, Any]:
    """What the run's telemetry can and cannot see (the manifest records it)."""
    gpus = len(nvml.handles) if nvml is not None else 0
    process = ("the server's process tree (the simulator)" if backend == "sim" else
               "the server's process tree (cpu_server/serve.py and the vllm-omni processes it starts)"
               if backend == "vllm-cpu" else
               "not available: the server runs in a Docker container whose processes the host's /proc tree of "
               "docker/serve.sh does not reach (the samples show the docker client only)")
    return {"schema_of_lines": "records.TelemetrySample", "interval_s": INTERVAL_S,
            "nvml": (f"{gpus} GPU(s): host index {', '.join(map(str, nvml.indices))} (GPUS={gpus_spec()}, the "
                     "server container's own)") if gpus else
            "not available (NVML did not initialise: no driver or no GPU)",
            "process": process, "host": "every CPU of the load generator's host (/proc/stat), busy %"}
