"""make gpu-check: the check a bare GPU machine runs, here end to end on the CPU, and its parts on their own."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from tests.conftest import ROOT, run
from tools import closed_loop, gpu_check
from tts_predictor.metrics import expected_syncs, syncs_per_call, syncs_per_step
from ttsrecords.records import GPU_AB_SCHEMA, GPU_CHECK_SCHEMA, MICRO_SCHEMA, REQUEST_SCHEMA, read_jsonl
from ttsreport.inference import KINDS


def _pr1614_h100_from_sources() -> dict[int, tuple[float, float]]:
    """PR #1614's H100 table as docs/sources.md cites it ([H100] row): {n: (original, fixed)}."""
    line = next(ln for ln in (ROOT / "docs/sources.md").read_text().splitlines() if ln.startswith("| [H100]"))
    pairs = re.findall(r"(?:n=)?(\d+) ([\d.]+)/([\d.]+)", line)
    return {int(n): (float(o), float(f)) for n, o, f in pairs}


# --- end to end on the CPU ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "run"
    t0 = time.monotonic()
    p = run(["make", "gpu-check", "DEVICE=cpu", f"OUT={out}"], timeout=600)
    return p, out, time.monotonic() - t0


@pytest.mark.slow
def test_cpu_check_passes_and_writes_its_files(cpu_check):
    p, out, elapsed = cpu_check
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(f.name for f in out.iterdir())
    assert len(files) <= 8 and set(files) == set(gpu_check.FILES), files
    check = json.loads((out / "check.json").read_text())
    assert check["schema"] == GPU_CHECK_SCHEMA and check["device"] == "cpu" and check["passed"] is True
    assert [s["name"] for s in check["steps"]] == list(gpu_check.BUDGETS)
    for s in check["steps"]:
        assert s["status"] == "pass" and 0 <= s["elapsed_s"] <= s["budget_s"] == gpu_check.BUDGETS[s["name"]], s
    assert sum(gpu_check.BUDGETS.values()) <= 8 * 60
    env = check["env"]
    assert env["torch"] and env["python"] and env["cuda_available"] is False and env["gpu"] is None
    assert elapsed < 8 * 60  # the promise for the CPU run (measured: reports/bench/gpu-check.md)


@pytest.mark.slow
def test_cpu_check_variants_are_equivalent_and_syncs_are_the_closed_form(cpu_check):
    _, out, _ = cpu_check
    variants = json.loads((out / "variants.json").read_text())
    eq = variants["equivalence"]
    assert eq["mismatch_count"] == 0 and eq["comparisons"] == 3 * eq["cases"] >= 300
    syncs = variants["syncs"]
    assert syncs["methods"] == ["logical"] and "set_sync_debug_mode not run" in syncs["cuda_note"]
    seen = set()
    for r in syncs["rows"]:
        n, v = r["num_reqs"], r["variant"]
        closed = {"decode": syncs_per_call(v, n), "prefill": syncs_per_call(v, 2 * n), "step": syncs_per_step(v, n)}
        assert r["logical"] == r["expected"] == closed[r["what"]], r
        seen.add((n, r["what"], v))
    assert seen == {(n, w, v) for n in (1, 8, 64, 128, 256) for w in ("decode", "prefill", "step")
                    for v in ("original", "fixed", "vectorized")}
    # per call: original T+4, fixed 5, vectorized 0 (T = tokens); at 256 requests a prefill holds 512 tokens
    row = {(r["num_reqs"], r["what"], r["variant"]): r["logical"] for r in syncs["rows"]}
    assert (row[256, "prefill", "original"], row[256, "prefill", "fixed"], row[256, "prefill", "vectorized"]) == (
        516, 5, 0)


