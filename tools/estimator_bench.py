"""Known-answer bench of the work-rate estimators: `python -m tools.estimator_bench RUN [RUN ...] --out PAGE.md`.

Each RUN is an A/B run folder on the simulator whose arms differ only by a known slowdown (`--b-sim-set
model.extra_step_pct=P`). For every run and level it sets the per-round ln(B/A) of the closed-loop estimator
(ttsreport.blocks.closed_loop_rates, the primary metric since it replaced the window estimator) beside the window
estimator it replaced (`*_window`) and p50 latency, against the truth of the simulator's own step model: the same
profile and overrides replayed in virtual time (ttssim.virtual) over a long closed loop of the scenario's prompt mix,
where audio throughput is c x mean audio / mean latency of 2,000 requests after a warm-up (no window, no edge).
Also: rounds to a decision under the fixed analysis (the first n at which compare_rounds over rounds 1..n claims).
Pure function of the stored run folders (and the profile copy each carries in sim/), so the page can be rebuilt.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np

from loadtest.window_fit import closed_loop_latencies
from ttsrecords.paths import ROOT
from ttsreport.analysis import HOST_BUSY_PCT
from ttsreport.blocks import block_summary
from ttsreport.inference import compare_rounds
from ttsreport.rounds import design_of, paired_rounds
from ttsreport.runfolder import load_run

TRUTH_REQUESTS = 2000
ESTIMATORS = (("audio_throughput", "audio-s/s, closed loop (new)", True),
              ("audio_throughput_window", "audio-s/s, window shares (old)", True),
              ("throughput_rps", "req/s, closed loop (new)", True),
              ("throughput_rps_window", "req/s, window shares (old)", True),
              ("e2e_p50", "p50 latency", False))


def truth(config: str, overrides: tuple[str, ...], concurrency: int, prompts: str, mix: tuple, seed: int) -> dict:
    """Long-run closed-loop rates of one arm in virtual time: audio-s/s, req/s, p50 latency (the planner's own
    replay, loadtest.window_fit, over TRUTH_REQUESTS requests)."""
    e2e, audio = closed_loop_latencies(config, overrides, concurrency, prompts, mix, seed, "fixed", TRUTH_REQUESTS)
    return {"audio_throughput": concurrency * audio.mean() / e2e.mean(), "throughput_rps": concurrency / e2e.mean(),
            "e2e_p50": float(np.median(e2e))}


def _sim_arms(run: dict) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(profile path, A's overrides, B's overrides) of a simulated run, from the copy in its folder."""
    man, d = run["manifest"], Path(run["dir"])
    profiles = sorted((d / "sim").glob("*.yaml")) if (d / "sim").is_dir() else []
    profiles = [p for p in profiles if not p.name.endswith(".fit.json")]
    config = str(profiles[0]) if profiles else str(ROOT / "configs/sim/default.yaml")
    arms = man.get("arms") or {}

    def sets(arm: str) -> tuple[str, ...]:
        a = arms.get(arm) or {}
        sim = a.get("sim") if isinstance(a.get("sim"), dict) else {}
        return tuple(sim.get("set") or a.get("sim_set") or ())
    return config, sets("A"), sets("B")


def _command(cmd) -> str | None:
    """The run's command as a shell line (the manifest stores argv)."""
    if isinstance(cmd, list):
        return " ".join(shlex.quote(str(x)) for x in cmd)
    return str(cmd) if cmd else None


