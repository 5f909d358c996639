"""All variants agree with the plain-Python statement of the semantics and with each other."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tts_predictor.layout import BatchLayout, reference_layout
from tts_predictor.variants import VARIANTS

NAMES = sorted(VARIANTS)


def _table(rows: int, blocks_per_seq: int, seed: int = 0) -> torch.Tensor:
    """A block table with shuffled block ids, so a wrong row or column shows up in the slots."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(rows * blocks_per_seq, generator=g).to(torch.int32)
    return ids.reshape(rows, blocks_per_seq)


def _assert_matches_reference(layout: BatchLayout, ref: dict, device: str = "cpu") -> None:
    assert layout.num_tokens == ref["num_tokens"]
    assert layout.max_seq_len == ref["max_seq_len"]
    assert layout.query_start_loc.tolist() == ref["query_start_loc"]
    assert layout.query_start_loc_device.tolist() == ref["query_start_loc"]
    assert layout.seq_lens_device.tolist() == ref["seq_lens"]
    assert layout.block_table.tolist() == ref["block_table"]
    assert layout.positions.tolist() == ref["positions"]
    assert layout.slot_mapping.tolist() == ref["slot_mapping"]
    assert layout.query_start_loc.dtype == torch.int32 and layout.query_start_loc.device.type == "cpu"
    for t, dtype in (
        (layout.query_start_loc_device, torch.int32),
        (layout.seq_lens_device, torch.int32),
        (layout.block_table, torch.int32),
        (layout.positions, torch.int64),
        (layout.slot_mapping, torch.int64),
    ):
        assert t.dtype == dtype
        assert t.device.type == device


