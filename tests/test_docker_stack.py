"""A real Prometheus (Debian's package) on loopback scrapes the simulator; every query of every provisioned
Grafana panel must return data. Proves the dashboards ask for series that exist, with labels that exist."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import httpx
import pytest
from conftest import ROOT, free_port

from loadtest.prompts import load_voice, speech_payload
from loadtest.server_process import ServerProcess, ServerSpec
from tools.sim_server import SimServer
from tts_predictor.domain import MODEL_NAME

DASHBOARDS = sorted((ROOT / "docker/grafana/dashboards").glob("*.json"))
pytestmark = pytest.mark.slow
DATA_WAIT_S = 180.0  # generous: rate([1m]) needs two scrapes with an increase, later on a loaded box


def _queries():
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        for panel in dash["panels"]:
            assert panel["datasource"]["uid"] == "tts-prometheus"
            for t in panel["targets"]:
                yield dash["uid"], panel["title"], t["expr"]


def _values(url: str, expr: str) -> list[float]:
    res = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert res["status"] == "success", res
    return [float(s["value"][1]) for s in res["data"]["result"]]


def _has_data(values: list[float]) -> bool:
    return bool(values) and all(v == v for v in values)  # NaN = 0/0: nothing happened yet


@pytest.fixture(scope="module")
def prometheus_on_sim(tmp_path_factory):
    if shutil.which("prometheus") is None:
        subprocess.run(["bash", str(ROOT / "scripts/system-deps.sh")], check=True)
    tmp = tmp_path_factory.mktemp("prom")
    with SimServer("fixed", config="configs/sim/fast.yaml") as sim:
        sim.wait_ready(60)
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n  - job_name: tts-server\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{sim.port}']}}]\n")
        port = free_port()
        prom = ServerProcess(ServerSpec(cmd=["prometheus", f"--config.file={cfg}",
                                             f"--web.listen-address=127.0.0.1:{port}",
                                             f"--storage.tsdb.path={tmp / 'data'}"], port=port, stop_wait_s=20.0),
                             tmp / "prometheus.log").start()
        try:
            url = f"http://127.0.0.1:{port}"
            voice = load_voice(ROOT / "configs/voices/ref.yaml")
            body = json.dumps(speech_payload("The quick brown fox jumps over the lazy dog.", voice,
                                             model=MODEL_NAME, language="English", mode="wav")).encode()
            statuses = []

            def client(stop):
                with httpx.Client(timeout=30) as c:
                    while not stop.is_set():
                        try:
                            r = c.post(f"{sim.url}/v1/audio/speech", content=body,
                                       headers={"Content-Type": "application/json"})
                            statuses.append(r.status_code)
                        except httpx.HTTPError as e:
                            statuses.append(str(e))

            stop = threading.Event()
            threads = [threading.Thread(target=client, args=(stop,), daemon=True) for _ in range(4)]
            for t in threads:
                t.start()
            # wait until every panel has data (or the generous deadline; the tests then say which has none)
            exprs = [e for _, _, e in _queries()]
            deadline = time.monotonic() + DATA_WAIT_S
            while time.monotonic() < deadline:
                try:
                    if all(_has_data(_values(url, e)) for e in exprs):
                        break
                except (httpx.HTTPError, ValueError):
                    pass  # Prometheus still starting
                time.sleep(1.0)
            yield url, statuses
            stop.set()
            for t in threads:
                t.join(timeout=35)
        finally:
            prom.stop()


def test_simulator_served_requests(prometheus_on_sim):
    _, statuses = prometheus_on_sim
    assert statuses.count(200) >= 4, statuses[:10]


@pytest.mark.parametrize(("dashboard", "panel", "expr"), list(_queries()), ids=lambda x: str(x)[:40])
def test_every_panel_query_returns_data(prometheus_on_sim, dashboard, panel, expr):
    url, _ = prometheus_on_sim
    values = _values(url, expr)
    assert values, f"{dashboard} / {panel}: no data for {expr}"
    assert all(v == v for v in values), f"{dashboard} / {panel}: NaN for {expr}"  # NaN = 0/0: nothing happened