def analyse(run_dir: str) -> dict:
    run = load_run(run_dir)
    scen = run["scenario"] or {}
    mix = tuple(sorted((k, float(v)) for k, v in (scen.get("mix") or {}).items() if v))
    seed = int(scen.get("seed") or 0)
    prompts = str(ROOT / scen.get("prompts", "configs/prompts/en.yaml"))
    config, set_a, set_b = _sim_arms(run)
    blocks = [block_summary(b, run["starts"].get(b["meta"].get("start")), within=False) for b in run["blocks"]]
    rounds = paired_rounds(blocks, "ab")
    levels = sorted({lv for b in blocks for lv in b["levels"]}, key=int)
    looks = [x for x in run["looks"] if x.get("stop")]
    steps = [st if isinstance(st, dict) else {"concurrency": st} for st in scen.get("steps") or []]
    phases = scen.get("phases") or {}
    drains = sorted({float(st.get("drain_s", phases.get("drain_s", 0))) for st in steps})
    scenario = (f"{scen.get('name')}: mix {', '.join(f'{k} {v:g}' for k, v in mix)}; drains "
                f"{'/'.join(f'{d:g}' for d in drains)} s")
    out = {"run": Path(run_dir).name, "design": design_of(run["manifest"]), "sets": set_b, "rounds": len(rounds),
           "scenario": scenario,
           "variants": [run["manifest"].get("variants", {}).get(k) for k in ("A", "B")],
           "command": _command(run["manifest"].get("command")),
           "stopped": {"round": looks[0].get("rounds"), "kind": looks[0].get("kind"), "text": looks[0].get("text")}
           if looks else None, "levels": {}}
    for lv in levels:
        if len(set(out["variants"])) == 1:  # a known slowdown: the step model's own answer
            ta, tb = (truth(config, s, int(lv), prompts, mix, seed) for s in (set_a, set_b))
            row = {"truth": {k: tb[k] / ta[k] for k in ta}, "metrics": {}}
        else:  # two variants: their host time on this CPU is not the virtual replay's (H100 table): no truth
            row = {"truth": {k: None for k in ("audio_throughput", "throughput_rps", "e2e_p50")}, "metrics": {}}
        for key, _label, higher in ESTIMATORS:
            a = [rr["A"]["levels"].get(lv, {}).get(key) for rr in rounds.values()]
            b = [rr["B"]["levels"].get(lv, {}).get(key) for rr in rounds.values()]
            d = np.array([math.log(y / x) for x, y in zip(a, b, strict=True) if x and y])
            res = compare_rounds(a, b, higher_is_better=higher, margin_pct=1.0, confidence=0.95)
            decided = next((n for n in range(2, len(a) + 1)
                            if compare_rounds(a[:n], b[:n], higher_is_better=higher, margin_pct=1.0,
                                              confidence=0.95)["kind"] in ("faster", "slower")), None)
            truth_key = key.replace("_window", "")
            row["metrics"][key] = {"ratio": res["ratio"], "ci": res["ci"], "kind": res["kind"],
                                   "sd_pct": 100 * float(np.std(d, ddof=1)) if d.size > 1 else None,
                                   "se_pct": 100 * float(np.std(d, ddof=1)) / math.sqrt(d.size) if d.size > 1 else None,
                                   "bias_pct": 100 * (res["ratio"] / row["truth"][truth_key] - 1)
                                   if res["ratio"] and row["truth"][truth_key] else None,
                                   "decided_at": decided, "per_round": [float(math.exp(x)) for x in d]}
        quiet = [rr for rr in rounds.values() if all(
            ((rr[arm]["levels"].get(lv) or {}).get("telemetry") or {}).get("host_cpu_pct", 100.0) < HOST_BUSY_PCT
            for arm in ("A", "B"))]
        qd = [math.log(rr["B"]["levels"][lv]["audio_throughput"] / rr["A"]["levels"][lv]["audio_throughput"])
              for rr in quiet if rr["A"]["levels"][lv].get("audio_throughput")
              and rr["B"]["levels"][lv].get("audio_throughput")]
        t_audio = row["truth"]["audio_throughput"]
        row["quiet"] = {"rounds": len(qd),
                        "bias_pct": 100 * (math.exp(float(np.mean(qd))) / t_audio - 1) if qd and t_audio else None}
        p = row["metrics"]["audio_throughput"]["ratio"], row["metrics"]["e2e_p50"]["ratio"]
        row["primary_x_p50"] = p[0] * p[1] if all(p) else None
        out["levels"][lv] = row
    return out


