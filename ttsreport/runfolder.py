"""Loading a run folder: the one reader of its files (manifest, scenario, starts, every window's block.json with
its requests, counters and telemetry, the sequential looks), each refused in one line when its schema is unknown.

blocks.py computes each window's numbers from what this returns; the dashboard (board.py) reads block.json through
it too. A plain Locust run is seen as one window of arm A; version-1 runs load with their later fields as null.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ttsrecords import records as rec
from ttsrecords.manifest import AB_MANIFESTS, read_manifest


def read_json_checked(path: Path, known: tuple[str, ...]) -> dict | None:
    """A JSON record file whose schema must be one of `known` (a missing schema field reads as the first)."""
    try:
        obj = rec.read_json(path)
    except ValueError as e:  # json.JSONDecodeError
        raise ValueError(f"{path}: not JSON ({e})") from None
    if obj is None:
        return None
    if obj.get("schema", known[0]) not in known:
        raise ValueError(f"{path}: unknown schema {obj.get('schema')!r} (this reader knows "
                         f"{' or '.join(repr(k) for k in known)})")
    return obj


def read_block_meta(bdir: Path) -> dict | None:
    """A window's block.json (the current schema or a legacy one); None when the window never started."""
    return read_json_checked(bdir / "block.json", (rec.BLOCK_SCHEMA, *rec.LEGACY[rec.BLOCK_SCHEMA]))


def read_block_metas(run: Path) -> list[dict]:
    """Every window's block.json of a run folder, in block order (windows that never started left out)."""
    bdir = run / "blocks"
    metas = (read_block_meta(p) for p in sorted(bdir.iterdir()) if p.is_dir()) if bdir.is_dir() else ()
    return [m for m in metas if m is not None]


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
    starts: dict[int, dict] = {}
    if (run / "starts").is_dir():
        for sdir in sorted((run / "starts").iterdir()):
            s = read_json_checked(sdir / "start.json", (rec.START_SCHEMA,)) if sdir.is_dir() else None
            if s is not None:
                starts[int(s["start"])] = s
    blocks = []
    block_dirs = sorted((run / "blocks").iterdir()) if (run / "blocks").is_dir() else []
    synthetic = None
    if not block_dirs and (run / "requests.jsonl").exists():  # a plain Locust run
        block_dirs = [run]
        synthetic = {"block_id": run.name, "round": 0, "kind": "single", "arm": "A", "variant": manifest.get("variant"),
                     "status": "complete", "reason": None}
    for bdir in block_dirs:
        if not bdir.is_dir():
            continue
        meta = synthetic or read_block_meta(bdir)
        if meta is None:
            notes.append(f"{bdir.name}: no block.json (block never started) — skipped")
            continue
        blocks.append({"meta": meta, "workload": _workload(bdir, scenario),
                       "requests": _jsonl(bdir / "requests.jsonl", rec.REQUEST_SCHEMA, notes),
                       "counters": _jsonl(bdir / "counters.jsonl", rec.COUNTERS_SCHEMA, notes),
                       "telemetry": _jsonl(bdir / "telemetry.jsonl", rec.TELEMETRY_SCHEMA, notes)})
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
