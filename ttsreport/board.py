"""The dashboard's model: every run folder under a root read through its own readers into Run rows, the history
of each experiment across its runs (with the change rule), and a running run's progress. Computes no statistic; a
folder that cannot be read is a row with the reason, never dropped. dashpage.py draws it; dashboard.py writes and
serves the page.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ttsrecords import outcomes as oc
from ttsrecords import records as rec
from ttsrecords.loadrun import NOT_REPORTED, read_load_manifest
from ttsrecords.manifest import read_manifest
from ttsrecords.progress import read_progress
from ttsrecords.runfolder import read_blocks, read_json_checked
from ttsrecords.runsettings import LOOK_LOG
from ttsrecords.windows import manifest_windows

from . import page
from . import report as rep
from . import rounds as rd
from .looks import decision_ci

KINDS = ("A/B", "Locust", "preflight", "benchmark")
# a backend name as a run records it (manifest backend.name, preflight backend) -> (filter key, words)
BACKENDS = {"sim": ("sim", "SIMULATED"), "vllm": ("gpu", "real GPU"), "vllm-cpu": ("cpu", "real server on CPU")}
NOT_RECORDED = ("unknown", "not recorded")
ARM_DESCRIPTIONS = ("arm", "evidence", "plugin", "simulated_from")  # prose about an arm, not what it runs


# ----------------------------------------------------------------------------------------------- the change rule


def changed(a: list[float] | None, b: list[float] | None) -> bool:
    """THE change rule between two runs of one experiment at one level: a change is marked only where their
    intervals of the ratio B/A (each the interval its verdict card shows) do not overlap, one lying wholly above the
    other. Two disjoint intervals mean a difference well beyond the noise of either run; overlapping ones mark
    nothing (which does not prove that nothing changed). A run without an interval is never marked."""
    if not a or not b:
        return False
    return a[1] < b[0] or b[1] < a[0]


# ----------------------------------------------------------------------------------------------- page model


@dataclass
class Level:
    level: str
    kind: str | None
    word: str | None  # the decision in the report card's words (the kind where the card has no other)
    ratio: float | None
    ci: list[float] | None
    words: str


@dataclass
class Run:
    """One row of the dashboard: what a run folder's own files say about it."""

    folder: str  # relative to the reports root, with / separators
    kind: str  # KINDS, or "unknown" for a folder that holds no run file
    link: str | None = None  # relative link to its report (or its main file)
    date: str | None = None  # UTC, ISO 8601
    backend: str = NOT_RECORDED[0]  # filter key: sim | cpu | gpu | unknown
    backend_words: str = NOT_RECORDED[1]
    design: str | None = None
    unit: str | None = None
    experiment: str | None = None  # what is compared, in words
    experiment_key: str | None = None  # the history group: same arms and scenario
    arms: str | None = None
    scenario: str | None = None
    metric: str | None = None  # the primary metric's label
    margin_pct: float | None = None
    levels: list[Level] = field(default_factory=list)
    status: str = "complete"  # complete | partial | interrupted | running | failed | planned | unreadable | ...
    notes: list[str] = field(default_factory=list)  # statistics missing or stale, looks, failed checks
    invalid: list[str] = field(default_factory=list)  # "<window>: <reason>"
    git: str | None = None
    server: str | None = None  # server version(s)
    live: dict | None = None  # progress of a running run
    links: list[tuple[str, str]] = field(default_factory=list)  # further pages (benchmark pages)
    error: str | None = None  # why the folder could not be read


@dataclass
class History:
    key: str
    experiment: str
    arms: str
    scenario: str | None
    backend: str
    levels: list[str]
    margin_pct: float | None
    runs: list[dict]  # in time order: {"folder", "link", "date", "git", "server", "scenario_sha", "levels"}


@dataclass
class Dashboard:
    root: str
    runs: list[Run]
    histories: list[History]