@pytest.mark.slow
def test_cpu_check_micro_table_sits_beside_pr1614(cpu_check):
    _, out, _ = cpu_check
    result = json.loads((out / "micro.json").read_text())
    assert result["schema"] == MICRO_SCHEMA and result["timer"] == "perf_counter" and result["device"] == "cpu"
    for r in result["rows"]:
        assert r["median_us"] > 0 and r["syncs_per_call"] == syncs_per_call(r["variant"], r["tokens"])
    cited = _pr1614_h100_from_sources()
    assert cited[8] == (253.3, 111.1) and cited[128] == (3759.6, 1239.1)
    beside = {b["num_reqs"]: b for b in result["pr1614"]["rows"]}
    assert set(beside) == set(cited)
    for n, (o, f) in cited.items():
        assert (beside[n]["pr1614_original_us"], beside[n]["pr1614_fixed_us"]) == (o, f)
        assert beside[n]["original_us"] > 0 and beside[n]["ratio"] == pytest.approx(
            beside[n]["original_us"] / beside[n]["fixed_us"], rel=1e-2)
    summary = (out / "summary.md").read_text()
    assert "## Micro benchmark beside PR #1614" in summary and "| 253.3 | 111.1 |" in summary


@pytest.mark.slow
def test_cpu_check_ab_is_analysed_with_a_verdict_per_level(cpu_check):
    _, out, _ = cpu_check
    ab = json.loads((out / "ab.json").read_text())
    assert ab["schema"] == GPU_AB_SCHEMA and ab["simulated"] is True and ab["levels"] == [8, 64]
    assert ab["not_run"] == [] and len(ab["windows"]) == 2 * ab["rounds_planned"] == 6
    assert [w["variant"] for w in ab["windows"]] == ["original", "fixed", "fixed", "original", "original", "fixed"]
    for w in ab["windows"]:
        mc = w["manipulation_check"]
        assert w["valid"] and mc["ok"] and mc["observed_calls"] > 0 and mc["timing_observed_calls"] == 0, mc
        assert mc["syncs"] == expected_syncs(w["variant"], mc["observed_calls"], mc["observed_tokens"])
        for c in ("8", "64"):
            lvl = w["levels"][c]
            assert lvl["n_ok"] > 0 and lvl["audio_throughput"] > 0 and lvl["e2e_p50"] > 0
    records, notes = read_jsonl(out / "ab-requests.jsonl", schema=REQUEST_SCHEMA)
    assert notes == []
    assert {r["run_id"] for r in records} == {w["id"] for w in ab["windows"]}
    assert sum(r["ok"] for r in records) / len(records) > 0.95
    summary = (out / "summary.md").read_text()
    for c in ("8", "64"):
        cmp = ab["comparison"][c]
        primary = cmp["metrics"]["audio_throughput"]
        assert primary["kind"] in KINDS and primary["n"] == 3 and len(primary["a"]) == 3
        assert cmp["verdict"].startswith(f"c={c}: ") and f"- verdict {cmp['verdict']}" in summary


# --- the script's refusals (a process each, no check run) -----------------------------------------------------------

@pytest.mark.slow
def test_script_refuses_a_bad_device_and_a_missing_wheel_folder(tmp_path):
    p = run(["bash", "scripts/gpu-check.sh", "--device", "tpu"])
    assert p.returncode == 2 and p.stderr.strip() == "gpu-check: --device must be cpu or cuda[:N], got 'tpu'"
    env = {**os.environ, "GPU_WHEELS_FORCE": "1", "GPU_WHEELS": str(tmp_path / "none"), "GPU_SITE": str(tmp_path)}
    p = run(["bash", "scripts/gpu-check.sh", "--device", "cpu"], env=env)
    assert p.returncode == 2 and "no wheel folder" in p.stderr and "make gpu-wheels" in p.stderr
    assert not list(tmp_path.iterdir())  # nothing installed, nothing run


# --- unit tier ------------------------------------------------------------------------------------------------------

