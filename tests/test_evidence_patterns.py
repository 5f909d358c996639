"""Every shipped experiment's log evidence against the log lines each release really prints.

The lines below are restated from the releases' sources (read from the PyPI wheels; `make test-upstream` checks the
same patterns against every logger call of those wheels). Each arm must pass on the log of a server that ran as its
file says, and fail on the logs of the ways it can look alive without being so: a pattern that also matched a
warning saying the thing did not happen ("code_predictor: torch.compile disabled") would pass by accident.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from conftest import ROOT

from loadtest import experiment as ex
from loadtest.evidence import arm_manifest, check_evidence, local_digests, pin_warning
from loadtest.launch import dry_run

EXPERIMENTS = sorted((ROOT / "configs/experiments").glob("*.yaml"))

# release -> name -> (line, source)
LINES = {
    "0.16.0": {
        # vLLM 0.16.0 vllm/platforms/cuda.py, get_attn_backend_cls: a selected (pinned) backend, logged as the enum
        "attn_pinned_fa": ("Using AttentionBackendEnum.FLASH_ATTN backend.", "vllm/platforms/cuda.py"),
        "attn_pinned_flashinfer": ("Using AttentionBackendEnum.FLASHINFER backend.", "vllm/platforms/cuda.py"),
        # the same function without a pin: the priority list decides
        "attn_auto_fa": ("Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', "
                         "'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].", "vllm/platforms/cuda.py"),
        # vLLM 0.16.0 vllm/v1/executor/multiproc_executor.py, set_multiprocessing_worker_envs: an mp engine core
        # without OMP_NUM_THREADS in its environment (uni never calls it)
        "mp_threads": ("Reducing Torch parallelism from 64 threads to 1 to avoid unnecessary CPU contention. Set "
                       "OMP_NUM_THREADS in the external environment to tune this value as needed.",
                       "vllm/v1/executor/multiproc_executor.py"),
    },
    "0.30.0": {
        "mrv2": ("Using MR v2 OmniARModelRunner for omni AR stage (stage_id=0 model_stage=talker).",
                 "vllm_omni/worker/gpu_ar_worker.py"),
        "cp_compiled_graphs": ("code_predictor: torch.compile (no epilogue fusion) + CUDA graphs",
                               "vllm_omni/model_executor/models/common/qwen3_code_predictor.py, _setup_compile"),
        "cp_compiled": ("code_predictor: torch.compile (dynamic=False, no epilogue fusion)",
                        "vllm_omni/model_executor/models/common/qwen3_code_predictor.py, _setup_compile"),
        # a platform without inductor (or XPU): nothing is compiled, the predictor runs eager
        "cp_disabled": ("code_predictor: torch.compile disabled",
                        "vllm_omni/model_executor/models/common/qwen3_code_predictor.py, _setup_compile"),
    },
    "0.32.0rc1": {
        "mrv2": ("Using MR v2 OmniARModelRunner for omni AR stage (stage_id=0 model_stage=talker).",
                 "vllm_omni/worker/gpu_ar_worker.py"),
        "cp_compiled_graphs": ("code_predictor: torch.compile (no epilogue fusion) + CUDA graphs",
                               "vllm_omni/model_executor/models/common/qwen3_code_predictor.py"),
        "cp_compiled": ("code_predictor: torch.compile (dynamic=False, no epilogue fusion)",
                        "vllm_omni/model_executor/models/common/qwen3_code_predictor.py"),
        "cp_incremental": ("code_predictor: torch.compile + incremental K/V decoding",
                           "vllm_omni/model_executor/models/common/qwen3_code_predictor.py"),
        "cp_disabled": ("code_predictor: torch.compile disabled",
                        "vllm_omni/model_executor/models/common/qwen3_code_predictor.py"),
        "kv_warmed": ("Qwen3-TTS frame-local KV warmed for batches [1, 2, 4, 8, 16, 32, 64]",
                      "vllm_omni/model_executor/models/qwen3_tts/qwen3_tts_code_predictor_vllm.py"),
        "kv_refused": ("Qwen3-TTS frame-local KV requires CUDA BF16; using re-prefill",
                       "vllm_omni/model_executor/models/qwen3_tts/qwen3_tts_code_predictor_vllm.py"),
    },
}
# Lines that say the evidence's subject did NOT happen: no log_present pattern of that release may match one.
DECOYS = {"0.16.0": ("attn_auto_fa", "attn_pinned_flashinfer"), "0.30.0": ("cp_disabled",),
          "0.32.0rc1": ("cp_disabled", "kv_refused")}

# (experiment name, arm) -> (the lines of a server that ran as the file says, [logs that must fail the check])
CASES = {
    ("mission-016-original-vs-fixed", "A"): (["attn_pinned_fa"], [[], ["attn_auto_fa"], ["attn_pinned_flashinfer"]]),
    ("mission-016-original-vs-fixed", "B"): (["attn_pinned_fa"], [[], ["attn_auto_fa"]]),
    ("release-016-fixed-vs-030", "v016"): (["attn_pinned_fa"], [["attn_auto_fa"]]),
    ("executor-016-fixed-mp-vs-uni", "mp"): (["attn_pinned_fa", "mp_threads"],
                                            [[], ["attn_pinned_fa"], ["attn_auto_fa", "mp_threads"]]),
    ("executor-016-fixed-mp-vs-uni", "uni"): (["attn_pinned_fa"],
                                             [[], ["attn_pinned_fa", "mp_threads"], ["attn_auto_fa"]]),
    ("release-016-fixed-vs-030", "v030"): (["mrv2", "cp_compiled_graphs"],
                                           [["mrv2", "cp_disabled"], ["cp_compiled_graphs"], ["mrv2"]]),
    ("v030-runner-v1-vs-v2", "v1"): (["cp_compiled_graphs"],
                                     [["cp_disabled"], ["mrv2", "cp_compiled_graphs"], [],
                                      ["cp_compiled_graphs", "cp_disabled"]]),
    ("v030-runner-v1-vs-v2", "v2"): (["mrv2", "cp_compiled"], [["mrv2", "cp_disabled"], ["cp_compiled"]]),
    ("v032rc1-cp-kv-cache", "off"): (["cp_compiled_graphs"],
                                     [["cp_disabled"], ["cp_incremental"], ["cp_compiled_graphs", "kv_warmed"]]),
    ("v032rc1-cp-kv-cache", "on"): (["kv_warmed", "cp_incremental"],
                                    [["kv_refused", "cp_compiled_graphs"], ["cp_compiled_graphs"],
                                     ["kv_warmed", "kv_refused"]]),
}


def _log(version: str, names: list[str]) -> str:
    """A server log holding those lines among vLLM-style prefixes and unrelated noise."""
    noise = "INFO 12-02 01:00:00 [api_server.py:1] Started server process [1]"
    body = [f"(EngineCore_DP0 pid=42) INFO 12-02 01:00:01 [x.py:9] {LINES[version][n][0]}" for n in names]
    return "\n".join([noise, *body, noise]) + "\n"


def _log_only(arm: ex.Arm) -> ex.Arm:
    """The arm's log items alone (its sync signature is checked on the counters, tests/test_experiment.py)."""
    return replace(arm, evidence=replace(arm.evidence, sync_signature=None, metric_present=()))


