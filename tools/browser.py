"""Open a report in real headless Chromium over the DevTools protocol: console errors, DOM facts, a screenshot.

The DevTools protocol (rather than scraping Chromium's log) reports console messages, uncaught exceptions and failed
resource loads as structured events, so "no console errors" is a precise check. Used by the tests and by hand:
`python -m tools.browser reports/<run>/index.html shot.png`.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import websocket  # websocket-client, pinned in the dev extra

from loadtest.server_process import stop_group

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--remote-debugging-port=0", "--remote-allow-origins=*")
PROBE = """JSON.stringify({svgs: document.querySelectorAll('svg').length, title: document.title,
 banners: [...document.querySelectorAll('.banner')].map(b => b.textContent),
 cards: [...document.querySelectorAll('.card .v')].map(c => c.textContent),
 height: document.documentElement.scrollHeight, width: document.documentElement.scrollWidth,
 bodyText: document.body.innerText.length,
 svgSizes: [...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect().width)})"""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


class _CDP:
    def __init__(self, url: str, timeout: float):
        self.ws = websocket.create_connection(url, timeout=timeout, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30.0) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            obj = json.loads(self.ws.recv())
            if obj.get("id") == self.next_id:
                if "error" in obj:
                    raise RuntimeError(f"{method}: {obj['error']}")
                return obj.get("result", {})
            self.events.append(obj)
        raise TimeoutError(method)

    def wait_event(self, method: str, timeout: float) -> dict:
        end = time.monotonic() + timeout
        for e in self.events:
            if e.get("method") == method:
                return e
        while time.monotonic() < end:
            obj = json.loads(self.ws.recv())
            self.events.append(obj)
            if obj.get("method") == method:
                return obj
        raise TimeoutError(method)


def inspect(page: str | Path, screenshot: str | Path, width: int = 1300, timeout: float = 60.0,
            evaluate: tuple[str, ...] = ()) -> dict:
    """Load `page` in headless Chromium; return console problems and DOM facts, and write a full-page PNG.
    `page`: a file, or an http://127.0.0.1 URL (a page served here: requests to its own origin are not problems).
    `evaluate`: JavaScript expressions run in order after the load (e.g. a click, then a count; a promise is
    awaited); their JSON-able values are returned as "evaluated", and the screenshot is taken after them."""
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium not found (scripts/system-deps.sh installs it)")
    url = str(page) if str(page).startswith("http://127.0.0.1:") else Path(page).resolve().as_uri()
    origin = url[:url.index("/", len("http://"))] if url.startswith("http") else "file:"
    profile = tempfile.mkdtemp(prefix="ttsreport-chromium-")
    # Its own session, so that the whole process tree (zygote, renderers, crashpad) is stopped together: a helper
    # left alive goes on writing into the profile while it is being removed (a CI failure: "Directory not empty").
    proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        end = time.monotonic() + timeout
        while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
            if time.monotonic() > end or proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        cdp = _CDP(f"ws://127.0.0.1:{port}{path}", timeout)
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.call(f"{domain}.enable", session=sid)
        cdp.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=sid)
        cdp.call("Page.navigate", {"url": url}, session=sid)
        cdp.wait_event("Page.loadEventFired", timeout)
        facts = json.loads(cdp.call("Runtime.evaluate", {"expression": PROBE, "returnByValue": True},
                                    session=sid)["result"]["value"])
        facts["evaluated"] = [cdp.call("Runtime.evaluate", {"expression": e, "returnByValue": True,
                                                            "awaitPromise": True}, session=sid,
                                       timeout=timeout)["result"].get("value") for e in evaluate]
        cdp.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": int(facts["height"]),
                                                        "deviceScaleFactor": 1, "mobile": False}, session=sid)
        shot = cdp.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid)
        Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        problems = []
        for e in cdp.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                problems.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                   for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                problems.append("exception: " + p["exceptionDetails"].get("text", "") + " " +
                                str(p["exceptionDetails"].get("exception", {}).get("description", "")))
            elif m == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                problems.append(f"log {p['entry']['level']}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif m == "Network.loadingFailed":
                problems.append(f"load failed: {p.get('errorText')}")
            elif m == "Network.requestWillBeSent":
                req_url = p["request"]["url"]
                if not req_url.startswith(("file:", "data:", "about:", origin + "/")):
                    problems.append(f"network request to {req_url} (the report must be offline)")
        cdp.ws.close()
        return {"problems": problems, **facts}
    finally:
        stop_group(proc, signal.SIGTERM, 10.0)  # the whole session: zygote, renderers, crashpad
        _remove_profile(Path(profile))


def _remove_profile(profile: Path, tries: int = 20) -> None:
    """Remove the throwaway profile; a late writer can still race the removal, so retry briefly, then leave it."""
    for _ in range(tries):
        shutil.rmtree(profile, ignore_errors=True)
        if not profile.exists():
            return
        time.sleep(0.1)


if __name__ == "__main__":
    res = inspect(sys.argv[1], sys.argv[2])
    print(json.dumps({k: v for k, v in res.items() if k != "svgSizes"}, indent=1))
    sys.exit(1 if res["problems"] else 0)
