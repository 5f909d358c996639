"""ttssim: a simulated vllm-omni 0.16.0 Qwen3-TTS server that runs the real predictor variants (the embedded default
backend of the load-test suite). See ttssim.engine (step loop), ttssim.server (HTTP API), ttssim.model (step-time
model), configs/sim/default.yaml (the calibrated parameters and their sources)."""

__version__ = "0.1.0"
