"""The omni AR (talker) and generation (code2wav) workers on vLLM's CPUWorker.

vllm-omni 0.16.0's GPU workers refuse any device but cuda (vllm_omni/worker/gpu_ar_worker.py and
gpu_generation_worker.py, init_device). vLLM's CPUWorker sets the CPU up (threads, gloo, seed) and builds a
CPUModelRunner; we then replace that runner by the omni runner combined with CPUModelRunner, the way vllm-omni's own
XPU port swaps in its runners. One more gap: OmniGPUModelRunner.load_model sizes the talker-MTP buffers with
max(max_num_reqs, compilation_config.max_cudagraph_capture_size), which is None without CUDA graphs.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.mixins import OmniWorkerMixin


class _NoCudaGraphSizes:
    """Before the omni load_model runs: no CUDA graphs on a CPU, so no capture size (0, not None)."""

    def load_model(self, *args, **kwargs) -> None:
        if self.compilation_config.max_cudagraph_capture_size is None:
            self.compilation_config.max_cudagraph_capture_size = 0
        super().load_model(*args, **kwargs)


# MRO: ours -> omni runner -> OmniGPUModelRunner -> CPUModelRunner -> GPUModelRunner: the omni hooks wrap the
# CPU runner's construction (CUDA stream/event placeholders, CPU tensors), loading and warm-up
class CpuARModelRunner(_NoCudaGraphSizes, GPUARModelRunner, CPUModelRunner):
    pass


class CpuGenerationModelRunner(_NoCudaGraphSizes, GPUGenerationModelRunner, CPUModelRunner):
    pass


# model_runner_cls: vllm-omni 0.30.0 checks a worker's runner class before it starts a stage with a connector
# (vllm_omni/worker/omni_connector_validation.py); 0.16.0 does not read it
class CpuARWorker(OmniWorkerMixin, CPUWorker):
    """Talker stage."""

    model_runner_cls = CpuARModelRunner

    def init_device(self) -> None:
        super().init_device()
        self.model_runner = self.model_runner_cls(self.vllm_config, torch.device("cpu"))


class CpuGenerationWorker(OmniWorkerMixin, CPUWorker):
    """code2wav stage."""

    model_runner_cls = CpuGenerationModelRunner

    def init_device(self) -> None:
        super().init_device()
        self.model_runner = self.model_runner_cls(self.vllm_config, torch.device("cpu"))