def _arms():
    for path in EXPERIMENTS:
        exp = ex.load_experiment(path)
        for arm in exp.arms.values():
            if arm.backend == "vllm":
                yield pytest.param(exp.name, arm, id=f"{exp.name}:{arm.name}")


def test_every_shipped_vllm_arm_has_cases():
    """A new experiment file must state here what its arms' logs look like, alive and not."""
    shipped = {(exp_name, arm.name) for exp_name, arm in (p.values for p in _arms())}
    assert shipped == set(CASES)


@pytest.mark.parametrize("exp_name,arm", list(_arms()))
def test_arm_evidence_passes_on_a_live_log_and_fails_on_each_decoy(exp_name, arm):
    live, dead = CASES[(exp_name, arm.name)]
    version = arm.vllm_omni
    ok, reason = check_evidence(_log_only(arm), _log(version, live), [])
    assert ok, f"{exp_name}:{arm.name} rejects the log of a live server: {reason}"
    for names in dead:
        ok, reason = check_evidence(_log_only(arm), _log(version, names), [])
        assert not ok, f"{exp_name}:{arm.name} accepts a log with only {names}"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_no_positive_pattern_matches_a_decoy(path):
    exp = ex.load_experiment(path)
    for arm in exp.arms.values():
        if arm.backend != "vllm":
            continue
        for pattern in arm.evidence.log_present:
            for name in DECOYS[arm.vllm_omni]:
                line = LINES[arm.vllm_omni][name][0]
                assert not re.search(pattern, line), f"{path.name}:{arm.name}: /{pattern}/ matches {line!r}"


