"""Statistics of an A/B run: pure functions over the stored files of `reports/<run>/`.

Everything the report shows is computed here and written to `summary.json` (per block, per arm) and
`comparison.json` (per level: differences over rounds, CIs, verdicts, prediction). The report only reads them.
Inputs are the file contracts of docs/architecture.md; a record with an unknown schema is refused.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as sps

from tts_predictor import metrics as pm

from .verdict import decide, rounds_for_halfwidth

SUMMARY_SCHEMA = "tts-summary/1"
COMPARISON_SCHEMA = "tts-comparison/1"
REQUEST_SCHEMA = "tts-request/1"
COUNTERS_SCHEMA = "tts-counters/1"
KNOWN_MANIFESTS = ("tts-ab/1", "tts-run/1")

CALLS_PER_STEP = 15  # 1 prefill + 14 decodes per talker step (design.md)
FRAMES_PER_AUDIO_S = 12  # 12 Hz codec: one talker step per frame per request
SYNC_TOLERANCE = 0.02  # manipulation check: observed syncs within 2 % of the closed form (exact on the simulator)


@dataclass(frozen=True)
class Metric:
    """One row of the metric table: the single definition every other module refers to."""

    key: str
    label: str
    unit: str
    better: str  # "higher" | "lower": which direction is "B faster"
    definition: str
    verdict: bool = True  # relative differences make sense (not for a rate that is usually 0)


# The definitions of every metric: per block and concurrency level, measure phase only.
METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("throughput_rps", "throughput", "req/s", "higher",
           "ok requests per second inside the measure window (between the scraper's start and end snapshots), each "
           "request counted for the share of its lifetime inside the window; without snapshots: ok requests started "
           "in the measure phase / counters' duration_s"),
    Metric("audio_throughput", "audio throughput", "audio-s/s", "higher",
           "audio seconds per second, each ok request's audio_s weighted by the same lifetime share"),
    Metric("e2e_p50", "p50 latency", "s", "lower", "median end-to-end latency of ok measure requests"),
    Metric("e2e_p90", "p90 latency", "s", "lower", "90th percentile end-to-end latency (numpy linear interpolation)"),
    Metric("e2e_p99", "p99 latency", "s", "lower", "99th percentile end-to-end latency (numpy linear interpolation)"),
    Metric("ttfa_p50", "p50 time to first audio", "s", "lower",
           "median time to the first non-empty audio chunk (streaming requests; null when none streamed)"),
    Metric("rtf_p50", "p50 real-time factor", "", "lower", "median of e2e_s / audio_s per ok request"),
    Metric("error_rate", "error rate", "", "lower", "failed / all requests of the measure phase", verdict=False),
)}
VERDICT_METRICS = tuple(k for k, m in METRICS.items() if m.verdict)
PRIMARY_METRIC = "throughput_rps"


@dataclass(frozen=True)
class Settings:
    """Knobs of the comparison; written into comparison.json so a verdict can be traced to them."""

    confidence: float = 0.95  # family-wise over the levels (Bonferroni-adjusted per level)
    margin_pct: float = 1.0  # the margin a "no difference" claim and the rounds-needed estimate aim at
    power: float = 0.8  # for the minimum detectable effect
    n_resamples: int = 4999
    seed: int = 20260
    max_rounds: int = 10_000


# ----------------------------------------------------------------------------------------------- reading files


def read_jsonl(path: Path, schema: str | None = None) -> tuple[list[dict], list[str]]:
    """Read a JSONL file; a truncated last line (interrupted writer) is skipped with a warning, an unknown schema refused."""
    rows: list[dict] = []
    notes: list[str] = []
    if not path.exists():
        return rows, notes
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                notes.append(f"{path}: truncated last line skipped")
                continue
            raise ValueError(f"{path}:{i + 1}: not JSON") from None
        if schema is not None and obj.get("schema", schema) != schema:
            raise ValueError(f"{path}:{i + 1}: unknown schema {obj.get('schema')!r} (this reader knows {schema!r})")
        rows.append(obj)
    return rows, notes


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def load_run(run_dir: str | Path) -> dict:
    """Load manifest and blocks of an A/B run (or a single Locust run, seen as one block of arm A)."""
    run = Path(run_dir)
    manifest = read_json(run / "manifest.json") or {}
    if manifest and manifest.get("schema") not in KNOWN_MANIFESTS:
        raise ValueError(f"{run}/manifest.json: unknown schema {manifest.get('schema')!r}")
    notes: list[str] = []
    blocks = []
    block_dirs = sorted((run / "blocks").iterdir()) if (run / "blocks").is_dir() else []
    if not block_dirs and (run / "requests.jsonl").exists():  # a plain Locust run
        variant = manifest.get("variant")
        block_dirs = [run]
        synthetic = {"block_id": run.name, "round": 0, "kind": "single", "arm": "A", "variant": variant,
                     "status": "complete", "reason": None}
    else:
        synthetic = None
    for bdir in block_dirs:
        if not bdir.is_dir():
            continue
        meta = synthetic or read_json(bdir / "block.json")
        if meta is None:
            notes.append(f"{bdir.name}: no block.json (block never started) — skipped")
            continue
        if meta.get("schema", "tts-block/1") != "tts-block/1":
            raise ValueError(f"{bdir}/block.json: unknown schema {meta.get('schema')!r}")
        reqs, n1 = read_jsonl(bdir / "requests.jsonl", REQUEST_SCHEMA)
        ctrs, n2 = read_jsonl(bdir / "counters.jsonl", COUNTERS_SCHEMA)
        notes += n1 + n2
        blocks.append({"meta": meta, "requests": reqs, "counters": ctrs})
    return {"dir": str(run), "manifest": manifest, "blocks": blocks, "notes": notes}


# ----------------------------------------------------------------------------------------------- per block


def _f(x) -> float | None:
    """JSON-safe float (None for missing/NaN)."""
    if x is None:
        return None
    x = float(x)
    return None if not math.isfinite(x) else x


def _deltas(counters: list[dict]) -> dict[int, dict]:
    """Counter deltas of the measure phase by concurrency level (last one wins if a level was repeated)."""
    return {int(c["concurrency"]): c for c in counters if c.get("kind") == "delta" and c.get("concurrency") is not None}


def _sample_sum(samples: dict, name: str) -> float | None:
    vals = [v for k, v in (samples or {}).items() if k == name or k.startswith(name + "{")]
    return float(sum(vals)) if vals else None


def _snapshot_pairs(counters: list[dict], value, keep=lambda a, b: True) -> dict[int, tuple[float, float]]:
    """Per level: (start, end) of value(snapshot) over the scraper's start/end snapshots (None values skipped; an
    end pair that keep() refuses leaves the level's earlier pair in place)."""
    start: dict[int, float] = {}
    out: dict[int, tuple[float, float]] = {}
    for c in counters:
        if c.get("kind") != "snapshot" or c.get("concurrency") is None:
            continue
        v = value(c)
        if v is None:
            continue
        lv = int(c["concurrency"])
        if c.get("edge") == "start":
            start[lv] = v
        elif c.get("edge") == "end" and lv in start and keep(start[lv], v):
            out[lv] = (start[lv], v)
    return out