@st.composite
def batches(draw):
    """Decode, prefill and mixed batches: num_reqs 0..256, block_size 1..128, query 0..64, max_seq_len <= 8192."""
    block_size = draw(st.sampled_from([1, 2, 3, 7, 16, 32, 64, 128]))
    max_seq_len = draw(st.sampled_from([16, 17, 64, 256, 2048, 8192]))
    blocks_per_seq = -(-max_seq_len // block_size)
    if blocks_per_seq > 2048:  # keep the table small enough for thousands of examples
        block_size = -(-max_seq_len // 2048)
        blocks_per_seq = -(-max_seq_len // block_size)
    num_reqs = draw(st.integers(0, 256) if blocks_per_seq <= 64 else st.integers(0, 16))
    kind = draw(st.sampled_from(["decode", "prefill", "mixed"]))
    qmax = {"decode": 1, "prefill": 64, "mixed": 64}[kind]
    qmin = {"decode": 1, "prefill": 2, "mixed": 0}[kind]
    query = draw(st.lists(st.integers(qmin, min(qmax, max_seq_len)), min_size=num_reqs, max_size=num_reqs))
    seq = [draw(st.integers(q, max_seq_len)) for q in query]
    extra_rows = draw(st.integers(0, 3))
    return query, seq, block_size, _table(num_reqs + extra_rows, blocks_per_seq, seed=draw(st.integers(0, 99)))


def _check_batch(batch) -> None:
    query, seq, block_size, table = batch
    ql = torch.tensor(query, dtype=torch.int32)
    sl = torch.tensor(seq, dtype=torch.int32)
    ref = reference_layout(ql, sl, table, block_size=block_size)
    for name in NAMES:
        layout = VARIANTS[name](ql, sl, table, block_size=block_size, device="cpu")
        _assert_matches_reference(layout, ref)


def generated(n: int) -> settings:
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.slow  # about a minute on 2 cores: the unit tier runs the 50-batch sample below
@generated(2000)
@given(batches())
def test_variants_match_reference_on_generated_batches(batch):
    _check_batch(batch)


@generated(50)
@given(batches())
def test_variants_match_reference_on_a_sample_of_generated_batches(batch):
    _check_batch(batch)


@pytest.mark.parametrize("name", NAMES)
def test_hand_written_edge_cases(name):
    f = VARIANTS[name]
    table = _table(8, 4)
    # empty batch
    empty = f(torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.int32), table, block_size=16, device="cpu")
    assert empty.num_tokens == 0 and empty.query_start_loc.tolist() == [0] and empty.block_table.shape == (0, 4)
    # zero-length queries among non-empty ones
    ql, sl = torch.tensor([0, 2, 0], dtype=torch.int32), torch.tensor([5, 9, 1], dtype=torch.int32)
    _assert_matches_reference(f(ql, sl, table, block_size=4, device="cpu"), reference_layout(ql, sl, table, block_size=4))
    # a query crossing a block boundary: positions 14..17 with block size 16 span blocks 0 and 1
    ql, sl = torch.tensor([4], dtype=torch.int32), torch.tensor([18], dtype=torch.int32)
    layout = f(ql, sl, table, block_size=16, device="cpu")
    assert layout.positions.tolist() == [14, 15, 16, 17]
    b0, b1 = int(table[0, 0]), int(table[0, 1])
    assert layout.slot_mapping.tolist() == [b0 * 16 + 14, b0 * 16 + 15, b1 * 16, b1 * 16 + 1]
    # a full table (num_reqs == rows)
    ql = torch.ones(8, dtype=torch.int32)
    sl = torch.arange(1, 9, dtype=torch.int32)
    _assert_matches_reference(f(ql, sl, table, block_size=2, device="cpu"), reference_layout(ql, sl, table, block_size=2))


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_is_refused_clearly(name):
    f = VARIANTS[name]
    table = _table(4, 2)
    ones = torch.ones(5, dtype=torch.int32)
    with pytest.raises(ValueError, match="exceeds local predictor max_batch_size=4"):
        f(ones, ones, table, block_size=16, device="cpu")
    with pytest.raises(TypeError, match="query_lens must be int32"):
        f(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int32), table, block_size=16, device="cpu")
    with pytest.raises(ValueError, match="differ in shape"):
        f(torch.ones(2, dtype=torch.int32), torch.ones(3, dtype=torch.int32), table, block_size=16, device="cpu")
    with pytest.raises(ValueError, match="must be 1-D"):
        f(torch.ones(2, 1, dtype=torch.int32), torch.ones(2, 1, dtype=torch.int32), table, block_size=16, device="cpu")
    with pytest.raises(ValueError, match="block_table must be a 2-D int32"):
        f(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32), table.long(), block_size=16, device="cpu")
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        f(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32), table, block_size=0, device="cpu")


def test_outputs_are_independent_between_calls():
    """A layout must not alias a buffer a later call overwrites (the vectorized variant reuses staging memory)."""
    table = _table(8, 4)
    for name in NAMES:
        f = VARIANTS[name]
        first = f(torch.ones(3, dtype=torch.int32), torch.tensor([3, 5, 7], dtype=torch.int32), table, block_size=4,
                  device="cpu")
        snapshot = [first.positions.tolist(), first.slot_mapping.tolist(), first.query_start_loc.tolist()]
        f(torch.full((3,), 2, dtype=torch.int32), torch.tensor([9, 9, 9], dtype=torch.int32), table, block_size=4,
          device="cpu")
        assert [first.positions.tolist(), first.slot_mapping.tolist(), first.query_start_loc.tolist()] == snapshot, name


def test_a_deliberately_wrong_layout_is_caught():
    """The comparison used above is strict enough to catch an off-by-one block lookup."""
    table = _table(4, 4)
    ql, sl = torch.tensor([2, 1], dtype=torch.int32), torch.tensor([17, 3], dtype=torch.int32)
    ref = reference_layout(ql, sl, table, block_size=16)
    good = VARIANTS["vectorized"](ql, sl, table, block_size=16, device="cpu")
    wrong = VARIANTS["vectorized"](ql, sl, table.roll(1, dims=1), block_size=16, device="cpu")
    _assert_matches_reference(good, ref)
    with pytest.raises(AssertionError):
        _assert_matches_reference(wrong, ref)
