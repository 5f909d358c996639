"""Statistics of an A/B run: summary.json (per window, per arm) and comparison.json (per level: the verdicts), from
the stored files of `reports/<run>/`.

Every comparison goes through ttsreport.inference (docs/method.md): per round d = ln(B/A), the ratio with a Student t
interval (the start as the unit in a nested design), Holm over levels for the primary metric (the headline; the
sequential rule's repeated intervals when the run was sequential), secondary metrics uncorrected, the error rate by
its own verdict, A/A rounds as a bias check, variance components and the order effect of the design, and a second
analysis without the rounds that had failed requests. Pure functions over the files; the report only reads the two
JSON files this module writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as sps

from tts_predictor.domain import CODEC_FRAME_RATE_HZ
from tts_predictor.plugin import ENV_SKIP_SOURCE_CHECK
from ttsrecords import runsettings as rs
from ttsrecords.manifest import SIMULATED_NAMES
from ttsrecords.records import SUMMARY_SCHEMA
from ttsrecords.results import Comparison, Summary, write_results
from ttsrecords.windows import manifest_windows

from . import audiolength
from . import inference as inf
from . import rounds as rd
from .blocks import (
    METRICS,
    PRIMARY_METRIC,
    SAMPLED_SINCE,
    TELEMETRY_FIELDS,
    VERDICT_METRICS,
    block_summary,
    measure_edges,
    outlived_levels,
    spanning_requests,
)
from .comparison import compare, mean_or_none
from .prediction import model_prediction, prediction, read_micro, sim_setup
from .runfolder import load_run

DEFAULT_MARGIN_PCT = rs.DEFAULT_MARGIN_PCT


@dataclass(frozen=True)
class Options:
    """What a caller may set; everything else comes from the run's own files."""

    confidence: float | None = None  # None: the run's pre-registered confidence, else 0.95
    margin_pct: float | None = None  # None: the run's pre-registered margin (older folders: scenario.yaml), else 1 %
    micro: str | None = None  # results.json of `make micro` for the per-call prediction (default: the counters)


# ----------------------------------------------------------------------------------------------- run settings


def margin_of(run: dict, override: float | None) -> tuple[float, str]:
    """The equivalence margin in % and where it came from: --margin-pct (said to override the pre-registered
    margin when there is one), the manifest's pre-registered analysis, then for older folders the effective
    scenario.yaml's `margin_pct`, the manifest settings, or the default."""
    pre = _analysis(run["manifest"]).get("margin_pct")
    if override is not None:
        if pre is not None and float(pre) != float(override):
            return float(override), f"--margin-pct, overriding the pre-registered ±{float(pre):g} %"
        return float(override), "--margin-pct"
    if pre is not None:
        where = (_analysis(run["manifest"]).get("source") or {}).get("margin_pct")
        return float(pre), "pre-registered" + (f" ({where})" if where else "")
    scen = run.get("scenario") or {}
    if isinstance(scen, dict) and scen.get("margin_pct") is not None:
        return float(scen["margin_pct"]), "scenario.yaml"
    settings = run["manifest"].get("settings") or {}
    if settings.get("margin_pct") is not None:
        return float(settings["margin_pct"]), "manifest settings"
    return DEFAULT_MARGIN_PCT, "default"


def confidence_of(manifest: dict, override: float | None) -> tuple[float, str]:
    """The confidence of every interval and where it came from: --confidence, the pre-registered analysis, or
    the default."""
    if override is not None:
        return float(override), "--confidence"
    pre = _analysis(manifest).get("confidence")
    return (float(pre), "pre-registered") if pre is not None else (rs.DEFAULT_CONFIDENCE, "default")


def _analysis(manifest: dict) -> dict:
    try:
        return rs.analysis_of(manifest)
    except rs.SettingsError as e:
        raise ValueError(str(e)) from None


