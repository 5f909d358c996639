"""Security defaults: loopback-only listeners, no default passwords, no token in any output,
non-root containers, ref_audio SSRF refused, bounded bodies."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading

import httpx
import numpy as np
import pytest
import soundfile as sf
import yaml
from conftest import ROOT, WatchedRun, listening_addresses, tree_text, write_scenario

from tools.sim_server import SimServer
from tts_predictor.domain import SAMPLE_RATE_HZ

FAKE_TOKEN = "hf_FAKEtokenDoNotLeak9f8e7d6c5b4a"  # not a real credential: the test looks for this exact string
FAKE_SECRET = "s3cr3t-VALUE-4b8e0c"




# --- loopback by default ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_simulator_listens_on_loopback_only_by_default():
    with SimServer("fixed") as s:  # SimServer passes no --host: the CLI default decides
        assert listening_addresses(s.port) == {"0100007F"}


def test_cli_defaults_are_loopback():
    from tools.fakeserver import parse_args as fake_args
    from ttssim.__main__ import parse_args

    assert parse_args(["--variant", "fixed"]).host == "127.0.0.1"
    assert fake_args([]).host == "127.0.0.1"


@pytest.mark.slow
def test_make_serve_defaults_to_loopback():
    out = subprocess.run([sys.executable, "-m", "ttssim.launch", "--variant", "fixed", "--backend", "sim",
                          "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--host 127.0.0.1" in out.stdout


def _compose():
    return yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())


def test_compose_publishes_ports_on_loopback_only():
    """Every published port names 127.0.0.1 (or a variable defaulting to it): never all interfaces."""
    services = _compose().get("services") or {}
    published = 0
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            published += 1
            if isinstance(port, dict):
                host_ip = str(port.get("host_ip", ""))
            else:  # "IP:HOST:CONTAINER"; HOST may itself be ${PORT:-8091}, so take only a leading IP or variable
                m = re.match(r"(\d+\.\d+\.\d+\.\d+|\$\{[^}]*\}):", str(port))
                host_ip = m.group(1) if m else ""
            assert host_ip == "127.0.0.1" or re.fullmatch(r"\$\{\w+:-127\.0\.0\.1\}", host_ip), (name, port)
        assert svc.get("network_mode") != "host", f"{name} uses the host network: binds every interface"
    assert published > 0


def test_compose_grafana_has_no_default_password():
    """Grafana's admin password must come from the environment and be required (${VAR:?...}), never a literal."""
    services = _compose().get("services") or {}
    graf = [s for n, s in services.items() if "grafana" in n or "grafana" in str(s.get("image", ""))]
    assert graf, "no grafana service"
    env = graf[0].get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    pw = env.get("GF_SECURITY_ADMIN_PASSWORD")
    assert pw is not None and re.fullmatch(r"\$\{\w+:\?[^}]*\}", str(pw)), pw
    text = (ROOT / "docker" / "compose.yaml").read_text()
    assert not re.search(r"(?i)password\S*\s*[:=]\s*['\"]?(admin|grafana|password)\b", text)