def _snapshot_deltas(counters: list[dict], name: str) -> dict[int, float]:
    """Per level: end minus start of a counter in the raw snapshots (for names the delta lines do not carry)."""
    pairs = _snapshot_pairs(counters, lambda c: _sample_sum(c.get("samples"), name))
    return {lv: b - a for lv, (a, b) in pairs.items()}


def _edges(counters: list[dict]) -> dict[int, tuple[float, float]]:
    """Measure window per level from the scraper's start/end snapshots (absolute epoch seconds)."""
    return _snapshot_pairs(counters, lambda c: None if c.get("t") is None else float(c["t"]), keep=lambda a, b: b > a)


def level_stats(requests: list[dict], delta: dict | None, edges: tuple[float, float] | None = None,
                block_requests: list[dict] | None = None) -> dict:
    """Metrics of one block at one level (measure phase only), per the METRICS table.

    With the window's edges known, every ok request counts for the share of its lifetime inside the window, whatever
    phase it started in (one request = one unit of work spread over its duration). On the simulator's known-answer
    pool this had 40 % less block-to-block spread than counting completions, which jump by whole closed-loop
    "waves" at window edges. Requests still running when Locust stops are never recorded, so the last level needs a
    drain about as long as its latency (summary warns when it is missing). Without edges: ok requests started in
    the measure phase / window length.
    """
    meas = [r for r in requests if r.get("phase") == "measure"]
    ok = [r for r in meas if r.get("ok")]
    n_all, n_ok = len(meas), len(ok)
    if edges:
        a, b = edges
        window, window_src = b - a, "snapshots"
        n_thr = audio_thr = 0.0
        completed = 0
        for r in block_requests or requests:
            e = r.get("e2e_s")
            if not r.get("ok") or not e or e <= 0:
                continue
            t0, t1 = r["t_start"], r["t_start"] + e
            share = max(0.0, min(t1, b) - max(t0, a)) / e
            n_thr += share
            audio_thr += share * (r.get("audio_s") or 0.0)
            completed += a <= t1 < b
    else:
        window = _f(delta.get("duration_s")) if delta else None
        window_src = "counters"
        if not window:
            starts = np.array([r["t_start"] for r in meas], dtype=float)
            window = float((starts.max() - starts.min()) * len(starts) / (len(starts) - 1)) if len(starts) > 1 else None
            window_src = "records"
        n_thr, audio_thr = n_ok, float(sum(r.get("audio_s") or 0.0 for r in ok))
        completed = n_ok
    e2e = np.array([r["e2e_s"] for r in ok if r.get("e2e_s") is not None], dtype=float)
    ttfa = np.array([r["ttfa_s"] for r in ok if r.get("ttfa_s") is not None], dtype=float)
    audio = np.array([r.get("audio_s") or 0.0 for r in ok], dtype=float)
    rtf = np.array([r["rtf"] for r in ok if r.get("rtf") is not None], dtype=float)

    def q(x, p):
        return _f(np.percentile(x, p)) if x.size else None

    out = {
        "n": n_all, "n_ok": n_ok, "n_error": n_all - n_ok, "window_s": window, "window_source": window_src,
        "completed_in_window": completed,
        "throughput_rps": _f(n_thr / window) if window else None,
        "audio_throughput": _f(audio_thr / window) if window else None,
        "e2e_p50": q(e2e, 50), "e2e_p90": q(e2e, 90), "e2e_p99": q(e2e, 99),
        "ttfa_p50": q(ttfa, 50), "rtf_p50": q(rtf, 50),
        "error_rate": _f((n_all - n_ok) / n_all) if n_all else None,
        "audio_s_mean": _f(audio.mean()) if audio.size else None,
        "e2e_mean": _f(e2e.mean()) if e2e.size else None,
        "errors": _error_counts(meas),
    }
    out.update(_counter_stats(delta, n_ok))
    return out


