"""The locustfile's command line: the suite's options on Locust's own parser, the checks that run right after Locust
parses (before it prints anything or opens its web UI), and Locust's -u/-r/-t turned into one level.

Locust habits honoured: `-u N -t 30s` without `--scenario` is one closed-loop level at concurrency N for 30 s in
all (part warm-up, part measured, part drain: one line says how much); with `--scenario` they are refused in one line
(the scenario sets its levels and times); the web UI binds 127.0.0.1 unless `--web-host` says otherwise; `--host` is
required before anything starts. `locust -f loadtest/tts.py --help` shows these options through the venv's start-up
hook (loadtest/locust_help.py), since Locust prints --help before it reads a locustfile.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from loadtest.prompts import REQUEST_KINDS
from loadtest.server_process import ROOT
from tts_predictor.domain import MODEL_NAME, VARIANT_NAMES
from ttsrecords.scenario import Scenario, Step

DEFAULT_SCENARIO = ROOT / "configs" / "scenarios" / "default.yaml"
WEB_HOST = "127.0.0.1"
# One level from -t: the warm-up and the drain take these shares of it, at most the default scenario's own lengths.
WARMUP_SHARE = 0.2
DRAIN_SHARE = 0.1
# A short -t still measures: at least this many seconds of it are the measure window.
MIN_MEASURE_S = 5.0


def add_options(parser) -> None:
    """Our options on Locust's own parser (shown in the web UI, sent by the master to workers), and the parse-time
    checks (`check`) hooked to this parser's parse_args."""
    g = parser.add_argument_group("TTS load test (loadtest/tts.py)")
    g.add_argument("--scenario", default="",
                   help="scenario YAML (configs/scenarios/); default: configs/scenarios/default.yaml, or one level "
                        "from -u/-t when those are given (they are refused together with --scenario)")
    g.add_argument("--mode", choices=["stream", "wav", "scenario"], default="scenario",
                   help="stream (PCM, TTFA) or wav; default: the scenario's")
    g.add_argument("--run-dir", default="", help="output folder (default reports/locust-<UTC timestamp>/)")
    g.add_argument("--metrics-url", default="",
                   help="comma-separated /metrics URLs to scrape (default <host>/metrics; 'none' disables)")
    g.add_argument("--seed", type=int, default=-1, help="prompt sequence seed (default: the scenario's)")
    g.add_argument("--variant", default="",
                   help="a check: the variant you expect the server to run; the records carry the variant the server "
                        "reports on /metrics, and a run whose server reports another one refuses to start (the label "
                        "itself only when the server reports none, or with --control)")
    g.add_argument("--model", default="",
                   help=f"model name sent in each request (default: the one <host>/v1/models serves; {MODEL_NAME} "
                        "when it serves several including that, or does not answer)")
    g.add_argument("--request", default="base", choices=REQUEST_KINDS,
                   help="request kind (loadtest.prompts.REQUEST_KINDS; an experiment's `request:`)")
    g.add_argument("--request-timeout", type=float, default=0.0, help="seconds per request (default: scenario's)")
    g.add_argument("--ready-timeout", type=float, default=10.0,
                   help="seconds to wait for <host>/health to answer 200 before the run starts (0: do not check)")
    g.add_argument("--keep-going", action="store_true",
                   help="do not stop when the server stops answering (refused connections, unanswered requests, "
                        "/health failing): record every failure to the end (the A/B runner's windows, whose runner "
                        "judges them)")
    g.add_argument("--no-report", action="store_true",
                   help="do not build the load-run report at the end (python -m ttsreport <run-dir> builds it later)")
    g.add_argument("--control", default="",
                   help="the server's control file (tts_predictor.control): the scenario's count phases switch the sync "
                        "observer on and off in it and name --variant (the A/B runner's hot swap); without it there "
                        "are no count phases")
    g.add_argument("--control-epoch", type=int, default=0,
                   help="epoch base of this run's control writes (each level writes base+2i+1 and base+2i+2)")
    g.add_argument("--control-sim", default="",
                   help='JSON object written as the control file\'s "sim" settings (the simulator\'s hot-swappable '
                        'known-answer delays, e.g. {"model.extra_step_pct": 1.0}; the A/B runner sets it)')
    g.add_argument("--control-host-delay-us", type=float, default=0.0,
                   help="the plugin's positive control, written into every control write as host_delay_us: a fixed "
                        "extra host delay per build_attn_metadata call (the A/B runner sets it for an arm that carries "
                        "it)")
    _bind_web_ui_locally(parser)
    _check_after_parse(parser)


