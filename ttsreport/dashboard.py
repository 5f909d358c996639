"""The report dashboard: every run folder under reports/ in one self-contained page, the history of each experiment
across its runs, and the progress of a run while it writes its files.

    python -m ttsreport.dashboard [reports] [--out reports/index.html]        (make dashboard)
    python -m ttsreport.dashboard [reports] --serve [--port 8765]             (make dashboard SERVE=1)

The page is a pure function of the run folders: it reads each run's own files through their readers (the manifest,
block.json and looks through ttsrecords.records, the statistics through ttsreport.report.load, which also gives the
headline cards) and computes no statistic. A folder that cannot be read is listed with the reason, never dropped.
`--serve` serves the page on 127.0.0.1 only, rebuilt on every request, and the page re-reads itself every few seconds,
so a running A/B run shows its progress (the runner's progress.json, ttsrecords.records.Progress). Bad input: one
line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import sys
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ttsrecords import records as rec
from ttsrecords.loadrun import NOT_REPORTED, read_load_manifest
from ttsrecords.manifest import read_manifest
from ttsrecords.runsettings import LOOK_LOG
from ttsrecords.windows import manifest_windows

from . import page, plots, render
from . import report as rep
from . import rounds as rd
from .blocks import read_json_checked
from .looks import decision_ci

KINDS = ("A/B", "Locust", "preflight", "benchmark")
# a backend name as a run records it (manifest backend.name, preflight backend) -> (filter key, words)
BACKENDS = {"sim": ("sim", "SIMULATED"), "vllm": ("gpu", "real GPU"), "vllm-cpu": ("cpu", "real server on CPU")}
NOT_RECORDED = ("unknown", "not recorded")
ARM_DESCRIPTIONS = ("arm", "evidence", "plugin", "simulated_from")  # prose about an arm, not what it runs
REFRESH_S = 5  # the served page re-reads itself this often
STALE_S = 120  # a running run whose progress.json is older than this is flagged (the runner may have been killed)
DEFAULT_PORT = 8765
BIND = "127.0.0.1"


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


def _iso(value) -> str | None:
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


def _blocks(folder: Path) -> list[dict]:
    bdir = folder / "blocks"
    out = []
    for p in sorted(bdir.iterdir()) if bdir.is_dir() else []:
        meta = read_json_checked(p / "block.json", (rec.BLOCK_SCHEMA, *rec.LEGACY[rec.BLOCK_SCHEMA])) \
            if p.is_dir() else None
        if meta is not None:
            out.append(meta)
    return out


def status_of(man: dict, blocks: list[dict]) -> str:
    """A run's status from its manifest and windows: running / interrupted / failed / planned as the manifest says;
    a run the manifest calls complete is "partial" when a planned window has no result (failed for good, or never
    run), else "complete". Invalid windows are listed beside the status, not folded into it."""
    st = man.get("status") or "complete"
    if st != "complete":
        return st
    done = {b.get("block_id") for b in blocks if b.get("status") in ("complete", "invalid")}
    planned = [w.block_id for w in manifest_windows(man)]
    return "partial" if any(b not in done for b in planned) else "complete"


def _live(folder: Path, man: dict, blocks: list[dict]) -> dict:
    """A running run: the runner's progress.json, its sequential looks so far, and its windows by status."""
    prog = rec.read_progress(folder)
    looks, _ = rec.read_jsonl(folder / "looks.jsonl", rec.LOOK_SCHEMA)
    by: dict[str, int] = {}
    for b in blocks:
        by[b.get("status")] = by.get(b.get("status"), 0) + 1
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
    run = Run(folder=_rel(folder, root), kind="A/B", link=_report_link(folder, root), date=_iso(man.get("started")),
              design=design, unit=rd.DESIGN_UNITS.get(design), experiment=name,
              experiment_key=_key(name, arms, scen.get("path")),
              arms=f"A: {labels.get('A')} · B: {labels.get('B')}", scenario=scen.get("path"),
              git=man.get("git_revision"),
              server=be.get("version") if not vers or be.get("version") in vers else
              f"{be.get('version')} ({', '.join(vers)})")
    run.backend, run.backend_words = _backend(be.get("name"))
    blocks = _blocks(folder)
    run.status = status_of(man, blocks)
    run.invalid = [f"{b.get('block_id')}: {b.get('reason')}" for b in blocks if b.get("status") == "invalid"]
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
    run.date = _iso(lm.started)
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
    return dict(list(rec.error_counts(rows).items())[:top])


