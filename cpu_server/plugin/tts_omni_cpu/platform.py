"""vllm-omni's OmniPlatform for the CPU: vLLM's CpuPlatform plus the omni interface, which 0.16.0 has only for
cuda, rocm, npu and xpu (vllm_omni/platforms/__init__.py). The workers are ours (tts_omni_cpu.workers)."""

from __future__ import annotations

import psutil
import torch
from vllm.platforms.cpu import CpuPlatform
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum


class CpuOmniPlatform(OmniPlatform, CpuPlatform):
    # 0.16.0's enum has no CPU member; UNSPECIFIED answers False to is_cuda/is_npu/is_xpu/is_rocm, as a CPU should
    _omni_enum = OmniPlatformEnum.UNSPECIFIED

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return "tts_omni_cpu.workers.CpuARWorker"

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return "tts_omni_cpu.workers.CpuGenerationWorker"

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/model_executor/stage_configs"

    @classmethod
    def get_diffusion_attn_backend_cls(cls, selected_backend: str | None, head_size: int) -> str:
        from vllm_omni.diffusion.attention.backends.registry import DiffusionAttentionBackendEnum

        if selected_backend is not None:
            return DiffusionAttentionBackendEnum[selected_backend.upper()].get_path()
        return DiffusionAttentionBackendEnum.TORCH_SDPA.get_path()

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        return int(psutil.virtual_memory().available)