def _f(x, fmt="{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _summary_rows(results: list[dict]) -> list[str]:
    rows = ["| run | design | B | level | truth B/A | new estimate | bias new | bias new, quiet rounds | bias old | sd new "
            "| sd old | sd p50 | sd new / sd p50 | primary x p50 |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        sets = " ".join(res["sets"]) or f"{res['variants'][1]} vs {res['variants'][0]}"
        for lv, row in res["levels"].items():
            m, old, p50 = (row["metrics"][k] for k in ("audio_throughput", "audio_throughput_window", "e2e_p50"))
            ratio = m["sd_pct"] / p50["sd_pct"] if m["sd_pct"] is not None and p50["sd_pct"] else None
            rows.append(f"| {res['run']} | {res['design']} | {sets} | c={lv} | "
                        f"{_f(row['truth']['audio_throughput'], '{:.4f}')} | "
                        f"{_f(m['ratio'], '{:.4f}')} | {_f(m['bias_pct'], '{:+.2f}')} ± {_f(m['se_pct'], '{:.2f} %')} | "
                        f"{_f(row['quiet']['bias_pct'], '{:+.2f} %')} ({row['quiet']['rounds']}) | "
                        f"{_f(old['bias_pct'], '{:+.2f} %')} | {_f(m['sd_pct'], '{:.2f} %')} | "
                        f"{_f(old['sd_pct'], '{:.2f} %')} | {_f(p50['sd_pct'], '{:.2f} %')} | {_f(ratio, '{:.1f}')} | "
                        f"{_f(row['primary_x_p50'], '{:.4f}')} |")
    return rows


def render(results: list[dict], command: str) -> str:
    lines = ["# Work-rate estimators against known slowdowns (simulator)", "",
             f"Made by `{command}` (tools/estimator_bench.py) from the run folders named below; each run's own "
             "command is under its section. Arm B = arm A with every simulated step slowed by a known share "
             "(`--b-sim-set model.extra_step_pct=P`), nothing else different (or a named variant pair). **Truth**: "
             "the same profile replayed in virtual time (ttssim.virtual, the simulator's own step rules, no clock) "
             f"over {TRUTH_REQUESTS} requests of the scenario's prompt mix: B/A of c x mean audio / mean latency "
             "(audio-s/s), c / mean latency (req/s), and of the median latency. **new** = the closed-loop estimator "
             "(Little's law over the requests that started in the measure phase, bucket means weighed by the mix; "
             "the primary metric), **old** = the lifetime share inside the measure window it replaced; **bias** = "
             "estimate / truth - 1, ± its standard error (per-round sd / sqrt(rounds)) (**quiet rounds**: over the rounds whose two windows had the host's CPUs under "
             f"{HOST_BUSY_PCT:.0f} % busy at that level, their count in brackets: the report's own busy-host warning; a "
             "starved simulator runs late, which is the machine, not the estimator); **sd** = per-round sd of ln(B/A); "
             "**decided** = first round count at which the "
             "fixed analysis (95 %, Student t over rounds) claims a difference (– = not within the run). SIMULATED.",
             "", "## Summary: audio throughput (the primary metric)", "", *_summary_rows(results), ""]
    for res in results:
        sets = " ".join(res["sets"]) or f"{res['variants'][1]} vs {res['variants'][0]}"
        lines += [f"## {res['run']}: design {res['design']}, B {sets}, {res['rounds']} A/B rounds", "",
                  f"Scenario {res['scenario']}.", ""]
        if res.get("command"):
            lines += [f"`{res['command']}`", ""]
        if res.get("stopped"):
            st = res["stopped"]
            lines += [f"The run's own sequential rule stopped after {st['round']} A/B round(s): {st['kind']} "
                      f"({st['text']}).", ""]
        lines += ["| level | estimator | truth B/A | estimate B/A [95 % CI] | bias | sd per round | verdict | decided |",
                  "|---|---|---|---|---|---|---|---|"]
        for lv, row in res["levels"].items():
            for key, label, _h in ESTIMATORS:
                m = row["metrics"][key]
                t = row["truth"][key.replace("_window", "")]
                ci = "[{:.3f}, {:.3f}]".format(*m["ci"]) if m["ci"] else ""
                lines.append(f"| c={lv} | {label} | {_f(t, '{:.4f}')} | {_f(m['ratio'], '{:.4f}')} {ci} | "
                             f"{_f(m['bias_pct'], '{:+.2f} %')} | {_f(m['sd_pct'], '{:.2f} %')} | {m['kind']} | "
                             f"{_f(m['decided_at'], '{}')} |")
            lines.append(f"| c={lv} | primary x p50 latency | | {_f(row['primary_x_p50'], '{:.4f}')} | | | | |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="A/B run folders on the simulator (known slowdown in arm B)")
    ap.add_argument("--out", help="markdown page to write (default: print)")
    ap.add_argument("--json", help="also write every number of the page (per-round ratios included) as JSON here: the "
                                   "run folders are not kept in the repository")
    args = ap.parse_args(argv)
    results = []
    for r in args.runs:
        try:
            results.append(analyse(r))
        except (OSError, ValueError) as e:
            print(f"estimator_bench: {r}: {e}", file=sys.stderr)
            return 2
    page = render(results, "python -m tools.estimator_bench " + " ".join(argv if argv is not None else sys.argv[1:]))
    if args.out:
        Path(args.out).write_text(page, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        print(page)
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": "tts-estimator-bench/1", "runs": results}, indent=1,
                                              default=float) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