def read_preflight(folder: Path, root: Path) -> Run:
    doc = read_json_checked(folder / "preflight.json", (rec.PREFLIGHT_SCHEMA,)) or {}
    run = Run(folder=_rel(folder, root), kind="preflight", link=_rel(folder / "preflight.json", root),
              date=_iso(doc.get("started")), experiment=doc.get("experiment"),
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
              date=_iso(doc.get("created")), experiment="micro benchmark of build_attn_metadata's variants",
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


# ----------------------------------------------------------------------------------------------- HTML

CSS = render.CSS + """
.filters{display:flex;gap:14px;align-items:center;flex-wrap:wrap;font-size:13px;margin:8px 0}
.filters select{font-size:13px;padding:2px 4px}
td .lvl{white-space:nowrap}
.st{font-weight:600}.st-complete{color:#1f9d55}.st-running{color:#3b6ea8}.st-unreadable,.st-failed,
.st-failed_checks{color:#d64545}.st-interrupted,.st-partial{color:#c98a06}
.tag{display:inline-block;font-size:11px;padding:1px 6px;border-radius:8px;margin:1px 2px;background:#eef1f5}
.tag.sim{background:#fff3cd;color:#6b4e00;font-weight:700}.tag.gpu{background:#e3f4ea;color:#17693b}
.tag.cpu{background:#e8f0fe;color:#1a3d66}.tag.bad{background:#fde2e2;color:#7a1616}
.live{border-left:5px solid #3b6ea8}
.bar{background:#e6e9ee;border-radius:4px;height:10px;margin:6px 0;overflow:hidden}
.bar div{background:#3b6ea8;height:10px}
.small{font-size:12px;color:#5b6b7c}
.changed{color:#8e44ad;font-weight:700}
"""

SCRIPT = """
(function(){
  var keys = ['exp', 'backend', 'kind'];
  function state(){ var s = {}; keys.forEach(function(k){ var e = document.getElementById('f-' + k);
    s[k] = e ? e.value : ''; }); return s; }
  function apply(s){
    keys.forEach(function(k){ var e = document.getElementById('f-' + k); if (e && s[k] !== undefined) e.value = s[k]; });
    var shown = 0, all = 0;
    document.querySelectorAll('[data-kind]').forEach(function(el){
      var ok = keys.every(function(k){ return !s[k] || el.getAttribute('data-' + k) === s[k]; });
      el.style.display = ok ? '' : 'none';
      if (el.tagName === 'TR') { all++; if (ok) shown++; }
    });
    var c = document.getElementById('shown'); if (c) c.textContent = shown + ' of ' + all + ' runs shown';
    var h = keys.map(function(k){ return s[k] ? k + '=' + encodeURIComponent(s[k]) : ''; })
      .filter(Boolean).join('&');
    if (location.hash.slice(1) !== h) history.replaceState(null, '', h ? '#' + h : location.pathname);
  }
  function fromHash(){ var s = {}; location.hash.slice(1).split('&').forEach(function(p){
    var kv = p.split('='); if (kv.length === 2) s[kv[0]] = decodeURIComponent(kv[1]); }); return s; }
  function ages(){ document.querySelectorAll('[data-t]').forEach(function(el){
    var age = Date.now() / 1000 - parseFloat(el.getAttribute('data-t'));
    el.textContent = 'updated ' + Math.max(0, Math.round(age)) + ' s ago' + (age > STALE ?
      ': no update for ' + Math.round(age / 60) + ' min, the runner may have stopped' : ''); }); }
  function wire(){ keys.forEach(function(k){ var e = document.getElementById('f-' + k);
    if (e) e.addEventListener('change', function(){ apply(state()); }); }); }
  wire(); apply(fromHash()); ages();
  var last = null;  // the page's main part as last fetched: swapped in only when it changed (open details stay open)
  if (location.protocol.indexOf('http') === 0) {
    setInterval(function(){
      fetch(location.pathname, {cache: 'no-store'}).then(function(r){ return r.text(); }).then(function(t){
        var s = state(); var doc = new DOMParser().parseFromString(t, 'text/html');
        var m = doc.querySelector('main'); if (!m || m.innerHTML === last) return;
        last = m.innerHTML; document.querySelector('main').innerHTML = last; wire(); apply(s); ages();
        document.body.setAttribute('data-refreshed', String(Date.now()));
      }).catch(function(){ var e = document.getElementById('shown');
        if (e) e.textContent += ' (the dashboard server stopped answering)'; });
    }, REFRESH * 1000);
    setInterval(ages, 1000);
  }
})();
"""


def _esc(x) -> str:
    return html.escape("" if x is None else str(x))


def _attrs(r: Run | History, kind: str, backend: str) -> str:
    key = r.experiment_key if isinstance(r, Run) else r.key
    return f" data-kind='{_esc(kind)}' data-backend='{_esc(backend)}' data-exp='{_esc(key or '')}'"


def _status_cell(r: Run) -> str:
    out = [f"<span class='st st-{_esc(r.status.replace(' ', '_'))}'>{_esc(r.status)}</span>"]
    if r.error:
        out.append(f"<div class='no'>{_esc(r.error)}</div>")
    if r.invalid:
        out.append(f"<details><summary class='no'>{len(r.invalid)} invalid window(s)</summary><ul>"
                   + "".join(f"<li>{_esc(x)}</li>" for x in r.invalid) + "</ul></details>")
    out += [f"<div class='small'>{_esc(n)}</div>" for n in r.notes if n]
    return "".join(out)


def _levels_cell(r: Run) -> str:
    if not r.levels:
        return page.DASH
    rows = [f"<div class='lvl'>c={_esc(lv.level)}: <b class='k-{_esc(lv.kind)}'>{_esc(lv.word)}</b> "
            f"{_esc(page._r(lv.ratio))} {_esc(page._ci(lv.ci))}</div>" for lv in r.levels]
    return f"<div class='small'>{_esc(r.metric)}, B/A</div>" + "".join(rows)


def _link(text: str, href: str | None) -> str:
    return _esc(text) if not href else f"<a href='{_esc(href)}'>{_esc(text)}</a>"


def _row(r: Run) -> str:
    design = page.DASH if not r.design else f"{r.design}" + (f" (unit: {r.unit})" if r.unit else "")
    exp = _esc(r.experiment or page.DASH) + (f"<div class='small'>{_esc(r.arms)}</div>" if r.arms else "") + \
        (f"<div class='small'>scenario {_esc(r.scenario)}</div>" if r.scenario else "")
    links = [_link(t, h) for t, h in r.links] or \
        [_link("report" if (r.link or "").endswith("index.html") else "files", r.link)]
    rev = f"<div class='small'>git {_esc((r.git or '')[:10])}</div>" if r.git else ""
    srv = f"<div class='small'>{_esc(r.server)}</div>" if r.server else ""
    return (f"<tr{_attrs(r, r.kind, r.backend)}><td>{_esc(r.date or page.DASH)}</td><td>{_esc(r.kind)}</td>"
            f"<td><span class='tag {_esc(r.backend)}'>{_esc(r.backend_words)}</span>{srv}</td><td>{exp}</td>"
            f"<td>{_esc(design)}</td><td>{_levels_cell(r)}</td><td>{_status_cell(r)}</td>"
            f"<td><b>{_esc(r.folder)}</b>{rev}<div>{' · '.join(links)}</div></td></tr>")


def _live_section(r: Run) -> str:
    lv = r.live or {}
    p = lv.get("progress")
    parts = [f"<section class='live'{_attrs(r, r.kind, r.backend)}><h2>Running: {_esc(r.folder)} — "
             f"{_esc(r.experiment)} ({_esc(r.arms)}) on {_esc(r.backend_words)}</h2>"]
    if p is None:
        w = lv.get("windows") or {}
        parts.append(f"<p>No progress.json (a runner without it): windows so far "
                     f"{_esc(', '.join(f'{v} {k}' for k, v in w.items()) or 'none')} of "
                     f"{lv.get('windows_planned')} planned.</p>")
    else:
        done = p["rounds_done"] / max(p["rounds_planned"], 1)
        if p.get("window") and p.get("length_s"):  # the windows run so far, this one by its clock
            done = (p["window"] - 1 + min(1.0, (p.get("elapsed_s") or 0.0) / p["length_s"])) / p["windows_planned"]
        parts.append(f"<div class='bar' title='windows run, of those planned'><div style='width:{100 * done:.0f}%'>"
                     "</div></div>")
        where = page.DASH if p.get("window") is None else (
            f"window {p['window']}/{p['windows_planned']} {p['block_id']} (round {p['round']}, "
            f"{(p.get('kind') or '').upper()}, arm {p['arm']} = {p['label']})")
        phase = {"starting": "starting its server", "look": "sequential look after the round",
                 "ended": f"run ended ({p['status']})"}.get(p["state"]) or (
            f"c={p['level']} {p['phase']}" if p.get("phase") else "finishing the window (Locust stops, the window is "
                                                                  "judged)")
        clock = "" if p.get("elapsed_s") is None or p["state"] != "load" else \
            f" · {p['elapsed_s']:.0f}/{p['length_s']:.0f} s of the window"
        left = "" if p.get("left_s") is None else f" · about {p['left_s'] / 60:.1f} min left"
        parts.append(f"<p class='progress'><b>rounds done {p['rounds_done']}/{p['rounds_planned']}</b> · "
                     f"{_esc(where)} · phase <b>{_esc(phase)}</b>{_esc(clock)}{_esc(left)} · "
                     f"<span class='small' data-t='{p['t']}'>updated at {_esc(_iso(p['t']))}</span></p>")
    looks = lv.get("looks") or []
    seq = lv.get("sequential")
    if seq or looks:
        parts.append(f"<p>Sequential looks ({len(looks)} so far; {seq.get('min_rounds') if seq else '?'}.."
                     f"{seq.get('max_rounds') if seq else '?'} A/B rounds):</p><ul>" + "".join(
                         f"<li>after {x['rounds']} round(s): {'STOP' if x['stop'] else 'continue'} — "
                         f"{_esc(x['reason'])}; {_esc(x['text'])}</li>" for x in looks) + "</ul>")
    if r.invalid:
        parts.append("<p class='no'>Invalid windows so far:</p><ul>" + "".join(f"<li>{_esc(x)}</li>"
                                                                                for x in r.invalid) + "</ul>")
    parts.append("</section>")
    return "".join(parts)


def _history_section(h: History, backend_key: str) -> str:
    labels = [f"{(x['date'] or '?')[:10]} {x['folder'].rsplit('/', 1)[-1][-16:]}" for x in h.runs]
    fig = plots.plot_history(f"{h.experiment}: B/A per level over its runs", h.levels,
                             [{"label": lab, "levels": x["levels"]} for lab, x in zip(labels, h.runs, strict=True)],
                             h.margin_pct)
    head = ["run", "date", "git", "server", "status"] + [f"c={lv}" for lv in h.levels]
    rows = []
    for x in h.runs:
        cells = [_link(x["folder"], x["link"]), _esc(x["date"] or page.DASH), _esc((x["git"] or page.DASH)[:10]),
                 _esc(x["server"] or page.DASH), _esc(x["status"])]
        for lv in h.levels:
            p = x["levels"].get(lv)
            if not p:
                cells.append(page.DASH)
                continue
            mark = "" if not p["changed"] else \
                f" <span class='changed'>changed {'↑' if p['direction'] == 'up' else '↓'}</span>"
            cells.append(f"<span class='k-{_esc(p['kind'])}'>{_esc(p['word'])}</span> {_esc(page._r(p['ratio']))} "
                         f"{_esc(page._ci(p['ci']))}{mark}")
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f"<section class='history'{_attrs(h, 'A/B', backend_key)}><h2>History: {_esc(h.experiment)}</h2>"
            f"<p>{_esc(h.arms)} · scenario {_esc(h.scenario)} · {_esc(h.backend)} · {len(h.runs)} run(s). A change "
            "between two runs is marked only where their intervals (each as its run's verdict card shows it) do "
            "not overlap.</p>" + fig +
            "<table><tr>" + "".join(f"<th>{_esc(x)}</th>" for x in head) + "</tr>" + "".join(rows) + "</table>"
            "</section>")


