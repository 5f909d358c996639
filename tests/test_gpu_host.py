"""Pure parts of the GPU-host hardening: the engine's log lines, the request kinds of the Base fallback, a window
whose requests all failed, the compile-cache line, and the report's mark on a run without the plugin's source check."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import ROOT

from loadtest import engine_log
from loadtest import experiment as ex
from loadtest.evidence import arm_manifest, compile_cache_state
from loadtest.launch import dry_run
from loadtest.prompts import CUSTOM_VOICE_MODEL, REQUEST_KINDS, load_voice, speech_payload
from tts_predictor.domain import MODEL_NAME
from tts_predictor.plugin import ENV_SKIP_SOURCE_CHECK
from ttsrecords import outcomes as oc
from ttsreport import analysis

# (line, source): the releases' own lines (engine_log's docstring says where each is logged)
READY_016 = "INFO 12-02 01:00:00 [omni.py:477] [AsyncOrchestrator] All stages initialized successfully"
READY_030 = "INFO 12-02 01:00:00 [omni_engine_base.py:344] [OmniEngine] Orchestrator ready with 2 stages"
TIMEOUT_016 = "WARNING 12-02 01:10:00 [omni.py:482] [AsyncOrchestrator] Initialization timeout: 1/2 stages ready. " \
              "Missing stages: [1]"
DEAD_016 = "ERROR 12-02 01:20:00 [core.py:1008] EngineCore encountered a fatal error."
DEAD_MSG = "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for " \
           "the root cause."


@pytest.mark.parametrize(("lines", "state"), [
    ([READY_016], "ready"), ([READY_030], "ready"), ([TIMEOUT_016], "timeout"), ([READY_016, DEAD_016], "dead"),
    (["INFO Started server process [1]"], "unknown"), ([], "unknown")])
def test_stage_state_from_the_log(lines, state):
    got, line = engine_log.stages_state("\n".join(["INFO noise", *lines, "INFO more noise"]))
    assert got == state and (line is None) == (state == "unknown")


def test_dead_line_names_the_line():
    assert engine_log.dead_line("a\n" + DEAD_MSG + "\nb") == DEAD_MSG
    assert engine_log.dead_line(READY_016 + "\nINFO request done") is None


def test_the_simulators_dead_engine_lines_are_detected():
    """ttssim's ref_text_request=fatal fault prints what vLLM prints; the detector must see it (the two sides)."""
    from ttssim.engine import ENGINE_DEAD_MESSAGE

    assert engine_log.dead_line(f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_MESSAGE}")
    assert ENGINE_DEAD_MESSAGE in DEAD_MSG


def test_request_kinds_are_the_fallback_order_with_their_bodies():
    voice = load_voice(ROOT / "configs/voices/ref.yaml")
    bodies = {k: speech_payload("Hello.", voice, model=MODEL_NAME, language="English", mode="wav", kind=k)
              for k in REQUEST_KINDS}
    assert REQUEST_KINDS == ("base", "base_xvector", "custom_voice")
    assert bodies["base"]["task_type"] == "Base" and bodies["base"]["ref_text"] and "x_vector_only_mode" not in \
        bodies["base"]
    assert bodies["base_xvector"]["x_vector_only_mode"] is True and "ref_text" not in bodies["base_xvector"]
    assert bodies["custom_voice"]["task_type"] == "CustomVoice" and "ref_audio" not in bodies["custom_voice"]
    assert bodies["custom_voice"]["voice"]
    with pytest.raises(ValueError, match="not one of"):
        speech_payload("x", voice, model=MODEL_NAME, language="English", mode="wav", kind="clone")