def primary_of(manifest: dict) -> tuple[str, str]:
    """The primary metric (the pre-registered analysis's, else the experiment's `primary_metric`, else throughput)
    and where it came from."""
    m = _analysis(manifest).get("primary_metric")
    src = "pre-registered"
    if m is None:
        exp = manifest.get("experiment") or {}
        m = exp.get("primary_metric") if isinstance(exp, dict) else None
        m = m or (manifest.get("settings") or {}).get("primary_metric")
        src = "experiment"
    if m is None:
        return PRIMARY_METRIC, "default"
    if m not in VERDICT_METRICS:
        raise ValueError(f"manifest.json: primary_metric {m!r} is not one of {list(VERDICT_METRICS)}")
    return m, src


def sequential_of(manifest: dict, margin_pct: float, confidence: float) -> dict | None:
    """The sequential settings of a run (None: a fixed design), as the planner wrote them (ttsrecords.runsettings),
    with alpha (1 - confidence unless recorded) and the margin (the run's unless recorded)."""
    try:
        seq = rs.sequential_of(manifest)
    except rs.SettingsError as e:
        raise ValueError(str(e)) from None
    if seq is None:
        return None
    return {**seq, "alpha": float(seq.get("alpha") or round(1.0 - confidence, 12)),
            "margin_pct": float(seq["margin_pct"]) if seq.get("margin_pct") is not None else margin_pct}


def plan_done(manifest: dict, blocks: list[dict]) -> bool:
    """Whether the run's last planned round has run (so a sequential look here is its last): no planned round lies
    beyond the latest round with a window on disk. A stopped run's plan ends where it stopped."""
    planned = [w.round for w in manifest_windows(manifest)]
    ran = [b["meta"].get("round") for b in blocks if isinstance(b["meta"].get("round"), int)]
    return bool(planned) and bool(ran) and max(ran) >= max(planned)


# ----------------------------------------------------------------------------------------------- per arm


def _arm_bands(blocks: list[dict], levels: list[str], level_cl: float = 0.95) -> dict:
    """Per arm, level and metric: mean over valid A/B windows with a Student-t band (for the report's plots)."""
    out: dict = {}
    keys = list(METRICS) + ["syncs_per_call", "syncs_per_step", "syncs_per_request", "seconds_per_call"]
    for arm in ("A", "B"):
        bs = [b for b in blocks if b["valid"] and b["arm"] == arm and b["kind"] in ("ab", "single")]
        out[arm] = {}
        for lv in levels:
            row = {}
            for key in keys:
                v = np.array([b["levels"][lv][key] for b in bs if lv in b["levels"]
                              and b["levels"][lv].get(key) is not None])
                if not v.size:
                    row[key] = None
                    continue
                lo = hi = float(v.mean())
                if v.size >= 2 and v.std(ddof=1) > 0:
                    lo, hi = (float(x) for x in sps.t.interval(level_cl, v.size - 1, loc=v.mean(), scale=sps.sem(v)))
                row[key] = {"mean": float(v.mean()), "lo": lo, "hi": hi, "n": int(v.size)}
            out[arm][lv] = row
    return out


def _telemetry(blocks: list[dict], levels: list[str]) -> dict:
    """Per arm and level: the mean over valid A/B windows of each window's telemetry average (None: no samples)."""
    out: dict = {"available": False, "sources": []}
    sources: set[str] = set()
    for arm in ("A", "B"):
        out[arm] = {}
        bs = [b for b in blocks if b["valid"] and b["arm"] == arm and b["kind"] in ("ab", "single")]
        for lv in levels:
            ws = [b["levels"][lv]["telemetry"] for b in bs if lv in b["levels"] and b["levels"][lv].get("telemetry")]
            if not ws:
                out[arm][lv] = None
                continue
            for w in ws:
                sources.update(w.get("sources") or [])
            means = {k: mean_or_none([w.get(k) for w in ws]) for k in TELEMETRY_FIELDS}
            out[arm][lv] = {k: v for k, v in means.items() if v is not None or k not in SAMPLED_SINCE}
            out[arm][lv]["windows"] = len(ws)
            out["available"] = True
    out["sources"] = sorted(sources)
    out["gpu"] = "nvml" in sources
    return out