@pytest.mark.slow
def test_compose_refuses_to_start_grafana_without_a_password():
    """`docker compose config` (no daemon needed) must fail when the password variable is unset."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20).returncode != 0:
        pytest.skip("docker compose plugin not installed")
    env = {k: v for k, v in os.environ.items() if "PASSWORD" not in k}
    p = subprocess.run(["docker", "compose", "-f", "docker/compose.yaml", "config"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "PASSWORD" in p.stderr.upper(), p.stderr[-1000:]


DOCKERFILES = [p for p in (ROOT / "docker").glob("Dockerfile*") if not p.name.endswith(".dockerignore")]


def test_dockerfiles_end_as_a_non_root_user():
    assert DOCKERFILES
    for df in DOCKERFILES:
        users = re.findall(r"(?im)^\s*USER\s+(\S+)", df.read_text())
        assert users, f"{df.name}: no USER: the container runs as root"
        assert users[-1].split(":")[0] not in ("root", "0"), f"{df.name}: last USER is {users[-1]}"


# --- tokens never reach the run folder ----------------------------------------------------------------------------

@pytest.mark.slow
def test_locust_run_leaves_no_trace_of_tokens(tmp_path):
    env = {**os.environ, "HF_TOKEN": FAKE_TOKEN, "HUGGING_FACE_HUB_TOKEN": FAKE_TOKEN, "TTS_API_KEY": FAKE_SECRET}
    scen = write_scenario(tmp_path, measure=1.5)
    with SimServer("fixed") as sim:
        run = WatchedRun(sim.url, scen, tmp_path / "run", "--variant", "fixed", env=env).run(
            timeout_s=40, fault_seen=lambda: True)
    assert run.returncode == 0, run.output[-2000:]
    text = tree_text(tmp_path / "run") + run.output
    assert "manifest.json" in text and "requests.jsonl" in text
    for needle in (FAKE_TOKEN, FAKE_SECRET, base64.b64encode(FAKE_TOKEN.encode()).decode()):
        assert needle not in text


@pytest.mark.slow
def test_ab_run_and_report_leave_no_trace_of_tokens(tmp_path):
    """The A/B runner passes its environment to the server it starts; nothing of it may land in the run folder."""
    env = {**os.environ, "HF_TOKEN": FAKE_TOKEN, "TTS_API_KEY": FAKE_SECRET}
    p = subprocess.run([sys.executable, "-m", "loadtest.ab", "--backend", "sim", "--sim-config",
                        "configs/sim/fast.yaml", "--rounds", "1", "--aa-rounds", "0", "--levels", "4",
                        "--warmup-s", "0.5", "--measure-s", "1.5", "--drain-s", "0", "--seed", "1",
                        "--out", str(tmp_path), "--name", "run"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "run"
    assert (run / "manifest.json").is_file() and len(list((run / "blocks").iterdir())) == 2
    text = tree_text(run) + p.stdout + p.stderr
    assert "server.log" in text
    for needle in (FAKE_TOKEN, FAKE_SECRET):
        assert needle not in text


# --- the simulator refuses ref_audio URLs to private or loopback addresses (SSRF) -----------------------------------

class Canary:
    """A loopback listener that counts connections: a refused URL must never reach it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
                self.hits += 1
                c.close()
            except OSError:
                pass

    def close(self):
        self.stop.set()
        self.t.join(2)
        self.sock.close()


@pytest.mark.slow
def test_ref_audio_urls_to_private_or_loopback_addresses_are_refused():
    canary = Canary()
    try:
        urls = [f"http://127.0.0.1:{canary.port}/ref.wav", f"http://localhost:{canary.port}/ref.wav",
                f"http://[::1]:{canary.port}/a.wav", f"http://[::ffff:127.0.0.1]:{canary.port}/a.wav",
                f"http://2130706433:{canary.port}/a.wav", "http://10.1.2.3/a.wav", "http://192.168.0.1/a.wav",
                "http://172.16.5.4/a.wav", "http://169.254.169.254/latest/meta-data", "http://0.0.0.0/a.wav",
                f"https://127.0.0.1:{canary.port}/a.wav"]
        with SimServer("fixed") as s:
            for url in urls:
                body = {"input": "hello", "task_type": "Base", "ref_audio": url, "ref_text": "hi"}
                r = httpx.post(s.url + "/v1/audio/speech", json=body, timeout=20)
                err = r.json()["error"]
                assert r.status_code == 400 and err["param"] == "ref_audio", (url, r.text)
                assert "blocked address" in err["message"], (url, err["message"])
        assert canary.hits == 0
    finally:
        canary.close()


# --- bounded request bodies and audio --------------------------------------------------------------------------------

def _wav_data_uri(seconds: float) -> str:
    buf = io.BytesIO()
    sf.write(buf, (np.ones(int(SAMPLE_RATE_HZ * seconds)) * 0.1).astype("float32"), SAMPLE_RATE_HZ, format="WAV",
             subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.slow
def test_request_body_and_reference_audio_are_bounded():
    with SimServer("fixed", overrides=["server.max_body_bytes=200000", "audio.max_ref_audio_s=2"]) as s:
        url = s.url + "/v1/audio/speech"
        big = httpx.post(url, content=json.dumps({"input": "x" * 300000}), timeout=20,
                         headers={"Content-Type": "application/json"})
        assert big.status_code == 413 and "exceeds 200000 bytes" in big.json()["error"]["message"]
        body = {"input": "hello", "task_type": "Base", "ref_text": "hi"}
        long_ref = httpx.post(url, json={**body, "ref_audio": _wav_data_uri(3.0)}, timeout=20)
        assert long_ref.status_code == 400 and long_ref.json()["error"]["param"] == "ref_audio", long_ref.text
        ok = httpx.post(url, json={**body, "ref_audio": _wav_data_uri(1.0)}, timeout=20)
        assert ok.status_code == 200  # the same request under the bound passes: the bound, not the format, refused
        mnt = httpx.post(url, json={"input": "hello", "max_new_tokens": 5000}, timeout=20)
        assert mnt.status_code == 400 and "4096" in mnt.json()["error"]["message"]  # audio length is bounded
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200  # still serving