def test_wheel_list_pins_what_the_image_lacks():
    lines = [ln for ln in (ROOT / "scripts/gpu-check-wheels.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    pins = dict(re.match(r"^([A-Za-z0-9_.-]+)==(\S+)\s+# import (\S+)$", ln).group(1, 2) for ln in lines)
    assert set(pins) == {"soundfile", "cffi", "pycparser"}
    assert f'"soundfile=={pins["soundfile"]}"' in (ROOT / "pyproject.toml").read_text()  # the suite's own pin


def test_windows_alternate_in_balanced_order():
    plan = closed_loop.Plan("original", "fixed", 4, "cpu")
    assert [(r, arm) for r, arm, _ in plan.windows()] == [
        (1, "A"), (1, "B"), (2, "B"), (2, "A"), (3, "A"), (3, "B"), (4, "B"), (4, "A")]
    assert {v for _, arm, v in plan.windows() if arm == "B"} == {"fixed"}


def _window(rnd, arm, thr, n_ok=10, valid=True):
    stats = {"n_ok": n_ok, "audio_throughput": thr, "e2e_p50": thr and 10 / thr, "ttfa_p50": thr and 1 / thr}
    return {"round": rnd, "arm": arm, "valid": valid, "levels": {"8": stats}}


def test_compare_gives_the_suites_verdict_per_level():
    plan = closed_loop.Plan("original", "fixed", 3, "cpu")
    windows = [w for r, f in ((1, 1.10), (2, 1.12), (3, 1.11)) for w in (_window(r, "A", 10.0), _window(r, "B", 10 * f))]
    res = closed_loop.compare(plan, windows, [8])["8"]
    primary = res["metrics"]["audio_throughput"]
    assert primary["kind"] == "faster" and primary["ratio"] == pytest.approx(1.11, rel=2e-3)
    assert res["verdict"].startswith("c=8: faster in this server start: ") and res["invalid_rounds"] == []
    assert res["metrics"]["e2e_p50"]["kind"] == "faster"  # lower latency is better
    windows[1] = _window(1, "B", None, n_ok=0)  # arm B measured nothing in round 1: a failed round, no claim
    windows[2] = _window(2, "A", 10.0, valid=False)  # round 2: arm A failed its manipulation check
    res = closed_loop.compare(plan, windows, [8])["8"]
    assert res["metrics"]["audio_throughput"]["kind"] == "failed" and res["invalid_rounds"] == [2]
    assert "not a valid comparison" in res["verdict"]


def test_a_step_past_its_budget_or_raising_fails_and_the_check_goes_on():
    slow = gpu_check.run_step("slow", 0.2, lambda: time.sleep(5) or (True, "never", None))
    assert slow["status"] == "fail" and slow["detail"] == "stopped: over its budget of 0.2 s" and slow["elapsed_s"] < 2
    broken = gpu_check.run_step("broken", 5, lambda: 1 / 0)
    assert broken["status"] == "fail" and broken["detail"].startswith("ZeroDivisionError")
    ok = gpu_check.run_step("ok", 5, lambda: (True, "fine", {"x": 1}))
    assert (ok["status"], ok["data"]) == ("pass", {"x": 1})


def test_driver_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    assert gpu_check.main(["--device", "tpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: --device must be cpu or cuda[:N], got 'tpu'"
    (tmp_path / "old.json").write_text("{}")
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "not empty (nothing overwritten)" in capsys.readouterr().err
    assert [f.name for f in tmp_path.iterdir()] == ["old.json"]
    assert gpu_check.main(["--device", "cpu", "--ab-rounds", "0", "--out", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()


def test_equivalence_and_syncs_steps_on_the_cpu():
    import torch

    ok, detail, data = gpu_check.step_equivalence(torch.device("cpu"), cases=40)
    assert ok and data["mismatch_count"] == 0 and data["comparisons"] == 120, detail
    ok, detail, data = gpu_check.step_syncs(torch.device("cpu"))
    assert ok and all(r["logical"] == r["expected"] for r in data["rows"]), detail


def test_cuda_guards_without_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the guard is not reached")
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err
    from tools import micro

    case = micro.Case("decode", 2, 16, (1, 1), (3, 4))
    assert micro.run("cpu", rounds=1, sample_s=0.0005, cases=[case], events=True)["timer"] == "perf_counter"