def _series_name(family: str, labels: dict) -> str:
    shown = {k: v for k, v in labels.items() if k not in ("model_name", "replica")}
    return family + ("{" + ",".join(f"{k}={v}" for k, v in sorted(shown.items())) + "}" if shown else "")


def _upstream(blocks: list[dict], levels: list[str]) -> dict:
    """vllm-omni's own series per arm and level over valid A/B windows: histograms pooled (count, mean = sum/count,
    mean over windows of each window's p50 and p90), counters summed."""
    out: dict = {"available": False}
    for arm in ("A", "B"):
        out[arm] = {}
        bs = [b for b in blocks if b["valid"] and b["arm"] == arm and b["kind"] in ("ab", "single")]
        for lv in levels:
            ws = [b["levels"][lv]["upstream"] for b in bs if lv in b["levels"] and b["levels"][lv].get("upstream")]
            if not ws:
                out[arm][lv] = None
                continue
            hist: dict = {}
            for w in ws:
                for fam, series in (w.get("histograms") or {}).items():
                    for s in series:
                        h = hist.setdefault(_series_name(fam, s["labels"]), {"count": 0.0, "sum": 0.0, "p50": [],
                                                                             "p90": [], "windows": 0})
                        h["windows"] += 1
                        if s.get("count") is not None and s.get("sum") is not None:
                            h["count"] += s["count"]
                            h["sum"] += s["sum"]
                        for q in ("p50", "p90"):
                            if s.get(q) is not None:
                                h[q].append(s[q])
            counters: dict = {}
            for w in ws:
                for fam, series in (w.get("counters") or {}).items():
                    for s in series:
                        if s.get("delta") is not None:
                            key = _series_name(fam, s["labels"])
                            counters[key] = counters.get(key, 0.0) + s["delta"]
            out[arm][lv] = {"windows": len(ws), "counters": counters,
                            "histograms": {k: {"count": h["count"], "mean": h["sum"] / h["count"] if h["count"] else None,
                                               "p50": mean_or_none(h["p50"]), "p90": mean_or_none(h["p90"]),
                                               "windows": h["windows"]} for k, h in sorted(hist.items())}}
            out["available"] = True
    return out


def _distributions(run: dict, summaries: list[dict], levels: list[str]) -> dict:
    """Pooled e2e latency quantiles per arm and level over valid A/B windows (CDF curves for the report)."""
    probs = [float(p) for p in np.linspace(0, 100, 41)]
    valid_ids = {s["block_id"] for s in summaries if s["valid"] and s["kind"] in ("ab", "single")}
    arms: dict = {"probs": probs, "A": {}, "B": {}}
    for blk in run["blocks"]:
        m = blk["meta"]
        if m.get("block_id") not in valid_ids:
            continue
        for r in blk["requests"]:
            if r.get("phase") == "measure" and r.get("ok") and r.get("e2e_s") is not None:
                arms[m["arm"]].setdefault(str(r["concurrency"]), []).append(r["e2e_s"])
    for arm in ("A", "B"):
        arms[arm] = {lv: [float(x) for x in np.percentile(arms[arm][lv], probs)] for lv in levels if lv in arms[arm]}
    return arms


