"""Bad configuration and input at every entry point: one clear error line, a non-zero exit, no
traceback, and nothing half-written (no run folder, no records)."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest
from conftest import LOCUST, free_port, one_error, run, without_docker_path, write_scenario

pytestmark = pytest.mark.slow  # every test runs a command line in its own process


def locust(tmp_path, *args, scenario=None, host=None):
    """Locust headless with a good default scenario and an unreachable host unless told otherwise."""
    scen = scenario or write_scenario(tmp_path)
    host = host or f"http://127.0.0.1:{free_port()}"
    return run([*LOCUST, "--headless", "--host", host, "--scenario", str(scen), "--run-dir", str(tmp_path / "run"),
                "--ready-timeout", "0.5", *args])


def ab(tmp_path, *args, env=None):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return run([sys.executable, "-m", "loadtest.ab", "--backend", "sim", "--sim-config", "configs/sim/fast.yaml",
                "--out", str(out), "--name", "r", "--no-report", *args], env=env)


def nothing_written(tmp_path):
    assert not (tmp_path / "run").exists()
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir()), list(out.rglob("*"))


# --- unknown variant ---------------------------------------------------------------------------------------------

def test_unknown_variant_simulator():
    one_error(run([sys.executable, "-m", "ttssim", "--variant", "bogus", "--port", "0"]), "invalid choice", "bogus")


def test_unknown_variant_launcher():
    one_error(run([sys.executable, "-m", "ttssim.launch", "--variant", "bogus", "--dry-run"]), "bogus")


def test_unknown_variant_ab(tmp_path):
    one_error(ab(tmp_path, "--a", "original", "--b", "bogus"), "unknown variant", "bogus")
    nothing_written(tmp_path)


def test_unknown_variant_locust(tmp_path):
    one_error(locust(tmp_path, "--variant", "bogus"), "unknown variant", "bogus")
    nothing_written(tmp_path)


# --- concurrency 0 / negative -------------------------------------------------------------------------------------

@pytest.mark.parametrize("conc", [0, -3])
def test_concurrency_not_positive_locust(tmp_path, conc):
    one_error(locust(tmp_path, scenario=write_scenario(tmp_path, steps=(4, conc))), "steps[1].concurrency", ">= 1")
    nothing_written(tmp_path)


@pytest.mark.parametrize("levels", ["0", "8,-4"])
def test_concurrency_not_positive_ab(tmp_path, levels):
    one_error(ab(tmp_path, "--levels", levels), "concurrency")
    nothing_written(tmp_path)


def test_levels_not_a_number_ab(tmp_path):
    one_error(ab(tmp_path, "--levels", "8,lots"), "levels")
    nothing_written(tmp_path)


@pytest.mark.parametrize("flag", ["--rounds=0", "--aa-rounds=-1"])
def test_rounds_not_positive_ab(tmp_path, flag):
    one_error(ab(tmp_path, flag), "rounds")
    nothing_written(tmp_path)


def test_negative_request_timeout_locust(tmp_path):
    one_error(locust(tmp_path, "--request-timeout", "-1"), "request-timeout")
    nothing_written(tmp_path)


# --- unreadable scenario --------------------------------------------------------------------------------------------

def _bad_scenarios(tmp_path):
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"\x00\xff\xfe: [unclosed\n")
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    return {"missing": (tmp_path / "nope.yaml", "cannot read"), "directory": (tmp_path, "cannot read"),
            "not yaml": (junk, "not valid YAML"), "not a mapping": (lst, "top level must be a mapping")}


@pytest.mark.parametrize("kind", ["missing", "directory", "not yaml", "not a mapping"])
def test_unreadable_scenario_locust(tmp_path, kind):
    path, needle = _bad_scenarios(tmp_path)[kind]
    one_error(locust(tmp_path, scenario=path), needle)
    nothing_written(tmp_path)


@pytest.mark.parametrize("kind", ["missing", "not yaml"])
def test_unreadable_scenario_ab(tmp_path, kind):
    path, _ = _bad_scenarios(tmp_path)[kind]
    one_error(ab(tmp_path, "--scenario", str(path)), "scenario", path.name)
    nothing_written(tmp_path)


# --- missing voice file ---------------------------------------------------------------------------------------------

def test_missing_voice_description(tmp_path):
    scen = write_scenario(tmp_path, voice=str(tmp_path / "nobody.yaml"))
    one_error(locust(tmp_path, scenario=scen), "nobody.yaml")
    nothing_written(tmp_path)


def test_voice_description_naming_a_missing_wav(tmp_path):
    voice = tmp_path / "voice.yaml"
    voice.write_text(json.dumps({"schema": "tts-voice/1", "audio": "gone.wav", "transcript": "hello"}))
    one_error(locust(tmp_path, scenario=write_scenario(tmp_path, voice=str(voice))), "gone.wav")
    nothing_written(tmp_path)


# --- port in use, URL unreachable, bad host ---------------------------------------------------------------------------

def test_port_in_use_simulator():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = run([sys.executable, "-m", "ttssim", "--variant", "fixed", "--port", str(port), "--config",
                 "configs/sim/fast.yaml"])
    line = one_error(p, f"127.0.0.1:{port}", prefix="cannot listen")
    assert p.returncode == 1 and "in use" in line.lower()


def test_server_unreachable_locust(tmp_path):
    port = free_port()
    line = one_error(locust(tmp_path, host=f"http://127.0.0.1:{port}"), f"127.0.0.1:{port}", "not ready", "refused")
    assert "--ready-timeout" in line
    nothing_written(tmp_path)


@pytest.mark.parametrize("host", ["127.0.0.1:8091", "ftp://127.0.0.1/", "http://"])
def test_bad_host_locust(tmp_path, host):
    one_error(locust(tmp_path, host=host), "host")
    nothing_written(tmp_path)


def test_missing_host_locust(tmp_path):
    p = run([*LOCUST, "--headless", "--scenario", str(write_scenario(tmp_path)), "--run-dir", str(tmp_path / "run")])
    one_error(p, "--host is required")
    nothing_written(tmp_path)


# --- BACKEND=vllm without Docker or GPU ---------------------------------------------------------------------------------

def test_vllm_backend_without_docker_launcher():
    """`make serve BACKEND=vllm` runs this launcher; with no docker on PATH it must fail at once and say why."""
    env = {**os.environ, "PATH": without_docker_path()}
    p = run([sys.executable, "-m", "ttssim.launch", "--variant", "fixed", "--backend", "vllm", "--port",
             str(free_port())], env=env, timeout=60)
    one_error(p, "docker", prefix="error:")  # docker/serve.sh says it


def test_vllm_backend_without_docker_ab(tmp_path):
    env = {**os.environ, "PATH": without_docker_path()}
    p = run([sys.executable, "-m", "loadtest.ab", "--backend", "vllm", "--out", str(tmp_path / "out"), "--name", "r",
             "--no-report"], env=env)
    one_error(p, "vllm", "docker")
    nothing_written(tmp_path)


def test_serve_sh_without_docker(tmp_path):
    env = {**os.environ, "PATH": without_docker_path(), "VARIANT": "fixed", "PORT": str(free_port())}
    p = run(["bash", "docker/serve.sh"], env=env, timeout=30)
    assert p.returncode != 0 and "docker" in p.stderr.lower() and "Traceback" not in p.stderr


def test_serve_sh_without_gpu_runtime(tmp_path):
    """A docker that answers but lists no NVIDIA runtime: serve.sh must refuse, not start a CPU container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "docker"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncase "$1" in info) echo \'{{"runc":{{}}}}\';; '
                    f'*) exit 0;; esac\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VARIANT": "fixed", "PORT": str(free_port())}
    p = run(["bash", "docker/serve.sh"], env=env, timeout=30)
    assert p.returncode != 0, p.stdout[-2000:]
    assert "gpu" in p.stderr.lower() or "nvidia" in p.stderr.lower(), p.stderr[-2000:]
    assert "run" not in (calls.read_text().split() if calls.exists() else []), "started a container without a GPU"