def _bind_web_ui_locally(parser) -> None:
    """Every service of the suite binds 127.0.0.1: so does Locust's web UI unless --web-host says otherwise."""
    parser.set_defaults(web_host=WEB_HOST)
    for action in parser._actions:  # noqa: SLF001  (argparse keeps its actions here; only the help text changes)
        if action.dest == "web_host":
            action.help = f"Host to bind the web interface to (this suite: {WEB_HOST}; '*' for all interfaces)"


def _check_after_parse(parser) -> None:
    """Run `check` on what this parser parses: bad options end in one line before Locust prints anything."""
    parse_args = parser.parse_args

    def checked(*a, **kw):
        options = parse_args(*a, **kw)
        problem = check(options)
        if problem:
            print(f"error: {problem}", file=sys.stderr, flush=True)
            raise SystemExit(2)
        return options

    parser.parse_args = checked


def check(o) -> str | None:
    """The options' problem in one line, or None. Pure: no file, no network (those come when the run is set up)."""
    if getattr(o, "worker", False):
        return None  # a worker takes everything from its master
    host = (getattr(o, "host", None) or "").rstrip("/")
    if not host:
        return "--host is required (the server's URL, e.g. --host http://127.0.0.1:8091, where make serve listens)"
    if urlsplit(host).scheme not in ("http", "https") or not urlsplit(host).hostname:
        return f"--host must be http(s)://host[:port], got {host!r}"
    given = [flag for flag, dest in (("-u/--users", "num_users"), ("-r/--spawn-rate", "spawn_rate"),
                                     ("-t/--run-time", "run_time")) if getattr(o, dest, None) is not None]
    if given and o.scenario:
        return (f"{', '.join(given)} with --scenario: the scenario sets the levels and their times; give one or the "
                f"other (-u N -t 30s alone runs one level at concurrency N)")
    if getattr(o, "num_users", None) is not None and o.num_users < 1:
        return f"-u/--users must be at least 1, got {o.num_users}"
    if getattr(o, "spawn_rate", None) is not None and o.spawn_rate <= 0:
        return f"-r/--spawn-rate must be above 0, got {o.spawn_rate:g}"
    if o.variant and o.variant not in VARIANT_NAMES:
        return f"unknown variant {o.variant!r} in --variant (known: {', '.join(VARIANT_NAMES)})"
    return None


def anchored(scenario: Scenario) -> Scenario:
    """The default scenario's prompt corpus and voice found from any working directory (they are repository paths)."""
    def at_root(path: str) -> str:
        return path if Path(path).is_absolute() or Path(path).exists() else str(ROOT / path)

    return replace(scenario, prompts=at_root(scenario.prompts), voice=at_root(scenario.voice))


def one_level(base: Scenario, users: int | None, spawn_rate: float | None, run_time_s: float | None
              ) -> tuple[Scenario, str]:
    """Locust's -u/-r/-t as a one-level scenario on `base`'s prompts, mode and timeouts, and the line that says so.

    -t is the whole level, as Locust means it: WARMUP_SHARE of it warms up (at most base's warm-up), DRAIN_SHARE
    drains (at most base's drain), the rest is measured. Without -t the level has base's own phase lengths."""
    first = base.steps[0]
    c = int(users) if users is not None else 1
    if run_time_s is not None:
        total = float(run_time_s)
        warm = round(min(first.warmup_s, WARMUP_SHARE * total), 1)
        drain = round(min(first.drain_s, DRAIN_SHARE * total), 1)
        measure = max(MIN_MEASURE_S, round(total - warm - drain, 1))
    else:
        warm, measure, drain = first.warmup_s, first.measure_s, first.drain_s
    step = Step(index=0, concurrency=c, warmup_s=warm, measure_s=measure, drain_s=drain)
    rate = float(spawn_rate) if spawn_rate is not None else base.spawn_rate
    scen = replace(base, name=f"one level c={c}", steps=(step,), spawn_rate=rate, loop="closed")
    src = "-t" if run_time_s is not None else f"{base.name}'s phases"
    line = (f"one level: {c} user(s), closed loop, {warm:g} s warm-up + {measure:g} s measured + {drain:g} s drain = "
            f"{warm + measure + drain:g} s ({src}; requests in flight at the end finish and are recorded; "
            f"--scenario for a sweep of levels)")
    return scen, line