def _arms_info(manifest: dict, starts: dict, variants: dict, blocks: list[dict]) -> dict:
    """What the manifest records per arm (version, image, plugin, simulator config), the evidence results of its
    server starts, and how many of its windows passed the manipulation check."""
    arms = (manifest.get("experiment") or {}).get("arms") or manifest.get("arms") or {}
    out = {}
    for arm in ("A", "B"):
        info = dict(arms.get(arm) or {}) if isinstance(arms, dict) else {}
        info.setdefault("variant", variants.get(arm))
        ev = [s for s in starts.values() if s.get("arm") == arm and s.get("evidence") is not None]
        failed = [f"start {s['start']}: {s['evidence'].get('reason')}" for s in ev if not s["evidence"].get("ok")]
        info["evidence_result"] = ({"checked": len(ev), "ok": len(ev) - len(failed), "failures": failed}
                                   if ev else None)
        checked = [b for b in blocks if b["arm"] == arm and b["kind"] in ("ab", "single")
                   and b["manipulation"].get("applicable", True)]
        info["manipulation_result"] = ({"checked": len(checked), "ok": sum(b["manipulation"]["ok"] for b in checked)}
                                       if checked else None)
        out[arm] = info
    return out


def _starts(starts: dict) -> list[dict]:
    return [{"start": s.get("start"), "arm": s.get("arm"), "status": s.get("status"), "reason": s.get("reason"),
             "ready_s": s.get("ready_s"), "stop_s": s.get("stop_s"), "windows": s.get("windows") or [],
             "compile_cache": s.get("compile_cache"),
             "evidence": s.get("evidence"), "switches": len(s.get("switches") or [])} for _, s in sorted(starts.items())]


LATE_TOLERANCE_S = 0.5  # an earlier level's request ending this far into a measure window is not worth a warning
HOST_BUSY_PCT = 90.0  # a measure window whose host CPUs were this busy on average ran on a saturated host
# other jobs on the box (outside the suite's process tree) using this share of one core on average in a measure window:
# on the 2-core development machine, unit tests beside a real CPU server moved an A/A pair by 27 % (docs/real-cpu-server.md)
OTHER_CPU_PCT = 20.0


def _telemetry_at_least(summaries: list[dict], levels: list[str], key: str, floor: float) -> list[tuple]:
    """(window, level, mean) of every measure window whose telemetry `key` averaged `floor` or more."""
    out = []
    for b in summaries:
        for lv in levels:
            pct = ((b["levels"].get(lv) or {}).get("telemetry") or {}).get(key)
            if pct is not None and pct >= floor:
                out.append((b["block_id"], lv, pct))
    return out


