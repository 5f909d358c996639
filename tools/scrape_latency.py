"""How long one /metrics scrape takes while a server streams under closed-loop load.

Why: the load generator's edge actions (control writes, confirmations, counter snapshots) wait on scrapes, so a slow
/metrics shifts the count and measure windows' counter edges. On the real CPU server it was 54 ms idle and up to 11 s
under one stream (docs/real-cpu-server.md).

    .venv/bin/python tools/scrape_latency.py --url http://127.0.0.1:8091 [--concurrency 1] [--scrapes 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadtest.prompts import load_corpus, load_voice, speech_payload  # noqa: E402
from tts_predictor.domain import MODEL_NAME  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8091")
    p.add_argument("--concurrency", type=int, default=1, help="closed-loop streams during the scrapes")
    p.add_argument("--scrapes", type=int, default=15)
    p.add_argument("--warmup-s", type=float, default=8.0, help="streams run this long before the first scrape")
    args = p.parse_args(argv)
    url = args.url.rstrip("/")
    corpus, voice = load_corpus(REPO / "configs/prompts/en.yaml"), load_voice(REPO / "configs/voices/ref.yaml")
    body = speech_payload(corpus.buckets["short"][0].text, voice, model=MODEL_NAME, language=corpus.language,
                          mode="stream")
    stop = threading.Event()

    def user() -> None:
        while not stop.is_set():
            try:
                with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=120) as r:
                    for _ in r.iter_bytes():
                        pass
            except httpx.HTTPError:
                time.sleep(0.5)

    for _ in range(args.concurrency):
        threading.Thread(target=user, daemon=True).start()
    time.sleep(args.warmup_s)
    took = []
    for _ in range(args.scrapes):
        t0 = time.perf_counter()
        size = len(httpx.get(f"{url}/metrics", timeout=120).text)
        took.append(time.perf_counter() - t0)
        print(f"scrape {took[-1]:.3f} s ({size} bytes)", flush=True)
        time.sleep(1.0)
    stop.set()
    q = statistics.quantiles(took, n=10) if len(took) > 1 else took
    print(f"c={args.concurrency}: {len(took)} scrapes, median {statistics.median(took):.3f} s, p90 {q[-1]:.3f} s, "
          f"max {max(took):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
