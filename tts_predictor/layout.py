"""The batch layout that `_LocalPredictorKVCache.build_attn_metadata` computes, and its input checks.

One definition of the output contract, so that every variant is compared against the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BatchLayout:
    """Host- and device-side tensors handed to vLLM's `attn_utils.build_attn_metadata`.

    `query_start_loc` stays on the CPU (vLLM wants it there too); everything `*_device`, `block_table`,
    `positions` and `slot_mapping` live on the target device.
    """

    num_tokens: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # int32, CPU, (num_reqs + 1,)
    query_start_loc_device: torch.Tensor  # int32, device, (num_reqs + 1,)
    seq_lens_device: torch.Tensor  # int32, device, (num_reqs,)
    block_table: torch.Tensor  # int32, device, (num_reqs, blocks_per_seq)
    positions: torch.Tensor  # int64, device, (num_tokens,)
    slot_mapping: torch.Tensor  # int64, device, (num_tokens,)

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens_device.shape[0])


def check_inputs(query_lens: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, block_size: int) -> int:
    """Validate shapes and dtypes (never values: reading them would cost what the variants try to save).

    Returns num_reqs. Raises ValueError/TypeError with a message that names the offending argument.
    """
    for name, t in (("query_lens", query_lens), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D (num_reqs,), got shape {tuple(t.shape)}")
        if t.device.type != "cpu":
            raise ValueError(f"{name} must live on the CPU, got {t.device}")
    if query_lens.shape != seq_lens.shape:
        raise ValueError(f"query_lens {tuple(query_lens.shape)} and seq_lens {tuple(seq_lens.shape)} differ in shape")
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be a torch.Tensor, got {type(block_table).__name__}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise ValueError(
            f"block_table must be a 2-D int32 tensor [max_batch_size, blocks_per_seq], "
            f"got {block_table.dtype} {tuple(block_table.shape)}"
        )
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    num_reqs = int(query_lens.shape[0])
    if num_reqs > block_table.shape[0]:
        raise ValueError(f"num_reqs={num_reqs} exceeds local predictor max_batch_size={block_table.shape[0]}")
    return num_reqs


def empty_layout(block_table: torch.Tensor, device: torch.device | str) -> BatchLayout:
    """The layout of a batch with no requests (0.16.0 returns early here; so do we, identically for all)."""
    i32, i64 = torch.int32, torch.int64
    return BatchLayout(
        num_tokens=0,
        max_seq_len=0,
        query_start_loc=torch.zeros(1, dtype=i32),
        query_start_loc_device=torch.zeros(1, dtype=i32, device=device),
        seq_lens_device=torch.empty(0, dtype=i32, device=device),
        block_table=block_table[:0],
        positions=torch.empty(0, dtype=i64, device=device),
        slot_mapping=torch.empty(0, dtype=i64, device=device),
    )


def reference_layout(query_lens, seq_lens, block_table, *, block_size: int) -> dict:
    """A plain-Python statement of the semantics (docs/sources.md), used by tests as the ground truth."""
    ql, sl = [int(x) for x in query_lens], [int(x) for x in seq_lens]
    bt = block_table.cpu().tolist()
    qsl = [0]
    positions, slots = [], []
    for i, (q, s) in enumerate(zip(ql, sl, strict=True)):
        qsl.append(qsl[-1] + q)
        for p in range(s - q, s):
            positions.append(p)
            slots.append(bt[i][p // block_size] * block_size + p % block_size)
    return {
        "num_tokens": qsl[-1],
        "max_seq_len": max(sl) if sl else 0,
        "query_start_loc": qsl,
        "seq_lens": sl,
        "block_table": bt[: len(ql)],
        "positions": positions,
        "slot_mapping": slots,
    }
