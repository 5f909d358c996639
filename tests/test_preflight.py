"""`make preflight` (loadtest/preflight/): the step logic, PASS / FAIL / SKIP and the fix texts.

Nothing here has Docker or a GPU. The vllm path runs against a fake `docker` and `nvidia-smi` on PATH (scripts in the
test's tmp folder with canned answers; `docker run -d` starts the simulator behind docker/serve.sh, so the real
serve.sh, control folder mount and hot swap are exercised), and in a dry run (every command printed, none run). The
sim path runs for real. Pure parts (sync signature, memory rule, a server's 200 error body) are unit tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, run

from loadtest import experiment as ex
from loadtest import preflight as pf
from loadtest.preflight import host as preflight_host
from loadtest.readiness import make_probe
from loadtest.scraper import parse_metrics
from tts_predictor import metrics as pm

REVISION = "0123456789abcdef0123456789abcdef01234567"


# --- unit tier: pure functions and the dry run ----------------------------------------------------------------


def report():
    lines = []
    return pf.Report(lines.append), lines


def rows(text: str):
    return parse_metrics(textwrap.dedent(text))[1]


def exposition(variant_calls: dict[str, float], syncs: float, ocalls: float, otokens: float, epoch: int) -> str:
    lines = [f'{pm.CALLS}{{variant="{v}"}} {c}' for v, c in variant_calls.items()]
    lines += [f"{pm.SYNCS} {syncs}", f"{pm.OBSERVED_CALLS} {ocalls}", f"{pm.OBSERVED_TOKENS} {otokens}",
              f"{pm.CONTROL_EPOCH} {epoch}"]
    return "\n".join(lines) + "\n"


BEFORE = exposition({"original": 100.0}, 40.0, 8.0, 8.0, 1)


def test_sync_signature_passes_when_epoch_label_and_syncs_agree():
    # fixed: 5 syncs per observed call
    after = exposition({"original": 100.0, "fixed": 450.0}, 40.0 + 50.0, 18.0, 20.0, 2)
    status, detail, fix = pf.sync_signature(rows(BEFORE), rows(after), "fixed", 2)
    assert status == "pass" and fix is None
    assert "epoch 2 live" in detail and "450 calls under fixed only" in detail and "expected 50" in detail


@pytest.mark.parametrize(("after", "needle", "fix_needle"), [
    (exposition({"original": 100.0, "fixed": 450.0}, 90.0, 18.0, 20.0, 1), "shows 1.0, the control file says epoch 2",
     "CONTROL_DIR"),
    (exposition({"original": 130.0, "fixed": 450.0}, 90.0, 18.0, 20.0, 2), "calls moved under ['fixed', 'original']",
     "step boundary"),
    (exposition({"original": 100.0, "fixed": 450.0}, 40.0 + 30.0, 18.0, 20.0, 2), "expected 50",
     "rebuild the image"),
    (exposition({"original": 100.0, "fixed": 450.0}, 40.0, 8.0, 8.0, 2), "none observed", "observe must be true"),
    (f"{pm.CONTROL_EPOCH} 2\n", "no tts_predictor_* series", "plugin is not loaded"),
])
def test_sync_signature_failures_say_what_and_how_to_fix(after, needle, fix_needle):
    status, detail, fix = pf.sync_signature(rows(BEFORE), rows(after), "fixed", 2)
    assert status == "fail"
    assert needle in detail and fix_needle in fix


def test_gpu_memory_rule_is_the_stages_shares_of_total_memory():
    shares = {"A": pf.stage_memory_shares(ex.mission().arms["A"])}
    assert shares["A"] == [0.3, 0.2]  # configs/stages/qwen3_tts_b256.yaml: talker 0.3, code2wav 0.2
    rep, lines = report()
    pf.check_gpu_memory(rep, [pf.Gpu(0, "NVIDIA H100 80GB HBM3", 81559.0, 41000.0)], shares)
    assert rep.checks[-1].status == "pass" and "need 39.8 GiB = 0.5 x 79.6 GiB" in rep.checks[-1].detail
    rep, lines = report()
    pf.check_gpu_memory(rep, [pf.Gpu(0, "NVIDIA H100 80GB HBM3", 81559.0, 30000.0)], shares)
    assert rep.checks[-1].status == "fail" and "nvidia-smi --query-compute-apps" in rep.checks[-1].fix
    assert any(line.strip().startswith("fix:") for line in lines)


class _Resp:
    def __init__(self, status, body, ctype):
        self.status, self._body, self.headers = status, body, {"content-type": ctype}

    def chunks(self):
        yield self._body

    def close(self):
        pass


class _Transport:
    def __init__(self, resp):
        self.resp = resp

    def post(self, path, body, headers):
        return self.resp


def test_a_base_request_refused_with_200_quotes_the_server_and_points_at_the_public_reports():
    msg = "Unsupported speaker: Vivian"
    body = json.dumps({"error": {"message": msg, "type": "BadRequestError", "param": None, "code": 400}}).encode()
    rep, lines = report()
    probe = make_probe("Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    out = pf.request_check(rep, "variant.original.wav", _Transport(_Resp(200, body, "application/json")), probe,
                           "wav", simulated=False)
    c = rep.checks[-1]
    assert not out.ok and c.status == "fail"
    assert c.detail == f"wav request failed: http 200 error body (code 400): {msg}"
    for ref in ("#2902", "Unsupported speaker: Vivian", "#1654", "gpustack #4817", "0.15.1"):
        assert ref in c.fix
    # the probe is a Base voice-clone request with the reference clip inline
    sent = json.loads(probe.bodies["stream"])
    assert sent["task_type"] == "Base" and sent["ref_audio"].startswith("data:audio/wav;base64,")
    assert sent["stream"] is True and sent["response_format"] == "pcm"


@pytest.mark.parametrize(("name", "warned"), [("NVIDIA H100 80GB HBM3", False), ("NVIDIA H200", False),
                                              ("NVIDIA GH200 480GB", False), ("NVIDIA A10G", True),
                                              ("NVIDIA L40S", True)])
def test_off_h100_gpus_are_warned_not_failed(name, warned):
    assert (pf.H100_CLASS.search(name) is None) is warned


def test_dry_run_prints_every_vllm_command_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODEL_REVISION", REVISION)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("HF_CACHE", str(tmp_path / "hf"))
    out_dir = tmp_path / "out"
    code = pf.main(["--backend", "vllm", "--dry-run", "--prepare", "--out", str(out_dir)])
    text = capsys.readouterr().out
    assert code == 0 and not out_dir.exists()
    lines = text.splitlines()
    assert lines[0].startswith("make preflight: BACKEND=vllm -> REAL vllm-omni") and "DRY RUN" in lines[0]
    for needle in ("$ docker version --format '{{.Server.Version}}'",
                   "$ docker info --format '{{json .Runtimes}}'", "$ bash docker/serve.sh --probe-gpu",
                   "$ nvidia-smi --query-gpu=index,name,memory.total,memory.free",
                   "bash docker/serve.sh --pull-only", "bash docker/serve.sh --build-only",
                   "bash docker/serve.sh --fetch-model",
                   "$ docker image inspect --format '{{.Id}}' tts-vllm-omni:0.16.0-original",
                   "$ docker image inspect --format '{{.Id}}' tts-vllm-omni:0.16.0-fixed",
                   "--entrypoint python3 tts-vllm-omni:0.16.0-original -c \"$INSIDE_IMAGE\" "
                   f"/home/tts/.cache/huggingface/hub/models--Qwen--Qwen3-TTS-12Hz-0.6B-Base/snapshots/{REVISION}",
                   f"MODEL_REVISION={REVISION}", "bash docker/serve.sh",
                   '"variant": "vectorized", "observe": true, "epoch": 3',
                   "POST http://127.0.0.1:<port>/v1/audio/speech  # Base, stream"):
        assert needle in text, needle
    serve = [ln for ln in lines if ln.startswith("$ ") and ln.endswith("bash docker/serve.sh")]
    assert len(serve) == 1 and "CONTROL_DIR=" in serve[0] and "VARIANT=original" in serve[0]
    # PREPARE: the hub lookup, then pull, two builds and the fetch, each announced as a numbered step
    steps = [ln for ln in lines if ln.startswith("prepare [")]
    assert steps == ["prepare [1/5] resolve Qwen/Qwen3-TTS-12Hz-0.6B-Base@main through the hub API ...",
                     "prepare [2/5] pull vllm/vllm-omni:v0.16.0 ...",
                     "prepare [3/5] build tts-vllm-omni:0.16.0-original ...",
                     "prepare [4/5] build tts-vllm-omni:0.16.0-fixed ...",
                     f"prepare [5/5] fetch Qwen/Qwen3-TTS-12Hz-0.6B-Base@{REVISION} ..."]
    assert "$ GET https://huggingface.co/api/models/Qwen/Qwen3-TTS-12Hz-0.6B-Base/revision/main" in text
    assert not [ln for ln in lines if ln.startswith("FAIL")]  # the revision is pinned; nothing else is judged
    assert lines[-1].startswith("preflight dry run:") and "nothing run" in lines[-1]


def test_dry_run_of_an_experiment_with_an_arm_without_the_plugin(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODEL_REVISION", REVISION)
    code = pf.main(["--backend", "vllm", "--dry-run", "--experiment",
                    "configs/experiments/release-016-fixed-vs-030.yaml"])
    text = capsys.readouterr().out
    assert code == 0
    serve = [ln for ln in text.splitlines() if ln.startswith("$ ") and "bash docker/serve.sh" in ln
             and "--probe-gpu" not in ln]
    assert len(serve) == 2
    assert "CONTROL_DIR=" in serve[0] and "VLLM_OMNI=0.16.0" in serve[0]  # the plugin arm: hot swap
    assert "CONTROL_DIR=" not in serve[1] and "VLLM_OMNI=0.30.0" in serve[1] and "DEPLOY=qwen3_tts.yaml" in serve[1]
    assert "variants fixed" in text and "arm.v030.evidence" in text


@pytest.mark.parametrize(("argv", "needle"), [
    (["--backend", "sim", "--variant", "nope"], "--variant 'nope'"),
    (["--backend", "sim", "--experiment", "configs/experiments/none.yaml"], "none.yaml: cannot read"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert pf.main(argv + ["--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


# --- slow tier: the simulator for real, and the vllm path against a fake docker ----------------------------------


@pytest.mark.slow
def test_sim_preflight_runs_every_step_for_real(tmp_path):
    out = tmp_path / "pre"
    t0 = time.monotonic()
    p = run([sys.executable, "-m", "loadtest.preflight", "--backend", "sim", "--out", str(out)], timeout=120)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith("make preflight: BACKEND=sim -> SIMULATED")
    assert lines[-1].startswith("preflight OK:") and " s -> " in lines[-1]
    doc = json.loads((out / "preflight.json").read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert doc["simulated"] is True and doc["ok"] is True
    assert {c["status"] for c in doc["checks"]} <= set(pf.STATUSES)
    for v in ("original", "fixed", "vectorized"):
        assert checks[f"variant.{v}.wav"]["status"] == "pass"
        assert checks[f"variant.{v}.stream"]["status"] == "pass" and "underrun" in checks[f"variant.{v}.stream"]["detail"]
        assert checks[f"variant.{v}.metrics"]["status"] == "pass", checks[f"variant.{v}.metrics"]
        assert f"calls under {v} only" in checks[f"variant.{v}.metrics"]["detail"]
    assert checks["host.gpu"]["status"] == "skip" and checks["telemetry.gpu"]["status"] == "skip"
    assert checks["telemetry.process"]["status"] == "pass" and checks["server.A.stop"]["status"] == "pass"
    assert (out / "server-A.log").read_text().count("SIMULATED") >= 1
    print(f"sim preflight took {took:.1f} s (its own clock: {doc['elapsed_s']} s)")


FAKE_DOCKER = r'''#!{python}
"""A fake docker CLI for tests/test_preflight.py: canned answers from $FAKE_DOCKER_CONFIG; `run -d` starts ttssim."""
import json, os, signal, subprocess, sys, time
cfg = json.load(open(os.environ["FAKE_DOCKER_CONFIG"]))
state = cfg["state"]
args = sys.argv[1:]
with open(os.path.join(state, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")

def answer(key, default=(0, "", "")):
    rc, out, err = cfg.get(key, default)
    sys.stdout.write(out); sys.stderr.write(err); sys.exit(rc)

def value(flag):
    return args[args.index(flag) + 1] if flag in args else None

def pid_of(name):
    try:
        pid = int(open(os.path.join(state, name + ".pid")).read())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None

cmd = args[0]
if cmd == "version":
    answer("version")
if cmd == "info" and "{{.DockerRootDir}}" in args:
    answer("root")  # default: no answer, the docker folder's space is not judged (this box is not a GPU host)
if cmd == "info":
    answer("info")
if cmd == "build":  # docker/serve.sh rebuilds an image whose source label differs from the checkout's
    sys.exit(0)
if cmd == "image" and args[1] == "inspect":
    image = args[-1]
    if image in cfg["images"] and "Labels" in " ".join(args):
        sys.exit(0)  # no source label: serve.sh rebuilds (the fake build above)
    if image in cfg["images"]:
        print(cfg["images"][image]); sys.exit(0)
    sys.stderr.write(f"Error response from daemon: No such image: {image}\n"); sys.exit(1)
if cmd == "run" and value("--entrypoint") == "nvidia-smi":  # docker/serve.sh --probe-gpu
    answer("probe", (125, "", 'docker: Error response from daemon: could not select device driver "" with '
                              'capabilities: [[gpu]].\n'))
if cmd == "run" and "--entrypoint" in args:
    image = args[args.index("--entrypoint") + 2]
    answer("inside:" + image, (125, "", f"Unable to find image '{image}' locally\n"))
if cmd == "run" and "-d" in args:
    name, port = value("--name"), value("-p").split(":")[1]
    control = [v for v in (args[i + 1] for i, a in enumerate(args) if a == "-v") if v.endswith(":/run/tts-control:ro")]
    log = open(os.path.join(state, name + ".log"), "w")
    log.write("INFO Using FLASH_ATTN backend.\n"); log.flush()
    cmd = [sys.executable, "-m", "ttssim", "--port", port, "--config", "configs/sim/default.yaml"]
    cmd += ["--control", control[0].split(":")[0] + "/control.json"] if control else ["--variant", "original"]
    p = subprocess.Popen(cmd, cwd=cfg["root"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    open(os.path.join(state, name + ".pid"), "w").write(str(p.pid))
    print("f" * 64); sys.exit(0)
if cmd == "container" and args[1] == "inspect":
    sys.exit(0 if pid_of(args[-1]) else 1)
if cmd == "inspect":
    print("true" if pid_of(args[-1]) else "false"); sys.exit(0)
if cmd == "stop":
    pid = pid_of(args[-1])
    if pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if pid_of(args[-1]) is None:
                break
            time.sleep(0.1)
    sys.exit(0)
if cmd == "rm":
    sys.exit(0)
if cmd == "logs":
    log = os.path.join(state, args[-1] + ".log")
    if "-f" in args:
        os.execvp("tail", ["tail", "-n", "+1", "-f", log])
    sys.stdout.write(open(log).read()); sys.exit(0)
sys.stderr.write(f"fake docker: unexpected {args}\n"); sys.exit(2)
'''

FAKE_SMI = r'''#!/bin/sh
[ -n "$FAKE_SMI" ] || { echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" >&2; exit 9; }
echo "$FAKE_SMI"
'''

GOOD_INSIDE = {"dist_version": "0.16.0", "version": "0.16.0", "cuda": True, "device": "NVIDIA H100 80GB HBM3",
               "plugins": ["tts_predictor_variant=tts_predictor.plugin:register"], "snapshot_readable": True}
NO_GPU_PROBE = [125, "", 'docker: Error response from daemon: could not select device driver "" with capabilities: '
                         '[[gpu]].\n']
NVIDIA_INFO = '{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{}}\n'


FAKE_PYNVML = """from types import SimpleNamespace
NVML_CLOCK_SM = 1
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUtilizationRates(h): return SimpleNamespace(gpu=37, memory=20)
def nvmlDeviceGetClockInfo(h, which): return 1755
def nvmlDeviceGetPowerUsage(h): return 312000
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(used=30 * 2**30, total=80 * 2**30, free=50 * 2**30)
"""


class FakeHost:
    """A tmp bin folder with fake docker and nvidia-smi, an HF cache with the pinned snapshot, canned answers."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.state = tmp / "state"
        for d in (self.bin, self.state):
            d.mkdir()
        for name, text in (("docker", FAKE_DOCKER.replace("{python}", sys.executable)), ("nvidia-smi", FAKE_SMI)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod((self.bin / name).stat().st_mode | stat.S_IXUSR)
        self.hf = tmp / "hf"
        snap = self.hf / "hub/models--Qwen--Qwen3-TTS-12Hz-0.6B-Base/snapshots" / REVISION
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
        self.cfg = {"state": str(self.state), "root": str(ROOT), "version": [0, "27.3.1\n", ""],
                    "info": [0, NVIDIA_INFO, ""], "probe": [0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n", ""],
                    "images": {"tts-vllm-omni:0.16.0-original": "sha256:" + "a" * 64,
                               "tts-vllm-omni:0.16.0-fixed": "sha256:" + "b" * 64},
                    **{f"inside:tts-vllm-omni:0.16.0-{v}": [0, "PREFLIGHT " + json.dumps(GOOD_INSIDE) + "\n", ""]
                       for v in ("original", "fixed")}}
        self.smi = "0, NVIDIA H100 80GB HBM3, 81559, 80000"
        self.py = tmp / "py"  # a fake NVML (nvidia-ml-py's module name): the driver library this host lacks
        self.py.mkdir()
        (self.py / "pynvml.py").write_text(FAKE_PYNVML)

    def env(self) -> dict[str, str]:
        (self.tmp / "fake.json").write_text(json.dumps(self.cfg))
        return {**os.environ, "PYTHONPATH": str(self.py), "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
                "FAKE_DOCKER_CONFIG":
                str(self.tmp / "fake.json"), "FAKE_SMI": self.smi, "MODEL_REVISION": REVISION, "HF_CACHE": str(self.hf)}

    def calls(self) -> list[list[str]]:
        path = self.state / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def cleanup(self) -> None:
        for pid_file in self.state.glob("*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


@pytest.fixture
def host(tmp_path):
    h = FakeHost(tmp_path)
    yield h
    h.cleanup()


def preflight(host: FakeHost, *args: str, timeout: float = 180):
    out = host.tmp / "pre"
    p = run([sys.executable, "-m", "loadtest.preflight", "--out", str(out), *args], timeout=timeout, env=host.env())
    doc = json.loads((out / "preflight.json").read_text()) if (out / "preflight.json").exists() else None
    return p, doc, {c["name"]: c for c in (doc or {}).get("checks", [])}


@pytest.mark.slow
def test_vllm_path_against_a_fake_docker_passes_end_to_end(host):
    p, doc, checks = preflight(host, "--backend", "vllm", "--variant", "original,fixed")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    failed = [c for c in doc["checks"] if c["status"] == "fail"]
    assert not failed, failed
    assert checks["host.docker"]["detail"] == "Docker Engine 27.3.1"
    assert checks["host.nvidia_runtime"]["status"] == "pass"
    assert "NVIDIA H100 80GB HBM3" in checks["host.gpu"]["detail"] and "warning" not in checks["host.gpu"]
    assert checks["host.gpu_memory"]["status"] == "pass" and "0.3+0.2" in checks["host.gpu_memory"]["detail"]
    assert checks["image.0.16.0-original.vllm_omni"]["detail"].startswith("vllm_omni.__version__ 0.16.0")
    assert "tts_predictor_variant=" in checks["image.0.16.0-original.plugin"]["detail"]
    assert checks["model.snapshot"]["status"] == "pass"
    # one server (serve.sh with CONTROL_DIR), both variants switched in it and confirmed by their sync signatures
    assert checks["server.A"]["status"] == "pass" and "control file" in checks["server.A"]["detail"]
    for v in ("original", "fixed"):
        assert checks[f"variant.{v}.metrics"]["status"] == "pass" and f"under {v} only" in checks[f"variant.{v}.metrics"]["detail"]
    assert checks["server.A.log_evidence"]["status"] == "pass"
    assert checks["telemetry.gpu"]["detail"] == "NVML GPU 0: 37 % busy, SM 1755 MHz, 30720 MiB used, 312 W (GPUS=all)"
    runs = [c for c in host.calls() if c[0] == "run" and "-d" in c]
    assert len(runs) == 1 and any(a.endswith(":/run/tts-control:ro") for a in runs[0])
    assert [c for c in host.calls() if c[0] == "stop"]  # stopped gracefully through serve.sh


@pytest.mark.slow
def test_engine_down_fails_the_host_and_blocks_the_rest(host):
    host.cfg["version"] = [1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
                                  "daemon running?\n"]
    p, doc, checks = preflight(host, "--backend", "vllm")
    assert p.returncode == 1
    c = checks["host.docker"]
    assert c["status"] == "fail" and "Is the docker daemon running?" in c["detail"] and "systemctl start docker" in c["fix"]
    assert checks["host.nvidia_runtime"]["status"] == "skip"
    assert checks["server"]["status"] == "skip" and "host.docker" in checks["server"]["detail"]
    assert not [c for c in host.calls() if c[0] == "run" and "-d" in c]
    assert "FAIL  host.docker" in p.stdout and "fix: start the engine" in p.stdout


@pytest.mark.slow
def test_no_nvidia_runtime_a_small_gpu_and_a_missing_image(host):
    host.cfg["info"] = [0, '{"io.containerd.runc.v2":{},"runc":{}}\n', ""]
    host.cfg["probe"] = NO_GPU_PROBE
    host.smi = "0, NVIDIA A10G, 23028, 5000"
    del host.cfg["images"]["tts-vllm-omni:0.16.0-fixed"]
    p, doc, checks = preflight(host, "--backend", "vllm")
    assert p.returncode == 1
    assert checks["host.nvidia_runtime"]["status"] == "fail" and "NVIDIA Container Toolkit" in checks["host.nvidia_runtime"]["fix"]
    gpu = checks["host.gpu"]
    assert gpu["status"] == "pass" and "A10G is not H100-class" in gpu["warning"]
    mem = checks["host.gpu_memory"]
    assert mem["status"] == "fail" and "need 11.2 GiB = 0.5 x 22.5 GiB" in mem["detail"] and "free 4.9 GiB" in mem["detail"]
    img = checks["image.0.16.0-fixed"]
    assert img["status"] == "fail" and "No such image" in img["detail"]
    assert "bash docker/serve.sh --pull-only" in img["fix"] and "bash docker/serve.sh --build-only" in img["fix"]
    assert checks["image.0.16.0-fixed.plugin"]["status"] == "skip"
    assert checks["image.0.16.0-original.plugin"]["status"] == "pass"
    assert "WARNING: NVIDIA A10G is not H100-class" in p.stdout


@pytest.mark.slow
def test_an_image_without_the_plugin_or_cuda_and_an_unpinned_model(host):
    bad = {**GOOD_INSIDE, "plugins": [], "cuda": False, "device": None, "dist_version": "0.16.1.dev3+g1234"}
    host.cfg["inside:tts-vllm-omni:0.16.0-original"] = [0, "PREFLIGHT " + json.dumps(bad) + "\n", ""]
    host.smi = ""  # nvidia-smi cannot talk to the driver
    env = host.env()
    env.pop("MODEL_REVISION")
    out = host.tmp / "pre"
    p = run([sys.executable, "-m", "loadtest.preflight", "--out", str(out), "--backend", "vllm",
             "--variant", "fixed"], timeout=120, env=env)
    checks = {c["name"]: c for c in json.loads((out / "preflight.json").read_text())["checks"]}
    assert p.returncode == 1
    assert checks["model.revision"]["status"] == "fail" and "Pinning the model" in checks["model.revision"]["fix"]
    assert checks["host.gpu"]["status"] == "fail" and "couldn't communicate with the NVIDIA driver" in checks["host.gpu"]["detail"]
    v = checks["image.0.16.0-original.vllm_omni"]
    assert v["status"] == "fail" and "distribution 0.16.1.dev3+g1234; the arm wants 0.16.0" in v["detail"]
    assert checks["image.0.16.0-original.plugin"]["status"] == "fail"
    assert "no tts_predictor_variant entry point" in checks["image.0.16.0-original.plugin"]["detail"]
    assert checks["image.0.16.0-original.cuda"]["status"] == "fail"
    assert checks["image.0.16.0-fixed.plugin"]["status"] == "pass"


@pytest.mark.slow
@pytest.mark.parametrize(("runtime", "probe"), [(True, False), (False, False), (False, True)])
def test_the_automatic_backend_is_make_serves_rule(host, runtime, probe):
    if not runtime:
        host.cfg["info"] = [0, '{"runc":{}}\n', ""]
    if not probe:  # with no runtime entry, `docker run --gpus all ... nvidia-smi` may still see the GPU
        host.cfg["probe"] = NO_GPU_PROBE
    code = ("import json; from loadtest.preflight import choose_backend; from ttssim.launch import nvidia_runtime; "
            "print(json.dumps([choose_backend(None), nvidia_runtime()]))")
    p = run([sys.executable, "-c", code], env=host.env())
    (backend, why), (gpu, why_serve) = json.loads(p.stdout)
    assert backend == ("vllm" if runtime or probe else "sim") and gpu is (runtime or probe) and why == why_serve
    if probe:
        assert "but `docker run --gpus` sees GPU 0: NVIDIA H100" in why


class CannedShell(pf.Shell):
    """Answers by the command's first two words; nothing runs."""

    def __init__(self, answers):
        super().__init__(False, lambda line: None)
        self.answers = answers

    def run(self, argv, timeout_s, env=None):
        return self.answers.get(" ".join(argv[:2]), (0, "", ""))


def test_host_gpu_checks_the_containers_gpu_only(monkeypatch):
    """GPUS=device=2 on a 4-GPU node: GPU 2's model and free memory are judged, not GPU 0's."""
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    every = [pf.Gpu(i, "NVIDIA H100 80GB HBM3", 81559.0, 1000.0 if i != 2 else 80000.0) for i in range(4)]
    monkeypatch.setattr(preflight_host, "read_gpus", lambda shell: (every, "nvidia-smi"))  # check_host's lookup
    shell = CannedShell({"docker version": (0, "27.3.1\n", ""), "docker info": (0, NVIDIA_INFO, "")})
    monkeypatch.setenv("GPUS", "device=2")
    rep, _ = report()
    gpus = pf.check_host(rep, shell)
    assert [g.index for g in gpus] == [2] and "GPU 2 (1 of the host's 4 for GPUS=device=2)" in rep.checks[-1].detail
    pf.check_gpu_memory(rep, gpus, {"A": [0.3, 0.2]})
    assert rep.checks[-1].status == "pass"  # GPU 0 is nearly full, GPU 2 is free: the container's GPU decides
    monkeypatch.setenv("GPUS", "device=7")
    rep, _ = report()
    assert pf.check_host(rep, shell) == [] and rep.checks[-1].status == "fail" and "GPUS=device=7" in rep.checks[-1].detail


def _sim_experiment(tmp_path, fault: str, request: str = "base") -> Path:
    """A sim-only experiment whose servers carry one fault setting (configs/experiments/sim/mission-sim.yaml's)."""
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(f"""\
        schema: tts-experiment/1
        name: fallback-sim
        idea: the preflight's Base fallback and dead-engine stop on the simulator
        scenario: configs/scenarios/demo.yaml
        design: {{aa_rounds: 0, rounds: 1, seed: 1}}
        primary_metric: audio_throughput
        request: {request}
        arms:
          A:
            label: original
            backend: sim
            evidence: {{sync_signature: original}}
            sim: {{variant: original, config: configs/sim/quick.yaml, set: ["{fault}"]}}
          B:
            label: fixed
            backend: sim
            evidence: {{sync_signature: fixed}}
            sim: {{variant: fixed, config: configs/sim/quick.yaml, set: ["{fault}"]}}
        """))
    return path


def _sim_preflight(tmp_path, exp: Path):
    out = tmp_path / "pre"
    p = run([sys.executable, "-m", "loadtest.preflight", "--backend", "sim", "--experiment", str(exp), "--out",
             str(out)], timeout=180)
    doc = json.loads((out / "preflight.json").read_text())
    return p, {c["name"]: c for c in doc["checks"]}, out


@pytest.mark.slow
def test_sim_base_refused_falls_back_to_x_vector_and_primes(tmp_path):
    """ref_text requests refused (the engine lives): x_vector_only_mode answers, preflight names it, primes with the
    first level's concurrency and runs the variants with it."""
    p, checks, _ = _sim_preflight(tmp_path, _sim_experiment(tmp_path, "faults.ref_text_request=refused"))
    assert p.returncode == 0, p.stdout[-3000:]
    fb = checks["request.A"]
    assert fb["status"] == "pass" and "x_vector_only_mode" in fb["detail"]
    assert "base: http 400" in fb["warning"] and "`request: base_xvector`" in fb["warning"]
    prime = checks["prime.A"]
    assert prime["status"] == "pass" and prime["detail"].startswith("8 of 8 concurrent untimed base_xvector")  # demo.yaml: c=8 first
    assert checks["variant.fixed.metrics"]["status"] == "pass"


@pytest.mark.slow
def test_sim_engine_killed_by_base_stops_the_checks_and_says_so(tmp_path):
    p, checks, out = _sim_preflight(tmp_path, _sim_experiment(tmp_path, "faults.ref_text_request=fatal"))
    assert p.returncode == 1
    fb = checks["request.A"]
    assert fb["status"] == "fail" and "the engine died on a base request" in fb["detail"]
    assert "EngineCore encountered a fatal error" in fb["detail"] and "checks of this server stop here" in fb["detail"]
    assert "base_xvector -> custom_voice" in fb["fix"]
    assert not [n for n in checks if n.startswith("variant.original")]  # no variant judged on a dead engine
    assert checks["variant"]["status"] == "skip" and checks["server.A.stop"]["status"] == "pass"
    assert "EngineDeadError" in (out / "server-A.log").read_text()


@pytest.mark.slow
def test_sim_engine_dies_mid_variant_loop_stops_it(tmp_path):
    """The experiment asks for x-vector requests (so the fallback passes), the variant checks' WAV request is made
    fatal by sending ref_text: the loop stops at the first variant and names the rest as not run."""
    exp = _sim_experiment(tmp_path, "faults.ref_text_request=fatal", request="base_xvector")
    p = run([sys.executable, "-c", textwrap.dedent(f"""\
        import sys
        from loadtest import experiment as ex, readiness
        from loadtest.preflight import cli
        real = cli.run_variant
        def run_variant(rep, shell, server, variant, epoch, probe):
            return real(rep, shell, server, variant, epoch, readiness.make_probe(ex.MODEL_NAME, "base"))
        cli.run_variant = run_variant  # run_preflight (cli.py) calls it
        sys.exit(cli.main(["--backend", "sim", "--experiment", "{exp}", "--out", "{tmp_path / 'pre'}"]))
        """)], timeout=180)
    checks = {c["name"]: c for c in json.loads((tmp_path / "pre/preflight.json").read_text())["checks"]}
    assert p.returncode == 1
    assert checks["request.A"]["status"] == "pass" and checks["prime.A"]["status"] == "pass"
    assert checks["variant.original.metrics"]["status"] == "fail"
    assert "engine died" in checks["variant.original.metrics"]["detail"]
    assert checks["variant"]["detail"] == "not run: fixed (the engine died)"


def test_dry_run_lists_the_base_fallback_and_the_priming(capsys, monkeypatch):
    monkeypatch.setenv("MODEL_REVISION", REVISION)
    assert pf.main(["--backend", "vllm", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "# request.A: fallback, first that answers: base (Base with reference audio + transcript) -> base_xvector" \
        in text and "-> custom_voice (Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice" in text
    assert "# prime.A: 8 concurrent untimed" in text  # ab-default's first level


@pytest.mark.parametrize(("why", "needle"), [
    ("CUDA driver initialization failed: The NVIDIA driver on your system is too old (found version 11040)",
     "older than the CUDA 12.8"),
    ("CUDA initialization: CUDA driver version is insufficient for CUDA runtime version", "upgrade the driver"),
    ("torch.cuda.is_available() is False", "NVIDIA Container Toolkit is missing")])
def test_cuda_fix_blames_the_driver_only_when_it_is_the_driver(why, needle):
    fix = pf.cuda_fix(why, {"torch_cuda": "12.8"})
    assert needle in fix
    assert ("toolkit is not the cause" in fix) == (needle != "NVIDIA Container Toolkit is missing")


def test_disk_check_names_the_full_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_CACHE", str(tmp_path / "hf" / "not-yet"))  # not created yet: its disk is checked
    monkeypatch.setenv("COMPILE_CACHE", str(tmp_path / "cc"))
    free = {"/var/lib/docker": 500 * 2**30}

    def usage(path):
        return type("U", (), {"free": free.get(str(path), 3 * 2**30)})()

    monkeypatch.setattr(shutil, "disk_usage", usage)
    monkeypatch.setattr(preflight_host, "_existing", lambda p: p if str(p) == "/var/lib/docker" else tmp_path)
    rep, _ = report()
    pf.check_disk(rep, CannedShell({"docker info": (0, "/var/lib/docker\n", "")}))
    c = rep.checks[-1]
    assert c.status == "fail" and "hf_cache" in c.detail and "3.0 GiB free, needs 10" in c.detail
    assert "compile_cache" in c.detail and "needs 60" not in c.detail  # 3 < 5 GiB is low too; docker's 500 is not
    free[str(tmp_path)] = 100 * 2**30
    rep, _ = report()
    pf.check_disk(rep, CannedShell({"docker info": (0, "/var/lib/docker\n", "")}))
    assert rep.checks[-1].status == "pass" and "docker /var/lib/docker: 500 GiB free" in rep.checks[-1].detail
