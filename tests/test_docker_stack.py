"""A real Prometheus (Debian's package) on loopback scrapes the simulator; every query of every provisioned
Grafana panel must return data. Proves the dashboards ask for series that exist, with labels that exist."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from loadtest.prompts import load_voice, speech_payload
from ttssim.testing import SimServer

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "docker/grafana/dashboards").glob("*.json"))
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _queries():
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        for panel in dash["panels"]:
            assert panel["datasource"]["uid"] == "tts-prometheus"
            for t in panel["targets"]:
                yield dash["uid"], panel["title"], t["expr"]


@pytest.fixture(scope="module")
def prometheus_on_sim(tmp_path_factory):
    if shutil.which("prometheus") is None:
        subprocess.run(["bash", str(ROOT / "scripts/system-deps.sh")], check=True)
    tmp = tmp_path_factory.mktemp("prom")
    with SimServer("fixed", config="configs/sim/fast.yaml") as sim:
        deadline = time.monotonic() + 60
        while True:  # the port file comes before /health answers
            try:
                _get(f"{sim.url}/health")
                break
            except OSError:
                assert time.monotonic() < deadline, "simulator never became healthy"
                time.sleep(0.2)
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n  - job_name: tts-server\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{sim.port}']}}]\n")
        port = _free_port()
        log = open(tmp / "prometheus.log", "wb")
        prom = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--web.listen-address=127.0.0.1:{port}",
                                 f"--storage.tsdb.path={tmp / 'data'}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            voice = load_voice(ROOT / "configs/voices/ref.yaml")
            body = json.dumps(speech_payload("The quick brown fox jumps over the lazy dog.", voice,
                                             model="Qwen/Qwen3-TTS-12Hz-0.6B-Base", language="English",
                                             mode="wav")).encode()
            statuses = []

            def client(stop):
                while not stop.is_set():
                    req = urllib.request.Request(f"{sim.url}/v1/audio/speech", data=body,
                                                 headers={"Content-Type": "application/json"})
                    try:
                        with urllib.request.urlopen(req, timeout=30) as r:
                            r.read()
                            statuses.append(r.status)
                    except OSError as e:
                        statuses.append(str(e))

            stop = threading.Event()
            threads = [threading.Thread(target=client, args=(stop,), daemon=True) for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(20)  # >= a dozen scrapes: every rate([1m]) has two samples and some increase
            yield url, statuses
            stop.set()
            for t in threads:
                t.join(timeout=35)
        finally:
            prom.terminate()
            prom.wait(timeout=20)
            log.close()


def test_simulator_served_requests(prometheus_on_sim):
    _, statuses = prometheus_on_sim
    assert statuses.count(200) >= 4, statuses[:10]


@pytest.mark.parametrize(("dashboard", "panel", "expr"), list(_queries()), ids=lambda x: str(x)[:40])
def test_every_panel_query_returns_data(prometheus_on_sim, dashboard, panel, expr):
    url, _ = prometheus_on_sim
    res = json.loads(_get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    assert res["status"] == "success", res
    values = [float(s["value"][1]) for s in res["data"]["result"]]
    assert values, f"{dashboard} / {panel}: no data for {expr}"
    assert all(v == v for v in values), f"{dashboard} / {panel}: NaN for {expr}"  # NaN = 0/0: nothing happened