def _error_counts(meas: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in meas:
        if not r.get("ok"):
            key = str(r.get("error") or "unknown")[:80]
            out[key] = out.get(key, 0) + 1
    return out


def _counter_stats(delta: dict | None, n_ok: int) -> dict:
    """Server-side numbers of a level from its counter delta: syncs per call/step/request, seconds per call."""
    if not delta:
        return {"syncs_per_call": None, "syncs_per_step": None, "syncs_per_request": None,
                "seconds_per_call": None, "calls_per_request": None, "mean_batch": None}
    calls, secs = delta.get("calls"), delta.get("seconds")
    syncs, ocalls = delta.get("syncs"), delta.get("observed_calls")
    steps, finished = delta.get("steps"), delta.get("requests_finished") or n_ok or None
    spc = _f(syncs / ocalls) if syncs is not None and ocalls else _f(delta.get("syncs_per_call"))
    # On a sampled observer, per-step and per-request syncs scale the per-call rate up to all calls.
    sps_ = _f(spc * calls / steps) if spc is not None and calls and steps else _f(delta.get("syncs_per_step"))
    spr = _f(spc * calls / finished) if spc is not None and calls and finished else None
    return {
        "syncs_per_call": spc, "syncs_per_step": sps_, "syncs_per_request": spr,
        "seconds_per_call": _f(secs / calls) if secs is not None and calls else None,
        "calls_per_request": _f(calls / finished) if calls and finished else _f(delta.get("calls_per_request")),
        "mean_batch": _f(delta.get("mean_batch")),
    }


def manipulation_check(variant: str | None, counters: list[dict]) -> dict:
    """Do the block's sync counters show its variant's signature (metrics.expected_syncs)? Missing counters fail."""
    ds = [c for c in counters if c.get("kind") == "delta"]
    syncs = sum(c.get("syncs") or 0 for c in ds)
    ocalls = sum(c.get("observed_calls") or 0 for c in ds)
    otokens = sum(c.get("observed_tokens") or 0 for c in ds)
    labels = sorted({c.get("variant") for c in ds if c.get("variant")})
    res = {"variant": variant, "server_variants": labels, "syncs": syncs, "observed_calls": ocalls,
           "observed_tokens": otokens, "expected_syncs": None, "ok": False, "reason": None}
    if not ds or not ocalls:
        res["reason"] = "no sync counters observed (scrape failed or observer off): variant cannot be verified"
        return res
    if labels and labels != [variant]:
        res["reason"] = f"server reports variant {labels}, block expected {variant!r}"
        return res
    try:
        exp = pm.expected_syncs(variant, ocalls, otokens)
    except (ValueError, KeyError):
        res["reason"] = f"unknown variant {variant!r}"
        return res
    res["expected_syncs"] = exp
    if abs(syncs - exp) <= SYNC_TOLERANCE * max(exp, 1.0):
        res["ok"] = True
    else:
        res["reason"] = (f"syncs {syncs:g} != expected {exp:g} for {variant} over {ocalls:g} calls / {otokens:g} tokens "
                         f"({syncs / ocalls:.2f} vs {exp / ocalls:.2f} per call)")
    return res


def block_summary(block: dict) -> dict:
    """Everything about one block: its metadata, validity (status + manipulation check) and per-level metrics."""
    meta = block["meta"]
    by_level: dict[int, list[dict]] = {}
    for r in block["requests"]:
        if r.get("concurrency") is not None:
            by_level.setdefault(int(r["concurrency"]), []).append(r)
    deltas, edges = _deltas(block["counters"]), _edges(block["counters"])
    stalls = _snapshot_deltas(block["counters"], pm.SIM_STALL_SECONDS)
    levels = {}
    for c in sorted(by_level):
        row = level_stats(by_level[c], deltas.get(c), edges.get(c), block["requests"])
        calls = (deltas.get(c) or {}).get("calls")
        # simulator only: the GPU stall it sleeps per sync is not inside the host time of the call
        row["stall_seconds_per_call"] = _f(stalls[c] / calls) if c in stalls and calls else None
        levels[str(c)] = row
    check = manipulation_check(meta.get("variant"), block["counters"])
    status = meta.get("status")
    valid = status == "complete" and check["ok"] and bool(levels)
    if status != "complete":
        why = f"status {status}" + (f": {meta.get('reason')}" if meta.get("reason") else "")
    elif not check["ok"]:
        why = f"manipulation check failed: {check['reason']}"
    elif not levels:
        why = "no measured requests"
    else:
        why = None
    simulated = any('backend="simulated"' in k for c in block["counters"] if c.get("kind") == "snapshot"
                    for k in (c.get("samples") or {}))
    return {k: meta.get(k) for k in ("block_id", "round", "kind", "arm", "variant", "status", "started", "ended")} | {
        "valid": valid, "invalid_reason": why, "manipulation": check, "simulated_counters": simulated,
        "levels": levels,
    }


# ----------------------------------------------------------------------------------------------- over rounds


def hodges_lehmann(x: np.ndarray) -> float:
    """One-sample Hodges–Lehmann estimate: median of the Walsh averages (robust centre of the per-round differences)."""
    i, j = np.triu_indices(len(x))
    return float(np.median((x[i] + x[j]) / 2.0))


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm step-down adjusted p-values (None passes through)."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    order = sorted(idx, key=lambda i: pvalues[i])
    m, out, running = len(order), list(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def mde(sd: float, n: int, level: float, power: float) -> float:
    """Minimum detectable effect (two-sided test at `level`, given power) from the observed spread over n rounds."""
    df = n - 1
    return float((sps.t.ppf(0.5 + level / 2, df) + sps.t.ppf(power, df)) * sd / math.sqrt(n))


def diff_stats(d: np.ndarray, level: float, s: Settings, seed: int) -> dict:
    """Interval estimates for the mean of per-round relative differences (in %).

    The verdict uses the hull of the bootstrap (BCa, seeded) and the Student-t interval: with a handful of rounds the
    bootstrap cannot reach beyond the sample's range (3 rounds cover the centre only ~75 % of the time), so alone it
    would claim too much; the t interval keeps the small-n coverage honest, the bootstrap guards against skew.
    """
    n = len(d)
    out = {"n": n, "values": [float(v) for v in d], "mean": None, "hl": None, "sd": None, "ci_boot": None, "ci_t": None,
           "ci": None, "half_width": None, "p_value": None, "mde": None}
    if n == 0:
        return out
    out["mean"], out["hl"] = float(d.mean()), hodges_lehmann(d)
    if n < 2:
        return out
    sd = float(d.std(ddof=1))
    out["sd"] = sd
    se = sd / math.sqrt(n)
    t_lo, t_hi = (d.mean(), d.mean()) if sd == 0 else sps.t.interval(level, n - 1, loc=d.mean(), scale=se)
    out["ci_t"] = [float(t_lo), float(t_hi)]
    lo, hi = float(t_lo), float(t_hi)
    if n >= 3 and sd > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b = sps.bootstrap((d,), np.mean, confidence_level=level, n_resamples=s.n_resamples, method="BCa",
                              rng=np.random.default_rng(seed))
        b_lo, b_hi = float(b.confidence_interval.low), float(b.confidence_interval.high)
        if math.isfinite(b_lo) and math.isfinite(b_hi):
            out["ci_boot"] = [b_lo, b_hi]
            lo, hi = min(lo, b_lo), max(hi, b_hi)
    out["ci"] = [lo, hi]
    out["half_width"] = (hi - lo) / 2
    out["p_value"] = 1.0 if sd == 0 and d.mean() == 0 else (0.0 if sd == 0 else float(sps.ttest_1samp(d, 0.0).pvalue))
    out["mde"] = mde(sd, n, level, s.power)
    return out


# ----------------------------------------------------------------------------------------------- prediction


def read_micro(path: str | Path | None) -> dict[tuple[str, int], float] | None:
    """Mean seconds per build_attn_metadata call by (variant, requests) from `make micro`'s results.json.

    Uses its "rows" (tts_predictor.micro: scenario, num_reqs, max_seq_len, variant, median_us): a talker step is
    1 prefill + 14 decode calls, so per call = (prefill + 14 x decode) / 15 at the shortest max_seq_len measured;
    decode alone where no prefill row exists. None if the file is absent or has no such rows.
    """
    if not path or not Path(path).exists():
        return None
    rows = json.loads(Path(path).read_text(encoding="utf-8")).get("rows") or []
    rows = [r for r in rows if r.get("scenario") in ("decode", "prefill") and r.get("median_us") is not None]
    if not rows:
        return None
    short = min(r.get("max_seq_len", 16) for r in rows)
    by: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        if r.get("max_seq_len", 16) == short:
            by.setdefault((r["variant"], int(r["num_reqs"])), {})[r["scenario"]] = float(r["median_us"]) * 1e-6
    out = {}
    for key, v in by.items():
        if "decode" in v:
            out[key] = (v.get("prefill", v["decode"]) + 14 * v["decode"]) / CALLS_PER_STEP
    return out or None


def _interp_micro(micro: dict, variant: str, batch: float) -> float | None:
    pts = sorted((n, s) for (v, n), s in micro.items() if v == variant)
    if not pts:
        return None
    xs, ys = zip(*pts, strict=True)
    return float(np.interp(batch, xs, ys))


def prediction(level: str, a_blocks: list[dict], b_blocks: list[dict], variants: dict, micro: dict | None) -> dict:
    """Expected e2e difference at a level: per-call saving x 15 calls/step x steps (= frames) per request."""
    def mean_of(blocks, key):
        v = [b["levels"][level][key] for b in blocks if level in b["levels"] and b["levels"][level][key] is not None]
        return float(np.mean(v)) if v else None

    spc_a, spc_b = mean_of(a_blocks, "seconds_per_call"), mean_of(b_blocks, "seconds_per_call")
    source = "counters"
    st_a, st_b = mean_of(a_blocks, "stall_seconds_per_call"), mean_of(b_blocks, "stall_seconds_per_call")
    if spc_a is not None and spc_b is not None and st_a is not None and st_b is not None:
        spc_a, spc_b, source = spc_a + st_a, spc_b + st_b, "counters (host time + simulated sync stall)"
    batch = mean_of(a_blocks, "mean_batch") or float(level)
    if micro:
        ma, mb = _interp_micro(micro, variants.get("A"), batch), _interp_micro(micro, variants.get("B"), batch)
        if ma is not None and mb is not None:
            spc_a, spc_b, source = ma, mb, "micro benchmark"
    audio = mean_of(a_blocks, "audio_s_mean")
    e2e_a = mean_of(a_blocks, "e2e_mean")
    out = {"source": source, "seconds_per_call_a": spc_a, "seconds_per_call_b": spc_b, "mean_batch": batch,
           "frames_per_request": audio * FRAMES_PER_AUDIO_S if audio else None, "saving_per_call_s": None,
           "e2e_saving_s": None, "e2e_diff_pct": None, "throughput_diff_pct": None}
    if spc_a is None or spc_b is None or not audio or not e2e_a:
        return out
    saving = spc_a - spc_b
    e2e_saving = saving * CALLS_PER_STEP * audio * FRAMES_PER_AUDIO_S
    out.update(saving_per_call_s=saving, e2e_saving_s=e2e_saving,
               e2e_diff_pct=-100.0 * e2e_saving / e2e_a,  # B vs A, % (negative = B faster)
               throughput_diff_pct=100.0 * (e2e_a / (e2e_a - e2e_saving) - 1.0) if e2e_a > e2e_saving else None)
    return out


# ----------------------------------------------------------------------------------------------- assembly


def _pairs(blocks: list[dict], kind: str) -> dict[int, dict[str, dict]]:
    """Rounds of `kind` in which both arms have a valid block."""
    rounds: dict[int, dict[str, dict]] = {}
    for b in blocks:
        if b["kind"] == kind and b["valid"]:
            rounds.setdefault(int(b["round"]), {})[b["arm"]] = b
    return {r: arms for r, arms in sorted(rounds.items()) if {"A", "B"} <= set(arms)}


def _rel_diffs(pairs: dict[int, dict[str, dict]], level: str, metric: str) -> np.ndarray:
    out = []
    for arms in pairs.values():
        la, lb = arms["A"]["levels"].get(level), arms["B"]["levels"].get(level)
        if la and lb and la[metric] and lb[metric] is not None:
            out.append(100.0 * (lb[metric] / la[metric] - 1.0))
    return np.array(out, dtype=float)


def _arm_bands(blocks: list[dict], levels: list[str], level_cl: float = 0.95) -> dict:
    """Per arm, level and metric: mean over valid A/B blocks with a Student-t band (for the report's plots)."""
    out: dict = {}
    for arm in ("A", "B"):
        bs = [b for b in blocks if b["valid"] and b["arm"] == arm and b["kind"] in ("ab", "single")]
        out[arm] = {}
        for lv in levels:
            row = {}
            for key in list(METRICS) + ["syncs_per_call", "syncs_per_step", "syncs_per_request", "seconds_per_call"]:
                v = np.array([b["levels"][lv][key] for b in bs if lv in b["levels"] and b["levels"][lv][key] is not None])
                if not v.size:
                    row[key] = None
                    continue
                lo = hi = float(v.mean())
                if v.size >= 2 and v.std(ddof=1) > 0:
                    lo, hi = (float(x) for x in sps.t.interval(level_cl, v.size - 1, loc=v.mean(), scale=sps.sem(v)))
                row[key] = {"mean": float(v.mean()), "lo": lo, "hi": hi, "n": int(v.size)}
            out[arm][lv] = row
    return out


def _distributions(run: dict, summaries: list[dict], levels: list[str]) -> dict:
    """Pooled e2e latency quantiles per arm and level over valid A/B blocks (CDF curves for the report)."""
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


def compare(summaries: list[dict], levels: list[str], s: Settings, metrics=VERDICT_METRICS) -> tuple[dict, int, int, float]:
    """Per level and metric: differences over rounds, intervals, A/A floor, verdict. Also used by the calibration."""
    k = max(len(levels), 1)
    level_cl = 1.0 - (1.0 - s.confidence) / k  # Bonferroni: every level's CI at 1 - alpha/k keeps the family-wise level
    ab, aa = _pairs(summaries, "ab"), _pairs(summaries, "aa")
    per_level: dict = {}
    for i, lv in enumerate(levels):
        row = {}
        for metric in metrics:
            st = diff_stats(_rel_diffs(ab, lv, metric), level_cl, s, s.seed + 1000 * i + VERDICT_METRICS.index(metric))
            aa_d = _rel_diffs(aa, lv, metric)
            st["aa_values"] = [float(v) for v in aa_d]
            # RMS: |d| for one A/A round; with more rounds it settles at the typical single-round A/A difference
            # (bias and spread together) instead of growing like a maximum would
            st["aa_floor"] = float(np.sqrt(np.mean(aa_d ** 2))) if aa_d.size else None
            st["rounds_for_margin"] = (rounds_for_halfwidth(st["sd"], s.margin_pct, level_cl, s.max_rounds)
                                       if st["sd"] is not None else None)
            row[metric] = st
        per_level[lv] = row
    for metric in metrics:  # Holm across levels on the per-level t tests (reported beside the CI verdict)
        adj = holm([per_level[lv][metric]["p_value"] for lv in levels])
        for lv, p in zip(levels, adj, strict=True):
            st = per_level[lv][metric]
            st["p_holm"] = p
            st["verdict"] = decide(METRICS[metric].better, st, st["aa_floor"], level_cl, s.margin_pct, s.max_rounds)
    return per_level, len(ab), len(aa), level_cl


def summarize(run_dir: str | Path, settings: Settings | None = None, micro_path: str | Path | None = None) -> tuple[dict, dict]:
    """Compute summary.json and comparison.json for a run folder (pure: reads files, returns dicts)."""
    s = settings or Settings()
    run = load_run(run_dir)
    man = run["manifest"]
    summaries = [block_summary(b) for b in run["blocks"]]
    levels = sorted({lv for b in summaries for lv in b["levels"]}, key=int)
    variants = man.get("variants") or {"A": next((b["variant"] for b in summaries if b["arm"] == "A"), None),
                                       "B": next((b["variant"] for b in summaries if b["arm"] == "B"), None)}
    backend = man.get("backend") or {}
    backend_name = backend.get("name") if isinstance(backend, dict) else backend
    simulated = backend_name in ("sim", "simulated", "simulator") or any(b["simulated_counters"] for b in summaries)
    planned = len(man.get("plan") or [])
    complete = sum(b["status"] == "complete" for b in summaries)
    partial = (man.get("status") not in (None, "complete")) or (planned and complete < planned) or \
        any(b["status"] == "interrupted" for b in summaries)
    invalid = [{"block_id": b["block_id"], "round": b["round"], "kind": b["kind"], "arm": b["arm"],
                "variant": b["variant"], "reason": b["invalid_reason"]} for b in summaries if not b["valid"]]

    warnings_ = []
    for lv in levels:  # a window shorter than a couple of request lifetimes measures the ramp, not the steady state
        rows = [b["levels"][lv] for b in summaries if b["valid"] and lv in b["levels"]]
        short = [r for r in rows if r["window_s"] and r["e2e_p50"] and r["window_s"] < 2 * r["e2e_p50"]]
        if short:
            worst = max(r["e2e_p50"] for r in short)
            warnings_.append(f"c={lv}: the measure window ({short[0]['window_s']:.0f} s) is shorter than twice the p50 "
                             f"latency (up to {worst:.1f} s) in {len(short)} of {len(rows)} blocks: throughput there "
                             "is a start-up transient, not a steady state; use longer phases for a real answer")
    for b in run["blocks"]:  # requests running at the stop are never recorded: the last window needs a drain after it
        ends = [r["t_start"] + r["e2e_s"] for r in b["requests"] if r.get("e2e_s") is not None]
        edges = _edges(b["counters"])
        if ends and edges:
            last = max(edges, key=lambda c: edges[c][1])
            if max(ends) < edges[last][1] + 0.5:
                warnings_.append(f"c={last}: no drain after the last measure window (block {b['meta'].get('block_id')}"
                                 "): requests still running at the stop are unrecorded, so its throughput reads low")
                break
    summary = {
        "schema": SUMMARY_SCHEMA, "warnings": warnings_, "run_dir": str(run_dir), "run_id": man.get("run_id", Path(run_dir).name),
        "variants": variants, "backend": backend, "simulated": bool(simulated), "partial": bool(partial),
        "run_status": man.get("status"), "planned_blocks": planned, "complete_blocks": complete,
        "started": man.get("started"), "ended": man.get("ended"), "git_revision": man.get("git_revision"),
        "scenario": man.get("scenario"), "levels": levels,
        "metrics": {k: {"label": m.label, "unit": m.unit, "better": m.better, "definition": m.definition}
                    for k, m in METRICS.items()},
        "blocks": summaries, "invalid_blocks": invalid, "arms": _arm_bands(summaries, levels),
        "distributions": _distributions(run, summaries, levels), "notes": run["notes"],
    }

    per_level, ab_n, aa_n, level_cl = compare(summaries, levels, s, metrics=VERDICT_METRICS)
    k = max(len(levels), 1)
    micro = read_micro(micro_path)
    a_blocks = [b for b in summaries if b["valid"] and b["arm"] == "A" and b["kind"] == "ab"]
    b_blocks = [b for b in summaries if b["valid"] and b["arm"] == "B" and b["kind"] == "ab"]
    preds = {lv: prediction(lv, a_blocks, b_blocks, variants, micro) for lv in levels}
    comparison = {
        "schema": COMPARISON_SCHEMA, "run_id": summary["run_id"], "variants": variants,
        "simulated": summary["simulated"], "partial": summary["partial"], "invalid_blocks": invalid,
        "settings": {"confidence": s.confidence, "per_level_confidence": level_cl, "levels": k,
                     "correction": f"Bonferroni over {k} levels for the CIs (each at {100 * level_cl:.2f} %); "
                                   "Holm-adjusted p-values of per-level one-sample t tests reported beside them",
                     "ci_method": "hull of BCa bootstrap (scipy.stats.bootstrap, seeded) and Student-t interval "
                                  "over per-round relative differences",
                     "margin_pct": s.margin_pct, "power": s.power, "n_resamples": s.n_resamples, "seed": s.seed,
                     "aa_floor": "root mean square of the relative differences of the A/A rounds at that level and metric "
                                 "(|d| for one round)",
                     "no_difference_rule": "whole CI inside ±max(margin, A/A floor)"},
        "rounds": {"ab": ab_n, "aa": aa_n}, "levels": levels, "primary_metric": PRIMARY_METRIC,
        "per_level": per_level, "prediction": preds,
    }
    return summary, comparison


def write_statistics(run_dir: str | Path, settings: Settings | None = None, micro_path=None) -> tuple[Path, Path]:
    """Compute and write summary.json + comparison.json next to the run's raw files."""
    summary, comparison = summarize(run_dir, settings, micro_path)
    run = Path(run_dir)
    paths = run / "summary.json", run / "comparison.json"
    for p, obj in zip(paths, (summary, comparison), strict=True):
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        tmp.replace(p)
    return paths