def iso_time(value) -> str | None:
    """A run's time as UTC ISO 8601 (the files hold ISO strings or epoch seconds); None when absent."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        t = datetime.fromtimestamp(float(value), timezone.utc)
    else:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _backend(name) -> tuple[str, str]:
    if not name:
        return NOT_RECORDED
    return BACKENDS.get(str(name), ("unknown", f"{name} (a backend name this page does not know)"))


def _key(*parts) -> str:
    return f"x{zlib.crc32(json.dumps(parts, sort_keys=True, default=str).encode()):08x}"


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _report_link(folder: Path, root: Path) -> str:
    return _rel(folder / "index.html", root) if (folder / "index.html").is_file() else _rel(folder, root) + "/"


def _arms_identity(man: dict) -> dict:
    """What each arm runs (the manifest's arms without their prose; a version-1 manifest: variants and simulator)."""
    arms = man.get("arms")
    if isinstance(arms, dict) and arms:
        return {side: {k: v for k, v in (a or {}).items() if k not in ARM_DESCRIPTIONS} for side, a in arms.items()}
    s = man.get("settings") or {}
    return {side: {"variant": v, "backend": (man.get("backend") or {}).get("name"), "sim_config": s.get("sim_config"),
                   "sim_set": (s.get("sim_set") or []) + ((s.get("b_sim_set") or []) if side == "B" else [])}
            for side, v in (man.get("variants") or {}).items()}


def status_of(man: dict, blocks: list[rec.BlockRecord]) -> str:
    """A run's status from its manifest and windows: running / interrupted / failed / planned as the manifest says;
    a run the manifest calls complete is "partial" when a planned window has no result (failed for good, or never
    run), else "complete". Invalid windows are listed beside the status, not folded into it."""
    st = man.get("status") or "complete"
    if st != "complete":
        return st
    done = {b.block_id for b in blocks if b.status in ("complete", "invalid")}
    planned = [w.block_id for w in manifest_windows(man)]
    return "partial" if any(b not in done for b in planned) else "complete"


def _live(folder: Path, man: dict, blocks: list[rec.BlockRecord]) -> dict:
    """A running run: the runner's progress.json, its sequential looks so far, and its windows by status."""
    prog = read_progress(folder)
    looks, _ = rec.read_jsonl(folder / "looks.jsonl", rec.LOOK_SCHEMA)
    by: dict[str, int] = {}
    for b in blocks:
        by[b.status] = by.get(b.status, 0) + 1
    seq = (man.get("design") or {}).get("sequential")
    return {"progress": None if prog is None else prog.to_dict(), "windows": by,
            "windows_planned": len(manifest_windows(man)),
            "sequential": None if not seq else {"min_rounds": seq.get("min_rounds"),
                                                "max_rounds": seq.get("max_rounds")},
            "looks": [{"rounds": x.get("rounds"), "stop": x.get("stop"), "reason": x.get("reason"),
                       "text": "; ".join(f"c={lv} {r.get('kind')}" + (f" {page._r(r.get('ratio'))} {page._ci(decision_ci(r))}"
                                                                        if r.get("ratio") else "")
                                         for lv, r in (x.get("levels") or {}).items()) or x.get("text")}
                      for x in looks]}


def read_ab(folder: Path, root: Path, man: dict) -> Run:
    """An A/B run (manifest tts-ab): its manifest and windows, and its statistics when they were built."""
    man = read_manifest(man, str(folder / "manifest.json")).to_dict()  # version 1 upgraded, as the statistics do
    exp = man.get("experiment") if isinstance(man.get("experiment"), dict) else {}
    labels = man.get("labels") or man.get("variants") or {}
    be = man.get("backend") or {}
    design = rd.design_of(man)
    scen = man.get("scenario") or {}
    arms = _arms_identity(man)
    name = exp.get("name") or f"{labels.get('B')} vs {labels.get('A')}"
    vers = sorted({f"vllm-omni {a['vllm_omni']}" for a in (man.get("arms") or {}).values()
                   if isinstance(a, dict) and a.get("vllm_omni")})
    run = Run(folder=_rel(folder, root), kind="A/B", link=_report_link(folder, root), date=iso_time(man.get("started")),
              design=design, unit=rd.DESIGN_UNITS.get(design), experiment=name,
              experiment_key=_key(name, arms, scen.get("path")),
              arms=f"A: {labels.get('A')} · B: {labels.get('B')}", scenario=scen.get("path"),
              git=man.get("git_revision"),
              server=be.get("version") if not vers or be.get("version") in vers else
              f"{be.get('version')} ({', '.join(vers)})")
    run.backend, run.backend_words = _backend(be.get("name"))
    blocks = read_blocks(folder)
    run.status = status_of(man, blocks)
    run.invalid = [f"{b.block_id}: {b.reason}" for b in blocks if b.status == "invalid"]
    seq = next((x for x in (man.get(LOOK_LOG), man.get("sequential")) if isinstance(x, dict) and "looks" in x),
               {})  # the runner's look log (folders written before it had its own key kept it under "sequential")
    if seq.get("stopped"):
        run.notes.append(f"sequential: stopped after {seq['stopped'].get('ab_rounds')} A/B rounds "
                         f"({seq['stopped'].get('reason')})")
    elif seq.get("looks"):
        run.notes.append(f"sequential: {seq['looks']} look(s), no stop")
    if run.status == "running":
        run.live = _live(folder, man, blocks)
    if not (folder / "summary.json").is_file():
        run.notes.append("no statistics yet" + ("" if run.status == "running" else
                                                f" (make report RUN={folder})"))
        return run
    summary, comparison = rep.load(folder)
    if summary.run_status != man.get("status"):
        run.notes.append(f"statistics are from when the run was {summary.run_status}, it is now "
                         f"{man.get('status')} (make report RUN={folder})")
    run.invalid = [f"{b['block_id']}: {b['reason']}" for b in summary.invalid_blocks or []] or run.invalid
    run.metric = summary.metrics[comparison.primary_metric]["label"]
    run.margin_pct = comparison.settings.get("margin_pct")
    run.unit = comparison.settings.get("unit") or run.unit
    run.levels = [Level(str(c["level"]), c["kind"], c.get("word") or c["kind"], c["ratio"], c["ci"], c["words"])
                  for c in rep.cards(comparison)]
    return run


def read_locust(folder: Path, root: Path, man: dict | None) -> Run:
    """A Locust run (manifest tts-run, written when Locust finishes; requests.jsonl alone while it runs)."""
    run = Run(folder=_rel(folder, root), kind="Locust", link=_report_link(folder, root))
    if man is None:
        run.status = "running, or stopped before writing manifest.json"
        run.link = _rel(folder, root) + "/"
        return run
    lm = read_load_manifest(man, f"{folder}/manifest.json")
    run.date = iso_time(lm.started)
    run.experiment = f"{lm.variant or 'server'} against {lm.host}"
    run.arms = lm.variant
    run.git = lm.git_revision
    scen = lm.scenario
    run.scenario = scen.get("name") if isinstance(scen, dict) else scen
    run.status = lm.status
    if lm.server.backend != NOT_REPORTED:  # what the server said it is (runs before that: not recorded)
        run.backend, run.backend_words = _backend("sim" if lm.server.backend == "simulated" else
                                                  "vllm-cpu" if lm.server.device == "cpu" else "vllm")
    if lm.server.version != NOT_REPORTED:
        run.server = lm.server.version
    if lm.status != "complete" and lm.reason:
        run.notes.append(f"{lm.status}: {lm.reason}")
    run.notes.append(f"{lm.requests_lines} request records")
    failed = _failure_kinds(folder / "requests.jsonl")
    if failed:
        run.notes.append("failed requests: " + ", ".join(f"{k} ({n})" for k, n in failed.items()))
    return run


def _failure_kinds(path: Path, top: int = 3) -> dict[str, int]:
    """The most frequent kinds of failed request in a Locust run's records (the dashboard's failure reasons)."""
    rows, _ = rec.read_jsonl(path, rec.REQUEST_SCHEMA)
    return dict(list(oc.error_counts(rows).items())[:top])


def read_preflight(folder: Path, root: Path) -> Run:
    doc = read_json_checked(folder / "preflight.json", (rec.PREFLIGHT_SCHEMA,)) or {}
    run = Run(folder=_rel(folder, root), kind="preflight", link=_rel(folder / "preflight.json", root),
              date=iso_time(doc.get("started")), experiment=doc.get("experiment"),
              arms=", ".join(doc.get("variants") or []) or None)
    run.backend, run.backend_words = _backend(doc.get("backend"))
    counts = doc.get("counts") or {}
    run.status = "complete" if doc.get("ok") else "failed checks"
    run.notes.append(", ".join(f"{v} {k}" for k, v in counts.items()))
    run.notes += [f"FAIL {c.get('name')}: {c.get('detail')}" for c in doc.get("checks") or []
                  if c.get("status") == "fail"]
    return run


def read_micro(folder: Path, root: Path) -> Run:
    """A micro benchmark (results.json of `make micro`): the variants' code on a device, no server."""
    doc = read_json_checked(folder / "results.json", (rec.MICRO_SCHEMA,)) or {}
    device = str(doc.get("device") or "")
    md = folder / "results.md"
    run = Run(folder=_rel(folder, root), kind="benchmark", link=_rel(md if md.is_file() else folder / "results.json",
                                                                    root),
              date=iso_time(doc.get("created")), experiment="micro benchmark of build_attn_metadata's variants",
              arms=", ".join(sorted({r.get("variant") for r in doc.get("rows") or [] if r.get("variant")})) or None,
              server=f"torch {doc.get('torch')}" if doc.get("torch") else None)
    run.backend, run.backend_words = ("gpu", f"real GPU ({device}, no server)") if device.startswith("cuda") else \
        ("cpu", f"real code on CPU ({device or 'cpu'}, no server)")
    run.notes.append(f"{len(doc.get('rows') or [])} rows, {doc.get('rounds')} rounds")
    return run


def read_pages(folder: Path, root: Path) -> Run:
    """A folder of benchmark pages (Markdown written by the tools: reports/bench/)."""
    pages = sorted(p for p in folder.iterdir() if p.suffix == ".md")
    return Run(folder=_rel(folder, root), kind="benchmark", link=_rel(pages[0], root), status="pages",
               experiment="benchmark pages", links=[(p.stem, _rel(p, root)) for p in pages],
               notes=[f"{len(pages)} pages; what each measured, and on which backend, is in the page"])


def _kind_of(folder: Path) -> str | None:
    """Which reader a folder needs, from the file it holds (None: it holds no run)."""
    if (folder / "manifest.json").is_file():
        return "manifest"
    if (folder / "preflight.json").is_file():
        return "preflight"
    if (folder / "results.json").is_file():
        return "micro"
    if (folder / "requests.jsonl").is_file() or (folder / "blocks").is_dir():
        return "incomplete"
    if any(p.suffix == ".md" for p in folder.iterdir()):
        return "pages"
    return None


def read_run(folder: Path, root: Path) -> Run:
    """One run folder as a dashboard row; a folder that cannot be read is a row that says why."""
    kind = _kind_of(folder)
    guess = {"preflight": "preflight", "micro": "benchmark", "pages": "benchmark", None: "unknown"}.get(kind, "A/B")
    try:
        if kind == "manifest":
            man = read_json_checked(folder / "manifest.json", rec.RUN_MANIFESTS) or {}
            schema = man.get("schema", rec.RUN_SCHEMA)
            guess = "Locust" if schema in (rec.RUN_SCHEMA, *rec.LEGACY[rec.RUN_SCHEMA]) else "A/B"
            return read_locust(folder, root, man) if guess == "Locust" else read_ab(folder, root, man)
        if kind == "preflight":
            return read_preflight(folder, root)
        if kind == "micro":
            return read_micro(folder, root)
        if kind == "pages":
            return read_pages(folder, root)
        if kind == "incomplete":
            if (folder / "blocks").is_dir():
                raise ValueError("blocks/ without manifest.json: not a run this suite wrote, or its manifest was lost")
            return read_locust(folder, root, None)
        raise ValueError("no manifest.json, preflight.json, results.json or report page in it")
    except (ValueError, KeyError, TypeError, OSError) as e:  # json.JSONDecodeError is a ValueError
        why = f"missing field {e}" if isinstance(e, KeyError) else str(e).replace("\n", " ")
        return Run(folder=_rel(folder, root), kind=guess, link=_rel(folder, root) + "/", status="unreadable",
                   error=why)


def run_folders(root: Path) -> list[Path]:
    """The run folders under root: each folder that holds a run's file; a folder that holds none but has run folders
    inside (reports/micro/<UTC>/) stands for every folder inside it; a folder of pages with run folders inside
    (reports/vllm-cpu/: its README and its runs) is listed with each of them; any other folder is listed too (as
    unreadable)."""
    out = []
    for p in sorted(root.iterdir()):
        if not p.is_dir() or p.name.startswith((".", "_")):
            continue
        kind = _kind_of(p)
        if kind in (None, "pages"):
            inner = [q for q in sorted(p.iterdir()) if q.is_dir() and not q.name.startswith((".", "_"))]
            runs = inner if any(_kind_of(q) is not None for q in inner) else []
            out += ([p] if kind == "pages" or not runs else []) + runs
        else:
            out.append(p)
    return out


def histories(runs: list[Run]) -> list[History]:
    """Per experiment (same arms and scenario): its A/B runs with a headline, oldest first, each level marked where
    the change rule says it moved since the run before."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        if r.kind == "A/B" and r.levels and r.experiment_key:
            groups.setdefault(r.experiment_key, []).append(r)
    out = []
    for key, rs in groups.items():
        rs.sort(key=lambda r: (r.date or "", r.folder))
        levels = sorted({lv.level for r in rs for lv in r.levels}, key=int)
        rows, last = [], {}
        for r in rs:
            pts = {}
            for lv in r.levels:
                prev = last.get(lv.level)
                pts[lv.level] = {"ratio": lv.ratio, "ci": lv.ci, "kind": lv.kind, "word": lv.word,
                                 "changed": prev is not None and changed(prev.ci, lv.ci),
                                 "direction": None if prev is None or lv.ratio is None or prev.ratio is None else
                                 ("up" if lv.ratio > prev.ratio else "down")}
                last[lv.level] = lv
            rows.append({"folder": r.folder, "link": r.link, "date": r.date, "git": r.git, "server": r.server,
                         "status": r.status, "levels": pts})
        head = rs[-1]
        out.append(History(key, head.experiment or "?", head.arms or "", head.scenario, head.backend_words, levels,
                           head.margin_pct, rows))
    out.sort(key=lambda h: h.experiment)
    return out


def model(root: str | Path) -> Dashboard:
    """The dashboard of every run folder under root (newest first; undated ones last)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder")
    runs = [read_run(f, root) for f in run_folders(root)]
    runs.sort(key=lambda r: r.folder)
    runs.sort(key=lambda r: r.date or "", reverse=True)
    return Dashboard(str(root), runs, histories(runs))
