"""loadtest.hub against a local HTTP server on 127.0.0.1 (this machine has no route to the hub): the resolver parses
the commit from the API's JSON, and every bad answer (unreachable, HTTP error, not JSON, no sha, a hang) is one line
that says how to set MODEL_REVISION by hand, never an exception. Also preflight's PREPARE step on those answers."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import ROOT, free_port

from loadtest import experiment as ex
from loadtest import hub
from loadtest import preflight as pf

MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
SHA = "fedcba9876543210fedcba9876543210fedcba98"


class _Hub(BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, bytes, float]] = {}  # path -> (status, body, delay)
    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append(self.path)
        status, body, delay = self.answers.get(self.path, (404, b'{"error":"Repository not found"}', 0.0))
        if delay:
            threading.Event().wait(delay)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (the time-out test)
            pass

    def log_message(self, *a):
        pass


@pytest.fixture
def local_hub(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    _Hub.answers, _Hub.seen = {}, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv(hub.ENDPOINT_ENV, base)
    yield base, _Hub
    server.shutdown()
    server.server_close()


PATH = f"/api/models/{MODEL}/revision/main"


def test_resolves_the_sha_through_hf_endpoint(local_hub):
    base, h = local_hub
    h.answers[PATH] = (200, json.dumps({"id": MODEL, "sha": SHA, "siblings": []}).encode(), 0.0)
    r = hub.resolve(MODEL)
    assert r.sha == SHA and r.error is None and r.url == base + PATH and h.seen == [PATH]


@pytest.mark.parametrize(("status", "body", "needle"), [
    (404, b'{"error":"Repository not found"}', "HTTP 404"),
    (200, b"<html>proxy login</html>", "not JSON"),
    (200, b'{"id": "x"}', 'no 40-hex "sha"'),
    (200, b'{"sha": "main"}', 'no 40-hex "sha"'),
    (500, b"", "HTTP 500"),
])
def test_a_bad_answer_is_one_line_with_the_way_by_hand(local_hub, status, body, needle):
    _, h = local_hub
    h.answers[PATH] = (status, body, 0.0)
    r = hub.resolve(MODEL)
    assert r.sha is None and needle in r.error and "\n" not in r.error
    assert "export MODEL_REVISION=<40-hex commit>" in r.error and f"could not resolve {MODEL}@main" in r.error


def test_unreachable_and_hanging_hubs_are_one_line(local_hub, monkeypatch):
    _, h = local_hub
    h.answers[PATH] = (200, json.dumps({"sha": SHA}).encode(), 2.0)
    slow = hub.resolve(MODEL, timeout_s=0.3)
    assert slow.sha is None and "0.3 s" in slow.error and "MODEL_REVISION" in slow.error
    monkeypatch.setenv(hub.ENDPOINT_ENV, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    down = hub.resolve(MODEL, timeout_s=2)
    assert down.sha is None and "unreachable" in down.error and "\n" not in down.error
    monkeypatch.setenv(hub.ENDPOINT_ENV, "file:///etc")
    assert "must be an http(s) URL" in hub.resolve(MODEL).error


def test_the_default_endpoint_is_the_hub(monkeypatch):
    monkeypatch.delenv(hub.ENDPOINT_ENV, raising=False)
    assert hub.revision_url(MODEL) == f"https://huggingface.co/api/models/{MODEL}/revision/main"


def _prepare(monkeypatch, pinned: str | None):
    lines: list[str] = []
    if pinned:
        monkeypatch.setenv("MODEL_REVISION", pinned)
    else:
        monkeypatch.delenv("MODEL_REVISION", raising=False)
    exp = ex.load_experiment(ROOT / ex.MISSION)
    rep = pf.Report(lines.append)
    calls = []

    class Docker(pf.Shell):  # the pull/build/fetch commands are answered here: no Docker on this machine
        def run(self, argv, timeout_s, env=None):
            calls.append(argv)
            return 0, "", ""

    found = pf.prepare(rep, Docker(False, lines.append), exp)
    return found, {c.name: c for c in rep.checks}, lines, calls


def test_prepare_unpinned_prints_the_line_to_pin_and_skips_the_fetch(local_hub, monkeypatch):
    _, h = local_hub
    h.answers[PATH] = (200, json.dumps({"sha": SHA}).encode(), 0.0)
    found, checks, lines, calls = _prepare(monkeypatch, None)
    assert found["resolved"] == SHA and found["pinned"] is None
    assert checks["prepare.model_revision"].status == "pass" and SHA in checks["prepare.model_revision"].detail
    assert any(ln.startswith(f"# pin it: export MODEL_REVISION={SHA}") for ln in lines)
    fetch = next(c for n, c in checks.items() if n.startswith("prepare.fetch"))
    assert fetch.status == "skip" and f"export MODEL_REVISION={SHA}" in fetch.detail
    assert not any("--fetch-model" in a for a in calls)
    steps = [ln for ln in lines if ln.startswith("prepare [")]
    assert steps[0] == f"prepare [1/5] resolve {MODEL}@main through the hub API ..."
    assert steps[1].startswith("prepare [1/5] resolve: done in ") and steps[1].endswith(" s")
    assert any(ln.startswith("prepare [2/5] pull vllm/vllm-omni:v0.16.0: done in ") for ln in steps)


def test_prepare_pinned_warns_when_main_moved_and_stands_when_the_hub_fails(local_hub, monkeypatch):
    _, h = local_hub
    pinned = "0" * 40
    h.answers[PATH] = (200, json.dumps({"sha": SHA}).encode(), 0.0)
    found, checks, _, calls = _prepare(monkeypatch, pinned)
    c = checks["prepare.model_revision"]
    assert c.status == "pass" and "main has moved on" in c.warning and found["pinned"] == pinned
    assert any("--fetch-model" in a for a in calls)  # the pinned commit is fetched
    h.answers[PATH] = (503, b"", 0.0)
    found, checks, lines, _ = _prepare(monkeypatch, pinned)
    c = checks["prepare.model_revision"]
    assert c.status == "skip" and "HTTP 503" in c.detail and f"the pinned {pinned} stands" in c.detail
    assert found["resolved"] is None and found["error"]
    assert "prepare [1/5] resolve: FAILED in" in "\n".join(lines)
    found, checks, _, _ = _prepare(monkeypatch, None)
    assert checks["prepare.model_revision"].status == "fail"  # nothing pinned, nothing resolved