def test_torch_compile_disabled_is_matched_by_no_shipped_pattern():
    """The warning of a predictor that compiled nothing never counts as evidence, in any file or arm."""
    for path in EXPERIMENTS:
        for arm in ex.load_experiment(path).arms.values():
            for pattern in arm.evidence.log_present:
                assert not re.search(pattern, "code_predictor: torch.compile disabled"), (path.name, arm.name)


def test_every_pattern_matches_some_known_line_of_its_release():
    """Present patterns must be satisfiable and absent patterns must be able to fire, or they prove nothing."""
    for path in EXPERIMENTS:
        for arm in ex.load_experiment(path).arms.values():
            if arm.backend != "vllm":
                continue
            known = [line for line, _ in LINES[arm.vllm_omni].values()]
            for pattern in (*arm.evidence.log_present, *arm.evidence.log_absent):
                assert any(re.search(pattern, line) for line in known), (path.name, arm.name, pattern)


def test_tag_only_pin_warns_and_a_digest_pin_is_recorded():
    exp = ex.load_experiment(ROOT / ex.MISSION)
    arm = exp.arms["A"]
    assert pin_warning(arm) and "tag only" in pin_warning(arm)
    m = arm_manifest(arm)
    assert m["base_image_pin"] == "tag only" and m["base_image_digest"] is None and m["pin_warning"]
    digest = "sha256:" + "ab" * 32
    pinned = replace(arm, base_image=f"{arm.base_image}@{digest}")
    assert pin_warning(pinned) is None
    m = arm_manifest(pinned)
    assert m["base_image_digest"] == digest and m["base_image_pin"] == "digest" and m["pin_warning"] is None


@pytest.mark.slow  # the dry run asks docker/serve.sh (bash) for each arm's commands
def test_dry_run_warns_on_a_tag_only_pin():
    out = dry_run(ex.load_experiment(ROOT / ex.MISSION))
    assert "WARNING: arm A: base image vllm/vllm-omni:v0.16.0 is pinned by tag only" in out


def test_local_digests_reads_docker_repo_digests():
    class P:
        def __init__(self, rc, out):
            self.returncode, self.stdout = rc, out

    seen = []

    def run(argv, **kw):
        seen.append(argv)
        return P(0, '["vllm/vllm-omni@sha256:' + "cd" * 32 + '"]\n')

    assert local_digests("vllm/vllm-omni:v0.16.0", run=run) == ["vllm/vllm-omni@sha256:" + "cd" * 32]
    assert seen[0][:3] == ["docker", "image", "inspect"]
    assert local_digests("x:y", run=lambda *a, **k: P(1, "")) == []

    def missing(*a, **k):
        raise FileNotFoundError("docker")

    assert local_digests("x:y", run=missing) == []
