"""Loading a run folder for the statistics: the manifest (upgraded once), the scenario, the starts, every window with
its requests, counters and telemetry, the sequential looks; each file refused in one line when its schema is unknown.

The files of a window and of a start are read by ttsrecords.runfolder, the one reader, into typed records; this
module hands them on as dicts (`to_dict`) because blocks.py and the analysis still read dicts, until they move to the
records (docs/architecture.md, "Typed reading"). A plain Locust run is seen as one window of arm A; version-1 runs
load with their later fields at their defaults.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from ttsrecords import records as rec
from ttsrecords import runfolder as typed
from ttsrecords.manifest import AB_MANIFESTS, read_manifest
from ttsrecords.runfolder import read_json_checked


def _jsonl(path: Path, schema: str, notes: list[str]) -> list[dict]:
    rows, n = rec.read_jsonl(path, schema)
    notes += n
    return rows


def load_run(run_dir: str | Path) -> dict:
    """Manifest, effective scenario, starts, windows (with requests, counters, telemetry) and looks of an A/B run;
    a single Locust run is seen as one window of arm A. Version-1 runs load too (their later fields read as null)."""
    run = Path(run_dir)
    manifest = read_json_checked(run / "manifest.json", rec.RUN_MANIFESTS) or {}
    if manifest.get("schema") in AB_MANIFESTS:  # the one upgrade of an A/B manifest, here at load time
        manifest = read_manifest(manifest, str(run / "manifest.json")).to_dict()
    notes: list[str] = []
    scenario = _yaml_file(run / "scenario.yaml")
    starts = {n: s.to_dict() for n, s in typed.read_starts(run).items()}
    blocks = []
    block_dirs = sorted((run / "blocks").iterdir()) if (run / "blocks").is_dir() else []
    if not block_dirs and (run / "requests.jsonl").exists():  # a plain Locust run: one window of arm A
        meta = {"block_id": run.name, "round": 0, "kind": "single", "arm": "A", "variant": manifest.get("variant"),
                "status": "complete", "reason": None}
        blocks.append({"meta": meta, "workload": _workload(run, scenario),
                       "requests": _jsonl(run / "requests.jsonl", rec.REQUEST_SCHEMA, notes),
                       "counters": _jsonl(run / "counters.jsonl", rec.COUNTERS_SCHEMA, notes),
                       "telemetry": _jsonl(run / "telemetry.jsonl", rec.TELEMETRY_SCHEMA, notes)})
    for bdir in (d for d in block_dirs if d.is_dir()):
        w = typed.read_window(bdir, notes)  # the one reader of a window's files; dicts below until callers move
        if w is None:
            notes.append(f"{bdir.name}: no block.json (block never started) — skipped")
            continue
        blocks.append({"meta": w.meta.to_dict(), "workload": _workload(bdir, scenario),
                       "requests": [r.to_dict() for r in w.requests],
                       "counters": [c.to_dict() for c in w.counters],
                       "telemetry": [t.to_dict() for t in w.telemetry]})
    looks = _jsonl(run / "looks.jsonl", rec.LOOK_SCHEMA, notes)
    return {"dir": str(run), "manifest": manifest, "scenario": scenario, "starts": starts, "blocks": blocks,
            "looks": looks, "notes": notes}


def _yaml_file(path: Path):
    """A YAML file's content, None when it is absent; a file that is not YAML is one line of error."""
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None


def _workload(bdir: Path, run_scenario: dict | None) -> dict:
    """The load a window ran: its loop and prompt mix, from the window's own scenario.yaml (else the run's). The
    closed-loop work rates weigh the prompt buckets by this mix (closed_loop_rates)."""
    scen = _yaml_file(bdir / "scenario.yaml") or run_scenario
    scen = scen if isinstance(scen, dict) else {}
    mix = scen.get("mix") if isinstance(scen.get("mix"), dict) else None
    phases = scen.get("phases") if isinstance(scen.get("phases"), dict) else {}
    drains = {}
    for st in scen.get("steps") or []:
        st = st if isinstance(st, dict) else {"concurrency": st}
        d = st.get("drain_s", phases.get("drain_s"))
        if st.get("concurrency") is not None and d is not None:
            drains[int(st["concurrency"])] = float(d)
    return {"loop": scen.get("loop", "closed"),
            "mix": {str(k): float(v) for k, v in mix.items() if float(v) > 0} if mix else None, "drains": drains}
