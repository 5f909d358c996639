"""The dashboard's page: one self-contained HTML file from the model dashboard.py reads (every run folder, its
history per experiment, the live view of a running run); filters and the change marks run in the page itself.
"""

from __future__ import annotations

import html
from pathlib import Path

from . import page, plots, render
from .board import KINDS, Dashboard, History, Run, iso_time

REFRESH_S = 5  # the served page re-reads itself this often
STALE_S = 120  # a running run whose progress.json is older than this is flagged (the runner may have been killed)

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
                     f"<span class='small' data-t='{p['t']}'>updated at {_esc(iso_time(p['t']))}</span></p>")
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