# --- the runner's design, experiment and plan arguments ------------------------------------------------------------

@pytest.mark.parametrize("args, needles", [
    (["--design", "swap", "--b-sim-set", "model.base_ms=3", "--count-s", "1"], ("hot-swappable",)),
    (["--design", "nested", "--experiment", "configs/experiments/release-016-fixed-vs-030.yaml"], ("no plugin",)),
    (["--experiment", "configs/experiments/nope.yaml"], ("nope.yaml", "cannot read")),
    (["--plan-from", "reports/no-such-pilot"], ("plan.json",)),
    (["--until-decided", "--max-rounds", "2", "--min-rounds", "3"], ("min-rounds",)),
    (["--design", "swap", "--count-s", "0"], ("count_s",)),
    (["--resume", "reports/no-such-run"], ("nothing to resume",)),
])
def test_runner_arguments_ab(tmp_path, args, needles):
    quick = ["--scenario", "configs/scenarios/smoke.yaml", "--levels", "4", "--warmup-s", "1", "--measure-s", "1",
             "--drain-s", "0", "--rounds", "1", "--aa-rounds", "0"]  # should a refusal regress, the run is short
    one_error(ab(tmp_path, *args, *quick), *needles)
    nothing_written(tmp_path)


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    p = ab(tmp_path, "--experiment", "configs/experiments/sim/mission-sim.yaml", "--design", "nested", "--starts", "2",
           "--dry-run")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "SIMULATED" in p.stdout and "-m ttssim" in p.stdout and "design nested" in p.stdout
    assert "start 1 (A)" in p.stdout and "nothing was run or written" in p.stdout
    nothing_written(tmp_path)