def _warnings(run: dict, summaries: list[dict], levels: list[str]) -> list[str]:
    out = []
    code = (run.get("manifest") or {}).get("code_fingerprint")
    other = [f"{b['meta'].get('block_id')} ({b['meta'].get('code_fingerprint')})" for b in run["blocks"]
             if code and b["meta"].get("code_fingerprint") not in (None, code)]
    if other:
        out.append(f"the suite's code changed during the run (sources {code} at its start): {len(other)} window(s) "
                   f"ran other code: {', '.join(other[:4])}{' ...' if len(other) > 4 else ''}; a comparison needs "
                   "one code for every window: rerun from a checkout left alone")
    for side, arm in sorted(((run.get("manifest") or {}).get("arms") or {}).items()):
        if (arm or {}).get("plugin_source_check") == "skipped":
            out.append(f"arm {side} ({arm.get('label')}) ran with {ENV_SKIP_SOURCE_CHECK}=1: the plugin did not "
                       "verify that the image's build_attn_metadata is the vllm-omni 0.16.0 code its variants "
                       "reproduce, so 'original' may not be the stock method (docs/gpu-host.md)")
    for lv in levels:  # the closed-loop rate needs about two measured requests per user (loadtest/window_fit.py)
        rows = [b["levels"][lv] for b in summaries if b["valid"] and lv in b["levels"]]
        short = [r for r in rows if r["window_s"] and r.get("e2e_mean") and r["window_s"] < 2 * r["e2e_mean"]]
        if short:
            worst = max(r["e2e_mean"] for r in short)
            out.append(f"c={lv}: the measure phase ({short[0]['window_s']:.0f} s) is shorter than twice the mean "
                       f"latency (up to {worst:.1f} s) in {len(short)} of {len(rows)} windows: few requests per user "
                       "start in it, so the prompts they drew weigh on the rate; lengthen measure_s")
    unprimed = []  # priming: before a level's measure window, at least C untimed requests (count or warm-up phase)
    for b in run["blocks"]:
        for c in measure_edges(b["counters"]):
            n = sum(1 for r in b["requests"] if r.get("concurrency") == c and r.get("phase") in ("count", "warmup"))
            if n < int(c):
                unprimed.append(f"{b['meta'].get('block_id')} c={c}: {n}")
    if unprimed:
        out.append(f"not primed: {len(unprimed)} level(s) sent fewer untimed requests than their concurrency before "
                   f"the measure window ({', '.join(unprimed[:4])}{' ...' if len(unprimed) > 4 else ''}), so cold "
                   "first requests (predictor KV cache, speech tokenizer, code2wav) may land in it; lengthen warmup_s")
    outlived: dict[int, list[tuple[int, float]]] = {}  # level -> (measured requests past its drain, seconds over)
    for b in run["blocks"]:
        for c, (n, over) in outlived_levels(b).items():
            outlived.setdefault(c, []).append((n, over))
    for c, rows in sorted(outlived.items()):
        out.append(f"c={c}: measured requests ran past the level's drain, up to {max(s for _, s in rows):.1f} s (up to "
                   f"{max(n for n, _ in rows)} requests, in {len(rows)} window(s)): they ran partly under the next "
                   "level's load; set that level's drain_s to its longest request (loadtest/window_fit.py)")
    late: dict[int, list[tuple[int, float]]] = {}  # level -> (requests, seconds) of an earlier level in its window
    for b in run["blocks"]:  # a level after a higher one: the stopped users finish their requests during its warm-up
        edges = measure_edges(b["counters"])
        for c, (t0, _t1) in edges.items():
            over = [r["t_start"] + r["e2e_s"] - t0 for r in b["requests"] if r.get("e2e_s") is not None
                    and r.get("concurrency") != c and r["t_start"] < t0 < r["t_start"] + r["e2e_s"]]
            if over and max(over) > LATE_TOLERANCE_S:
                late.setdefault(c, []).append((len(over), max(over)))
    for c, rows in sorted(late.items()):
        out.append(f"c={c}: requests of the level before it were still running up to {max(s for _, s in rows):.1f} s "
                   f"into its measure window (up to {max(n for n, _ in rows)} requests, in {len(rows)} window(s)): "
                   "the level was measured under extra load; lengthen its warm-up past the preceding level's "
                   "request lifetime")
    busy = _telemetry_at_least(summaries, levels, "host_cpu_pct", HOST_BUSY_PCT)
    if busy:  # the load generator (and a CPU-bound server) waited for a core: their timings include the wait
        out.append(f"the host's CPUs were at least {HOST_BUSY_PCT:.0f} % busy in {len(busy)} measure window(s) ("
                   + ", ".join(f"{bid} c={lv}: {pct:.0f} %" for bid, lv, pct in busy[:4])
                   + (", ..." if len(busy) > 4 else "") + "): timings there include waiting for a CPU; keep other "
                   "jobs off the load generator's host")
    other = _telemetry_at_least(summaries, levels, "other_cpu_pct", OTHER_CPU_PCT)
    if other:
        out.append(f"other jobs on the host (processes outside the suite's own) used at least {OTHER_CPU_PCT:.0f} % of "
                   f"a core in {len(other)} measure window(s) ("
                   + ", ".join(f"{bid} c={lv}: {pct:.0f} %" for bid, lv, pct in other[:4])
                   + (", ..." if len(other) > 4 else "") + "): a difference between those windows may be theirs; "
                   "run with the host to itself")
    spanning = sum(b["spanning"].get("measure", b["spanning"]["left_out"]) for b in summaries)
    if spanning:  # a switch lands in a window's first count phase: only measure-phase requests matter here
        out.append(f"{spanning} measure-phase request(s) spanned a variant switch and were left out of the window "
                   "metrics")
    return out


# ----------------------------------------------------------------------------------------------- the run


