"""The report dashboard: every run folder under reports/ in one self-contained page, the history of each experiment
across its runs, and the progress of a run while it writes its files.

    python -m ttsreport.dashboard [reports] [--out reports/index.html]        (make dashboard)
    python -m ttsreport.dashboard [reports] --serve [--port 8765]             (make dashboard SERVE=1)

The page is a pure function of the run folders: it reads each run's own files through their readers (the manifest,
block.json and looks through ttsrecords.records, the statistics through ttsreport.report.load, which also gives the
headline cards) and computes no statistic. A folder that cannot be read is listed with the reason, never dropped.
`--serve` serves the page on 127.0.0.1 only, rebuilt on every request, and the page re-reads itself every few seconds,
so a running A/B run shows its progress (the runner's progress.json, ttsrecords.progress.Progress). Bad input: one
line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import functools
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .board import model
from .dashpage import REFRESH_S, html_page

DEFAULT_PORT = 8765
BIND = "127.0.0.1"


def write(root: str | Path, out: str | Path | None = None) -> Path:
    """Write the dashboard of root's run folders (default root/index.html, replaced atomically)."""
    page = html_page(model(root))
    out = Path(out) if out else Path(root) / "index.html"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


# ----------------------------------------------------------------------------------------------- serving


class _Handler(SimpleHTTPRequestHandler):
    """The page rebuilt from the folders on every request to / (or /index.html); the runs' files as they are."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0].split("#", 1)[0] in ("/", "/index.html"):
            try:
                body = html_page(model(self.directory)).encode("utf-8")
                code = 200
            except Exception as e:  # noqa: BLE001 (one broken build must not stop the server)
                body = f"dashboard build failed: {type(e).__name__}: {e}".encode()
                code = 500
            self.send_response(code)
            self.send_header("Content-Type", "text/html; charset=utf-8" if code == 200 else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, format, *args):  # noqa: A002 (http.server's name)
        pass


def serve(root: str | Path, port: int = DEFAULT_PORT, bind: str = BIND, ready=None) -> None:
    """Serve the dashboard of root on bind:port until interrupted; bind must be 127.0.0.1 (nothing it serves is
    reachable from another host). ready(url) is called once it listens."""
    if bind != BIND:
        raise ValueError(f"the dashboard serves on {BIND} only (asked for {bind!r}): it exposes every run's files")
    model(root)  # a bad root fails here, before listening
    httpd = ThreadingHTTPServer((BIND, port), functools.partial(_Handler, directory=str(root)))
    url = f"http://{BIND}:{httpd.server_address[1]}/"
    (ready or (lambda u: print(f"dashboard: {u} (refreshes every {REFRESH_S} s; Ctrl-C to stop)", flush=True)))(url)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsreport.dashboard", description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="reports", help="the folder of run folders (default reports)")
    ap.add_argument("--out", default=None, help="the page to write (default <root>/index.html)")
    ap.add_argument("--serve", action="store_true", help=f"serve the page on {BIND}, refreshed while runs write")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"with --serve (default {DEFAULT_PORT}; 0: any "
                    "free port)")
    ap.add_argument("--bind", default=BIND, help=f"with --serve: only {BIND} is accepted")
    a = ap.parse_args(argv)
    try:
        if a.serve:
            serve(a.root, a.port, a.bind)
            return 0
        print(write(a.root, a.out))
    except (ValueError, OSError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
