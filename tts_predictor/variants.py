"""Three implementations of the host-side batch layout of vllm-omni 0.16.0's code predictor.

`VARIANTS[name](query_lens, seq_lens, block_table, *, block_size, device) -> BatchLayout`

- original:   vllm-omni 0.16.0 as released: per-request `.item()`, one block-table `.item()` per token,
              four blocking host-to-device copies. GPU syncs per call: T + 4 (T = tokens).
- fixed:      vllm-omni PR #1614: one `.tolist()` per input, the block table pulled to the host with one
              `.cpu()`, same four blocking copies. Syncs: 5.
- vectorized: ours: tensor ops only, block-table gather on the device, one non-blocking copy from a
              pinned staging buffer. Syncs: 0.

All three return identical values, dtypes and devices (tests/test_variants.py proves it).
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
import torch

from .layout import BatchLayout, check_inputs, empty_layout

_I32, _I64 = torch.int32, torch.int64


def original(query_lens, seq_lens, block_table, *, block_size: int, device) -> BatchLayout:
    """vllm-omni 0.16.0, element by element, including its cost."""
    num_reqs = check_inputs(query_lens, seq_lens, block_table, block_size)
    if num_reqs == 0:
        return empty_layout(block_table, device)
    query_lens_i32 = query_lens.to(dtype=_I32, device="cpu")
    seq_lens_i32 = seq_lens.to(dtype=_I32, device="cpu")

    qsl = torch.zeros((num_reqs + 1,), dtype=_I32, device="cpu")
    qsl[1:] = torch.cumsum(query_lens_i32, dim=0)
    num_tokens = int(qsl[-1].item())

    pos_list: list[torch.Tensor] = []
    for i in range(num_reqs):
        ql = int(query_lens_i32[i].item())
        sl = int(seq_lens_i32[i].item())
        pos_list.append(torch.arange(sl - ql, sl, dtype=_I64))
    positions_cpu = torch.cat(pos_list, dim=0)

    slot_mapping = torch.empty((num_tokens,), dtype=_I64, device="cpu")
    cursor = 0
    for i in range(num_reqs):
        ql = int(query_lens_i32[i].item())
        sl = int(seq_lens_i32[i].item())
        for p in range(sl - ql, sl):
            block_id = int(block_table[i, p // block_size].item())
            slot_mapping[cursor] = block_id * block_size + p % block_size
            cursor += 1

    max_seq_len = int(seq_lens_i32[:num_reqs].max().item())
    return BatchLayout(
        num_tokens=num_tokens,
        max_seq_len=max_seq_len,
        query_start_loc=qsl,
        query_start_loc_device=qsl.to(device=device),
        seq_lens_device=seq_lens_i32.to(device=device),
        block_table=block_table[:num_reqs].contiguous(),
        positions=positions_cpu.to(device=device),
        slot_mapping=slot_mapping.to(device=device),
    )


def fixed(query_lens, seq_lens, block_table, *, block_size: int, device) -> BatchLayout:
    """vllm-omni PR #1614: the same loops as 0.16.0, but over lists read once with `.tolist()`.

    The whole `num_reqs x blocks_per_seq` block table crosses to the host on every call, which is why this
    variant loses its advantage when sequences span many blocks.
    """
    num_reqs = check_inputs(query_lens, seq_lens, block_table, block_size)
    if num_reqs == 0:
        return empty_layout(block_table, device)
    query_lens_i32 = query_lens.to(dtype=_I32, device="cpu")
    seq_lens_i32 = seq_lens.to(dtype=_I32, device="cpu")

    qsl = torch.zeros((num_reqs + 1,), dtype=_I32, device="cpu")
    qsl[1:] = torch.cumsum(query_lens_i32, dim=0)
    num_tokens = int(qsl[-1].item())

    ql_list = query_lens_i32.tolist()
    sl_list = seq_lens_i32.tolist()
    bt_list = block_table[:num_reqs].cpu().tolist()

    pos_list: list[torch.Tensor] = []
    for i in range(num_reqs):
        pos_list.append(torch.arange(sl_list[i] - ql_list[i], sl_list[i], dtype=_I64))
    positions_cpu = torch.cat(pos_list, dim=0)

    slot_mapping = torch.empty((num_tokens,), dtype=_I64, device="cpu")
    cursor = 0
    for i in range(num_reqs):
        row = bt_list[i]
        for p in range(sl_list[i] - ql_list[i], sl_list[i]):
            slot_mapping[cursor] = row[p // block_size] * block_size + p % block_size
            cursor += 1

    max_seq_len = max(sl_list)
    return BatchLayout(
        num_tokens=num_tokens,
        max_seq_len=max_seq_len,
        query_start_loc=qsl,
        query_start_loc_device=qsl.to(device=device),
        seq_lens_device=seq_lens_i32.to(device=device),
        block_table=block_table[:num_reqs].contiguous(),
        positions=positions_cpu.to(device=device),
        slot_mapping=slot_mapping.to(device=device),
    )


class _StagingPool:
    """Reusable pinned host buffers for non-blocking uploads to one device.

    A buffer is handed out again only once the CUDA event recorded behind its last copy has completed
    (`event.query()` never synchronises); if none is free a new one is allocated. The host never waits and
    never overwrites memory that a pending copy still reads.
    """

    def __init__(self, keep: int = 8) -> None:
        self._free: deque[tuple[torch.Tensor, object]] = deque()
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            for _ in range(len(self._free)):
                buf, event = self._free.popleft()
                if buf.numel() >= nbytes and event.query():
                    return buf
                self._free.append((buf, event))
        return torch.empty(1 << max(10, (nbytes - 1).bit_length()), dtype=torch.uint8, pin_memory=True)

    def give_back(self, buf: torch.Tensor, device: torch.device) -> None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        with self._lock:
            self._free.append((buf, event))
            while len(self._free) > self._keep:
                self._free.popleft()


_POOLS: dict[str, _StagingPool] = {}


def _pool_for(device: torch.device) -> _StagingPool:
    pool = _POOLS.get(str(device))
    return pool if pool is not None else _POOLS.setdefault(str(device), _StagingPool())


def vectorized(query_lens, seq_lens, block_table, *, block_size: int, device) -> BatchLayout:
    """No Python loop over requests or tokens, no host read of a device tensor, zero synchronisations.

    Host (numpy over the two small CPU inputs, about a microsecond an operation): prefix sums, positions,
    and for every token its flat block-table index and in-block offset. Device: one gather from the block
    table where it lives and one add. On a GPU the host arrays travel in one non-blocking upload from a
    pinned staging buffer; on the CPU they are wrapped without a copy.
    """
    num_reqs = check_inputs(query_lens, seq_lens, block_table, block_size)
    if num_reqs == 0:
        return empty_layout(block_table, device)
    n = num_reqs
    if n == 1:  # a lone request: scalar arithmetic, a third fewer operations
        (q,), (s,) = query_lens.tolist(), seq_lens.tolist()  # CPU inputs: host reads, no sync
        qsl = np.array((0, q), dtype=np.int32)
        num_tokens, max_seq_len = q, s
        sl = seq_lens.numpy()
        pos = np.arange(s - q, s, dtype=np.int64)
        flat, off = np.divmod(pos, block_size)
    else:
        ql = query_lens.numpy()
        sl = seq_lens.numpy()
        qsl = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(ql, out=qsl[1:])
        num_tokens = int(qsl[n])
        max_seq_len = int(sl.max())
        bps = block_table.shape[1]
        q = num_tokens // n
        if q * n == num_tokens and int(ql.max()) == q:
            # every request has the same query length (all decodes, or all prefills): no repeat needed
            # (n values, none above q, summing to n*q, are all q)
            start = sl.astype(np.int64)
            start -= q
            pos = start if q == 1 else (start[:, None] + np.arange(q, dtype=np.int64)).ravel()
            flat, off = np.divmod(pos, block_size)
            rows = np.arange(0, n * bps, bps, dtype=np.int64)
            flat += rows if q == 1 else np.repeat(rows, q)
        else:
            # token k of request r sits at position seq_len[r] - query_len[r] + (k - qsl[r])
            shift = sl.astype(np.int64)
            shift -= ql
            shift -= qsl[:n]
            pos = np.repeat(shift, ql)
            pos += np.arange(num_tokens, dtype=np.int64)
            flat, off = np.divmod(pos, block_size)
            flat += np.repeat(np.arange(0, n * bps, bps, dtype=np.int64), ql)

    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type == "cpu":
        qsl_host = torch.from_numpy(qsl)
        qsl_d, seq_d = qsl_host, seq_lens
        pos_d, off_d, flat_d = torch.from_numpy(pos), torch.from_numpy(off), torch.from_numpy(flat)
    else:
        qsl_host = torch.from_numpy(qsl)
        qsl_d, seq_d, pos_d, off_d, flat_d = _upload(dev, qsl, sl, pos, off, flat)
    # slot = block id (gathered where the table lives) * block_size + offset; off_d is this call's own memory
    slot_mapping = off_d.add_(torch.take(block_table, flat_d), alpha=block_size)
    return BatchLayout(
        num_tokens=num_tokens,
        max_seq_len=max_seq_len,
        query_start_loc=qsl_host,
        query_start_loc_device=qsl_d,
        seq_lens_device=seq_d,
        block_table=block_table[:n].contiguous(),
        positions=pos_d,
        slot_mapping=slot_mapping,
    )


def _upload(dev: torch.device, qsl, sl, pos, off, flat) -> tuple[torch.Tensor, ...]:
    """One non-blocking host-to-device copy of all five arrays through a pooled pinned buffer.

    Layout [pos i64 | off i64 | flat i64 | qsl i32 | seq_lens i32] keeps every segment aligned; the device
    tensors returned are views of the single uploaded buffer.
    """
    t, n = pos.shape[0], sl.shape[0]
    sizes = (8 * t, 8 * t, 8 * t, 4 * (n + 1), 4 * n)
    nbytes = sum(sizes)
    pool = _pool_for(dev)
    staging = pool.take(nbytes)
    raw = staging.numpy()
    bounds = np.cumsum((0,) + sizes)
    raw[bounds[0] : bounds[1]].view(np.int64)[:] = pos
    raw[bounds[1] : bounds[2]].view(np.int64)[:] = off
    raw[bounds[2] : bounds[3]].view(np.int64)[:] = flat
    raw[bounds[3] : bounds[4]].view(np.int32)[:] = qsl
    raw[bounds[4] : bounds[5]].view(np.int32)[:] = sl
    uploaded = staging[:nbytes].to(dev, non_blocking=True)
    pool.give_back(staging, dev)
    pos_d, off_d, flat_d, qsl_d, seq_d = uploaded.split_with_sizes(sizes)
    return qsl_d.view(_I32), seq_d.view(_I32), pos_d.view(_I64), off_d.view(_I64), flat_d.view(_I64)


VARIANTS = {"original": original, "fixed": fixed, "vectorized": vectorized}