def summarize(run_dir: str | Path, options: Options | None = None) -> tuple[dict, dict]:
    """Compute summary.json and comparison.json for a run folder (pure: reads files, returns dicts)."""
    o = options or Options()
    run = load_run(run_dir)
    man = run["manifest"]
    confidence, _src = confidence_of(man, o.confidence)
    inf._check_confidence(confidence)
    design = rd.design_of(man)
    unit = rd.DESIGN_UNITS[design]
    margin, margin_src = margin_of(run, o.margin_pct)
    inf._check_margin(margin)
    primary, primary_src = primary_of(man)
    seq = sequential_of(man, margin, confidence)
    summaries = [block_summary(b, run["starts"].get(b["meta"].get("start")), within=design == "nested")
                 for b in run["blocks"]]
    levels = sorted({lv for b in summaries for lv in b["levels"]}, key=int)
    variants = man.get("variants") or {"A": next((b["variant"] for b in summaries if b["arm"] == "A"), None),
                                       "B": next((b["variant"] for b in summaries if b["arm"] == "B"), None)}
    backend = man.get("backend") or {}
    backend_name = backend.get("name") if isinstance(backend, dict) else backend
    simulated = backend_name in SIMULATED_NAMES or any(b["simulated_counters"] for b in summaries)
    exp = man.get("experiment") if isinstance(man.get("experiment"), dict) else {}
    setup = sim_setup(man, run_dir) if simulated else None
    planned = len(manifest_windows(man))
    complete = sum(b["status"] == "complete" for b in summaries)
    partial = (man.get("status") not in (None, "complete")) or (planned and complete < planned) or \
        any(b["status"] == "interrupted" for b in summaries)
    invalid = [{"block_id": b["block_id"], "round": b["round"], "kind": b["kind"], "arm": b["arm"],
                "variant": b["variant"], "reason": b["invalid_reason"]} for b in summaries if not b["valid"]]
    warnings = _warnings(run, summaries, levels)
    if setup is not None and setup["from_checkout"] and setup["fit"] is not None:
        warnings.append(f"this run folder carries no copy of its simulator profile (written before runs did): the "
                        f"model prediction reads {setup['config']} from this checkout, which may have been refitted "
                        "since the run")
    summary = {
        "schema": SUMMARY_SCHEMA, "run_id": man.get("run_id", Path(run_dir).name), "run_dir": str(run_dir),
        "warnings": warnings, "notes": run["notes"],
        "experiment": {"name": exp.get("name"), "idea": exp.get("idea"), "confounded": exp.get("confounded"),
                       "primary_metric": primary},
        "arms_info": _arms_info(man, run["starts"], variants, summaries),
        "variants": variants, "backend": backend, "simulated": bool(simulated),
        "fidelity": None if setup is None else {"config": setup["config"], "line": setup["fidelity"],
                                                "reason": setup["reason"]},
        "design": {"name": design, "unit": unit, "starts": len(run["starts"]) or None,
                   "level_order": (man.get("design") or {}).get("level_order")},
        "partial": bool(partial), "run_status": man.get("status"), "planned_blocks": planned,
        "complete_blocks": complete, "started": man.get("started"), "ended": man.get("ended"),
        "git_revision": man.get("git_revision"), "scenario": man.get("scenario"), "levels": levels,
        "metrics": {k: {"label": m.label, "unit": m.unit, "better": m.better, "definition": m.definition,
                        "verdict": m.verdict} for k, m in METRICS.items()},
        "blocks": summaries, "invalid_blocks": invalid, "starts": _starts(run["starts"]),
        "arms": _arm_bands(summaries, levels), "telemetry": _telemetry(summaries, levels),
        "upstream": _upstream(summaries, levels), "distributions": _distributions(run, summaries, levels),
        "looks": run["looks"],
    }
    comparison = compare(summaries, levels, design=design, primary=primary, margin_pct=margin,
                         confidence=confidence, sequential=seq,
                         final_look=man.get("status") == "complete" or plan_done(man, run["blocks"]))
    comparison["settings"].update(margin_source=margin_src, primary_source=primary_src)
    micro = read_micro(o.micro)
    a_blocks = [b for b in summaries if b["valid"] and b["arm"] == "A" and b["kind"] == "ab"]
    b_blocks = [b for b in summaries if b["valid"] and b["arm"] == "B" and b["kind"] == "ab"]
    a_ids = {b["block_id"] for b in a_blocks}
    frames: dict[str, list[float]] = {}
    for blk in run["blocks"]:
        if blk["meta"].get("block_id") in a_ids:
            for r in sorted(blk["requests"], key=lambda r: r.get("t_start") or 0.0):
                if r.get("phase") == "measure" and r.get("ok") and r.get("audio_s"):
                    frames.setdefault(str(r["concurrency"]), []).append(r["audio_s"] * CODEC_FRAME_RATE_HZ)
    for lv in levels:
        p = prediction(lv, a_blocks, b_blocks, variants, micro)
        p["e2e_ratio"] = None if p.get("e2e_diff_pct") is None else 1.0 + p["e2e_diff_pct"] / 100.0
        p["model"] = model_prediction(setup, lv, a_blocks, frames.get(lv, []), variants)
        comparison["per_level"][lv]["prediction"] = p
    comparison["audio_per_prompt"] = audio_per_prompt(run, summaries, confidence)
    comparison["positive_control"] = positive_control(man)
    comparison.update(run_id=summary["run_id"], variants=variants, simulated=summary["simulated"],
                      partial=summary["partial"], invalid_blocks=invalid)
    return summary, comparison


