"""The sync observer measures each variant's closed form, and catches syncs nobody declared."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_predictor.metrics import expected_syncs, syncs_per_call, syncs_per_step
from tts_predictor.sync_observer import SyncObserver
from tts_predictor.variants import VARIANTS


def _observe(name, query, seq, table, block_size=16):
    obs = SyncObserver("cpu")
    ql, sl = torch.tensor(query, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32)
    with obs.observe(device_tensors=[table]) as count:
        VARIANTS[name](ql, sl, table, block_size=block_size, device=obs.device)
    return count


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.sampled_from(sorted(VARIANTS)))
def test_closed_forms_per_call(query, name):
    table = torch.arange(64 * 4, dtype=torch.int32).reshape(64, 4)
    seq = [q + 3 for q in query]
    count = _observe(name, query, seq, table)
    tokens = sum(query)
    assert count.syncs == syncs_per_call(name, tokens) == expected_syncs(name, 1, tokens)


def test_signature_by_kind():
    table = torch.arange(16 * 2, dtype=torch.int32).reshape(16, 2)
    original = _observe("original", [1] * 8, [5] * 8, table)
    assert (original.reads, original.blocking_uploads) == (8, 4)
    fixed = _observe("fixed", [1] * 8, [5] * 8, table)
    assert (fixed.reads, fixed.blocking_uploads) == (1, 4)  # one .cpu() of the block table
    assert _observe("vectorized", [1] * 8, [5] * 8, table).syncs == 0


def test_an_upload_on_the_cpu_leaves_the_host_tensor_a_host_tensor():
    """On a GPU, x.to(device) is a new tensor and x stays on the host; on the CPU .to() returns x itself. Reading x
    afterwards (vLLM's CPU attention builder reads the host query_start_loc) is no sync; reading the upload is."""
    obs = SyncObserver("cpu")
    with obs.observe() as count:
        host = torch.arange(4, dtype=torch.int32)
        dev = host.to(device=obs.device)
        assert int(host[-1]) == 3
    assert (count.syncs, count.blocking_uploads) == (1, 1), count.events
    with obs.observe() as count:
        dev = torch.arange(4, dtype=torch.int32).to(device=obs.device)
        assert int(dev[-1]) == 3
    assert (count.syncs, count.reads) == (2, 1), count.events


def test_empty_batch_has_no_syncs():
    table = torch.zeros(4, 1, dtype=torch.int32)
    for name in VARIANTS:
        assert _observe(name, [], [], table).syncs == 0


def test_undeclared_syncs_are_caught():
    """The observer does not trust the code: reads and blocking copies it did not announce are counted."""
    obs = SyncObserver("cpu")
    table = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    with obs.observe(device_tensors=[table]) as count:
        derived = table[1:] * 2  # stays "on the device"
        int(derived[0, 0])  # read 1
        derived.sum().item()  # read 2
        derived.tolist()  # read 3
        torch.zeros(3).to(obs.device)  # blocking upload 4
        torch.zeros(3).to(obs.device, non_blocking=True)  # not a sync
        torch.zeros(3, device=obs.device).copy_(torch.ones(3))  # blocking upload 5
        torch.ones(3).tolist()  # a host tensor: not a sync
    assert (count.syncs, count.reads, count.blocking_uploads) == (5, 3, 2)


def test_step_totals_match_the_closed_forms():
    # docs/sources.md: per talker step at batch B: original (B+4)*14 + (2B+4), fixed 75, vectorized 0
    for b in (1, 8, 64, 256):
        assert syncs_per_step("original", b) == (b + 4) * 14 + (2 * b + 4)
        assert syncs_per_step("fixed", b) == 75
        assert syncs_per_step("vectorized", b) == 0


def test_cuda_method_needs_cuda():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        SyncObserver("cpu", method="cuda")
    with pytest.raises(ValueError, match="unknown sync observer method"):
        SyncObserver("cpu", method="magic")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (run on the device machine)")
@pytest.mark.parametrize("method", ["cuda", "logical"])
def test_closed_forms_on_cuda(method):
    obs = SyncObserver("cuda", method=method)
    table = torch.arange(64 * 4, dtype=torch.int32, device="cuda").reshape(64, 4)
    for name in VARIANTS:
        for n in (1, 8, 32):
            ql, sl = torch.ones(n, dtype=torch.int32), torch.full((n,), 7, dtype=torch.int32)
            VARIANTS[name](ql, sl, table, block_size=16, device=obs.device)  # warm-up (pinned pool)
            with obs.observe(device_tensors=[table]) as count:
                VARIANTS[name](ql, sl, table, block_size=16, device=obs.device)
            assert count.syncs == syncs_per_call(name, n), (name, n, count.events)