def test_the_simulator_validates_every_request_kind():
    """The simulator's request validation (parity with vllm-omni's speech route) accepts each kind's body."""
    from ttssim.config import load_config
    from ttssim.server import validate_body

    cfg = load_config(None, [])
    voice = load_voice(ROOT / "configs/voices/ref.yaml")
    for kind in ("base", "base_xvector"):
        validate_body(speech_payload("Hello.", voice, model=cfg.model.name, language="English", mode="stream",
                                     kind=kind), cfg.model.name, cfg.audio)
    body = speech_payload("Hello.", voice, model=CUSTOM_VOICE_MODEL, language="English", mode="wav",
                          kind="custom_voice")
    validate_body(body, CUSTOM_VOICE_MODEL, cfg.audio)


def test_experiment_request_kind_and_its_model_go_together(tmp_path):
    src = (ROOT / ex.MISSION).read_text()
    path = tmp_path / "e.yaml"
    path.write_text(src.replace("primary_metric:", "request: base_xvector\nprimary_metric:", 1))
    assert ex.load_experiment(path).request == "base_xvector"
    path.write_text(src.replace("primary_metric:", "request: custom_voice\nprimary_metric:", 1))
    with pytest.raises(ex.ExperimentError, match="custom_voice requests need model.name"):
        ex.load_experiment(path)
    path.write_text(src.replace("primary_metric:", "request: custom_voice\nprimary_metric:", 1)
                    .replace("name: Qwen/Qwen3-TTS-12Hz-0.6B-Base", f"name: {CUSTOM_VOICE_MODEL}"))
    assert ex.load_experiment(path).model == CUSTOM_VOICE_MODEL
    path.write_text(src.replace("primary_metric:", "request: clone\nprimary_metric:", 1))
    with pytest.raises(ex.ExperimentError, match="request 'clone' is not one of"):
        ex.load_experiment(path)
    assert ex.load_experiment(ROOT / ex.MISSION).request == "base"


def test_every_request_failed_only_when_all_of_them_did():
    def outcomes(rows):
        return oc.request_outcomes(rows)

    failing = [{"phase": p, "ok": False, "error": "http 500: boom"} for p in ("warmup", "measure", "measure")]
    why = oc.every_request_failed(outcomes(failing))
    assert why.startswith("every one of its 3 requests failed") and "http 500" in why
    assert oc.every_request_failed(outcomes(failing + [{"phase": "warmup", "ok": True}])) is None
    assert oc.every_request_failed(outcomes([])) is None  # nothing ran: the load's own verdict says so


def test_compile_cache_state_reads_serve_sh_line():
    assert compile_cache_state("x\nserve.sh: compile cache warm: /c/h/img-1\n") == "warm"
    assert compile_cache_state("serve.sh: compile cache cold: /c\n") == "cold"
    assert compile_cache_state("ttssim: all stages initialized") is None


def test_server_args_may_not_shorten_the_start_up_limits(tmp_path):
    src = (ROOT / ex.MISSION).read_text()
    path = tmp_path / "e.yaml"
    path.write_text(src.replace("server_args: []", "server_args: ['--init-timeout=60']", 1))
    with pytest.raises(ex.ExperimentError, match="--init-timeout=60 is set by docker/serve.sh"):
        ex.load_experiment(path)


def test_report_marks_a_run_whose_plugin_skipped_its_source_check():
    exp = ex.load_experiment(ROOT / ex.MISSION)
    arm = exp.arms["B"]
    skipped = replace(arm, env=((ENV_SKIP_SOURCE_CHECK, "1"),))
    man = {"arms": {"A": arm_manifest(exp.arms["A"]), "B": arm_manifest(skipped)}}
    assert man["arms"]["A"]["plugin_source_check"] == "on" and man["arms"]["B"]["plugin_source_check"] == "skipped"
    warnings = analysis._warnings({"manifest": man, "blocks": []}, [], [])
    assert len(warnings) == 1 and warnings[0].startswith(f"arm B (fixed) ran with {ENV_SKIP_SOURCE_CHECK}=1")