def _manifest_arms(man: dict) -> dict:
    """The manifest's per-arm records (plan.new_run: evidence.arm_manifest); empty for runs that have none."""
    return man.get("arms") if isinstance(man.get("arms"), dict) else {}


def positive_control(man: dict) -> dict[str, float]:
    """{arm: host_delay_us} for each arm that carried the plugin's positive control (a fixed extra host delay per
    build_attn_metadata call, set through the control file: make ab B_HOST_DELAY_US=...); empty for other runs."""
    return {side: float(a["host_delay_us"]) for side, a in sorted(_manifest_arms(man).items())
            if isinstance(a, dict) and a.get("host_delay_us")}


def audio_per_prompt(run: dict, summaries: list[dict], confidence: float) -> dict:
    """Audio seconds per prompt, B against A (ttsreport.audiolength), over every successful request of the valid A/B
    windows except those that spanned a variant switch; with the length control each arm's manifest records."""
    valid = {b["block_id"]: b["arm"] for b in summaries if b["valid"] and b["kind"] == "ab"}
    by_arm: dict[str, list[dict]] = {"A": [], "B": []}
    for blk in run["blocks"]:
        arm = valid.get(blk["meta"].get("block_id"))
        if arm in by_arm:
            spanning = {id(r) for r in spanning_requests(blk, run["starts"].get(blk["meta"].get("start")))}
            by_arm[arm] += [r for r in blk["requests"] if id(r) not in spanning]
    out = audiolength.compare_audio(by_arm["A"], by_arm["B"], confidence=confidence)
    arms = _manifest_arms(run["manifest"])
    out["length_controls"] = {side: (arms.get(side) or {}).get("length_control") for side in ("A", "B")}
    out["length_warning"] = run["manifest"].get("length_warning")
    return out


def results(run_dir: str | Path, options: Options | None = None) -> tuple[Summary, Comparison]:
    """summarize, typed: what write_statistics writes and the report reads (ttsrecords.results)."""
    summary, comparison = summarize(run_dir, options)
    return Summary.from_dict(summary), Comparison.from_dict(comparison)


def write_statistics(run_dir: str | Path, options: Options | None = None) -> tuple[Path, Path]:
    """Compute and write summary.json + comparison.json next to the run's raw files, through their types."""
    return write_results(run_dir, *results(run_dir, options))
