"""The code under test: variants of vllm-omni 0.16.0's code-predictor batch layout.

Shared by the vLLM plugin (inside the real server) and the simulator, so both run the same code.
Importing this package needs only torch.
"""

__version__ = "0.1.0"