def _options(ident: str, label: str, values: list[tuple[str, str]]) -> str:
    opts = "".join(f"<option value='{_esc(v)}'>{_esc(t)}</option>" for v, t in values)
    return f"<label>{_esc(label)} <select id='f-{ident}'><option value=''>all</option>{opts}</select></label>"


def html_page(d: Dashboard) -> str:
    runs = d.runs
    bad = [r for r in runs if r.error]
    exps = sorted({(r.experiment_key, f"{r.experiment} ({Path(r.scenario or '?').stem})") for r in runs
                   if r.experiment_key}, key=lambda x: x[1])
    backends = sorted({(r.backend, r.backend_words.split(" (")[0]) for r in runs})
    kinds = [(k, k) for k in (*KINDS, "unknown") if any(r.kind == k for r in runs)]
    by_key = {r.experiment_key: r.backend for r in runs if r.experiment_key}
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width,initial-scale=1'><link rel='icon' href='data:,'>",
             f"<title>tts-loadtest dashboard — {len(runs)} runs</title><style>{CSS}</style></head><body><main>",
             "<h1>tts-loadtest: every run in one page</h1>",
             f"<div class='sub'>{len(runs)} run folder(s) under {_esc(Path(d.root).name)}/ · built from the run "
             "folders' own files (manifest, windows, statistics) · each run's full evidence is its own report "
             "(the link in the last column) · SIMULATED runs come from the ttssim simulator, not a real server</div>"]
    for r in bad:
        parts.append(f"<div class='banner invalid'>UNREADABLE RUN {_esc(r.folder)}: {_esc(r.error)}</div>")
    for r in runs:
        if r.live is not None:
            parts.append(_live_section(r))
    parts.append("<div class='filters'>" + _options("exp", "experiment", exps) + _options("backend", "backend",
                                                                                      backends)
                 + _options("kind", "kind", kinds) + "<span id='shown' class='small'></span></div>")
    parts.append("<section><h2>Runs</h2><table><tr><th>date (UTC)</th><th>kind</th><th>backend</th>"
                 "<th>experiment and arms</th><th>design (unit)</th><th>primary headline per level [interval]"
                 "</th><th>status</th><th>folder</th></tr>" + "".join(_row(r) for r in runs) + "</table>"
                 "<div class='legend'>Headline: the run's primary metric per concurrency level, B/A with the interval "
                 "behind its decision, exactly as its report's verdict cards show it. Status: complete, partial (a "
                 "planned window has no result), interrupted, running, failed; invalid windows are excluded from "
                 "the statistics and listed.</div></section>")
    for h in d.histories:
        parts.append(_history_section(h, by_key.get(h.key, "unknown")))
    parts.append(f"</main><script>var REFRESH = {REFRESH_S}, STALE = {STALE_S};{SCRIPT}</script></body></html>\n")
    return "".join(parts)


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