@pytest.mark.slow  # the dry run asks docker/serve.sh (bash) for the start's commands
def test_nested_dry_run_prints_one_control_file_server_per_start(monkeypatch):
    monkeypatch.setenv("MODEL_REVISION", "0123456789abcdef0123456789abcdef01234567")
    out = dry_run(ex.mission(), hot_swap=True)
    assert out.count("docker run -d") == 1 and "tts-vllm-omni:0.16.0-fixed vllm serve" not in out
    assert "-v '<run>/starts/<n>:/run/tts-control:ro'" in out or "-v <run>/starts/<n>:/run/tts-control:ro" in out
    assert "## arm B (fixed): no server of its own, runs as variant fixed inside arm A's starts" in out
    fresh = dry_run(ex.mission())
    assert fresh.count("docker run -d") == 2 and "<run>/starts/<n>" not in fresh  # design fresh: a server per arm


def test_report_warns_when_a_level_was_not_primed(tmp_path):
    """Priming = at least C untimed (count or warm-up) requests before a level's measure window, recorded in the
    window; a window whose level had fewer is named (its cold first requests may be timed)."""
    import json as _json

    from synthetic_runs import fresh

    from ttsreport.runfolder import load_run

    run = fresh(tmp_path / "run", rounds=1, aa_rounds=0, levels=(2, 8))
    assert not [w for w in analysis._warnings(load_run(run), [], []) if w.startswith("not primed")]
    path = sorted(run.glob("blocks/*/requests.jsonl"))[0]
    lines = path.read_text().splitlines()
    kept = [ln for ln in lines if not (_json.loads(ln).get("concurrency") == 8
                                      and _json.loads(ln).get("phase") in ("count", "warmup"))]
    assert len(kept) < len(lines)
    path.write_text("\n".join(kept) + "\n")
    warned = [w for w in analysis._warnings(load_run(run), [], []) if w.startswith("not primed")]
    assert len(warned) == 1 and f"{path.parent.name} c=8: 0" in warned[0]


def test_report_shows_each_starts_compile_cache(tmp_path):
    """start.json's compile_cache (the runner's record of serve.sh's cold/warm line) reaches the design section."""
    import json as _json

    from synthetic_runs import nested

    from ttsreport.sections import design_section

    run = nested(tmp_path / "run", starts=3, pairs=2, d=lambda s, p: 0.0)
    for i, path in enumerate(sorted(run.glob("starts/*/start.json"))):
        doc = _json.loads(path.read_text())
        doc["compile_cache"] = "cold" if i == 0 else "warm"
        path.write_text(_json.dumps(doc))
    summary, comparison = analysis.results(run)
    assert [s["compile_cache"] for s in summary.starts] == ["cold", "warm", "warm"]
    text = design_section(summary, comparison).parts[0]
    assert "3 server start(s) (1 with a cold compile cache, 2 warm" in text


class _LogServer:
    """What readiness.wait_stages reads of a ServerProcess: its log, whether it lives, the log's name."""

    def __init__(self, log: str, alive: bool = True):
        from pathlib import Path

        self.log, self._alive, self.log_path, self.proc = log, alive, Path("server.log"), type("P", (), {"returncode": 1})

    def log_tail(self, n):
        return self.log

    def alive(self):
        return self._alive


@pytest.mark.parametrize(("log", "alive", "needle"), [
    (TIMEOUT_016, True, "Initialization timeout: 1/2 stages ready"),
    (READY_016 + "\n" + DEAD_016, True, "EngineCore encountered a fatal error"),
    ("INFO loading weights", False, "exited with code 1 before its stages initialised"),
    ("INFO loading weights", True, "VLLM_LOGGING_LEVEL must not be above INFO")])
def test_wait_stages_refuses_what_is_not_ready(log, alive, needle):
    from loadtest.readiness import wait_stages
    from loadtest.server_process import ServerError

    with pytest.raises(ServerError, match="not ready|exited") as e:
        wait_stages(_LogServer(log, alive), 0.0, sleep=lambda s: None)
    assert needle in str(e.value)
    assert wait_stages(_LogServer("x\n" + READY_030), 0.0) == READY_030
