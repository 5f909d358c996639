"""The report dashboard: its page model on a folder of complete, interrupted, running and unreadable runs; the change
rule of the history; the runner's progress.json read back across the seam; the page in headless Chromium; and the
live server on 127.0.0.1 while a real simulator run writes its files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, listening_addresses

from loadtest import ab, plan, provenance, runner, scenario
from loadtest.scenario import load_scenario
from loadtest.shape import Schedule
from tools import browser
from ttsrecords import progress, records
from ttsrecords.runsettings import LOOK_LOG
from ttsreport import board as bd
from ttsreport import dashboard as dash
from ttsreport import dashpage

needs_chromium = pytest.mark.skipif(browser.find_chromium() is None, reason="chromium absent: scripts/system-deps.sh")
EXAMPLE = ROOT / "reports" / "example"
R1_A = next(EXAMPLE.glob("blocks/*-r1-ab-A")).name  # the example's round-1 window of arm A


def _copy_example(dst: Path, **manifest) -> Path:
    shutil.copytree(EXAMPLE, dst)
    man = json.loads((dst / "manifest.json").read_text())
    man.update(manifest)
    records.write_json(dst / "manifest.json", man)
    return dst


def _set_block(run: Path, block_id: str, **fields) -> None:
    path = run / "blocks" / block_id / "block.json"
    records.write_json(path, {**json.loads(path.read_text()), **fields})


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A reports/ folder: the example run (complete), the same run stopped in its last window before its statistics
    (interrupted), a later run of the same experiment whose c=64 interval moved and with an invalid window, and
    three folders that cannot be read."""
    root = tmp_path_factory.mktemp("reports")
    _copy_example(root / "ab-done", started="2026-12-01T21:26:11Z")  # the oldest of the folder's runs
    stopped = _copy_example(root / "ab-stopped", status="interrupted", started="2026-12-02T08:00:00Z",
                            run_id="ab-stopped")
    last = sorted(p.name for p in (stopped / "blocks").iterdir())[-1]  # the run's last window
    _set_block(stopped, last, status="interrupted", reason="SIGINT/SIGTERM during the window")
    for name in ("summary.json", "comparison.json", "summary.md", "index.html"):
        (stopped / name).unlink()
    later = _copy_example(root / "ab-later", started="2026-12-03T09:00:00Z", run_id="ab-later",
                          git_revision="feedc0de" * 5)
    _set_block(later, R1_A, status="invalid", reason="manipulation check failed: syncs 0 != expected 540")
    comp = json.loads((later / "comparison.json").read_text())  # a second run's statistics: c=64 lower, c=8 the same
    for lv, ratio, ci in (("64", 1.12, [1.10, 1.15]), ("8", 1.046, [1.040, 1.050])):
        row = comp["headline"]["levels"][lv]
        row.update(ratio=ratio, ci=ci, **({"ci_decision": ci} if "ci_decision" in row else {}))
    (later / "comparison.json").write_text(json.dumps(comp))
    (root / "ab-broken").mkdir()
    (root / "ab-broken" / "manifest.json").write_text("{not json")
    (root / "ab-future").mkdir()
    (root / "ab-future" / "manifest.json").write_text(json.dumps({"schema": "tts-ab/99"}))
    (root / "stray").mkdir()
    (root / "stray" / "notes.txt").write_text("not a run")
    return root


def test_a_folder_of_run_folders_lists_each_one(tmp_path):
    """reports/micro/<UTC>/ stands for its runs, a folder beside them that holds none included."""
    shutil.copytree(ROOT / "reports" / "micro", tmp_path / "micro")
    (tmp_path / "micro" / "half-written").mkdir()
    runs = {r.folder: r for r in bd.model(tmp_path).runs}
    (stamp,) = [p.name for p in (ROOT / "reports" / "micro").iterdir()]
    assert set(runs) == {f"micro/{stamp}", "micro/half-written"}
    assert runs[f"micro/{stamp}"].kind == "benchmark" and runs[f"micro/{stamp}"].backend == "cpu"
    assert runs["micro/half-written"].status == "unreadable"


def test_a_folder_of_pages_with_run_folders_lists_the_pages_and_each_run(tmp_path):
    """reports/vllm-cpu/: its README is a page and every A/B run beside it is a row of its own."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "README.md").write_text("# runs\n")
    shutil.copytree(ROOT / "reports" / "example", tmp_path / "cpu" / "ab-1")
    (tmp_path / "cpu" / "half-written").mkdir()
    runs = {r.folder: r for r in bd.model(tmp_path).runs}
    assert set(runs) == {"cpu", "cpu/ab-1", "cpu/half-written"}
    assert runs["cpu"].kind == "benchmark" and runs["cpu/ab-1"].kind == "A/B" and runs["cpu/ab-1"].levels
    assert runs["cpu/half-written"].status == "unreadable"


@pytest.fixture(scope="module")
def board(folder) -> bd.Dashboard:
    return bd.model(folder)


def _run(board: bd.Dashboard, name: str) -> bd.Run:
    (r,) = [r for r in board.runs if r.folder == name]
    return r


def test_every_folder_is_a_row_newest_first(board, folder):
    assert sorted(r.folder for r in board.runs) == sorted(p.name for p in folder.iterdir() if p.is_dir())
    dated = [r.date for r in board.runs if r.date]
    assert dated == sorted(dated, reverse=True) and dated[0] == "2026-12-03T09:00:00Z"


def test_a_complete_run_as_its_report_says(board, folder):
    r = _run(board, "ab-done")
    assert (r.kind, r.backend, r.backend_words, r.status) == ("A/B", "sim", "SIMULATED", "complete")
    assert (r.design, r.unit, r.experiment) == ("swap", "round", "mission-016-original-vs-fixed")
    assert r.arms == "A: original · B: fixed" and r.metric == "audio throughput" and not r.invalid
    assert r.link == "ab-done/index.html" and (folder / r.link).is_file()
    assert r.git == json.loads((EXAMPLE / "manifest.json").read_text())["git_revision"]
    assert r.server == "ttssim (tts-loadtest 0.1.0)"
    # the example's own report: its cards in summary.md ("- c=8: **faster** B/A ×1.045 [1.042, 1.048] ...")
    cards = re.findall(r"^- c=(\d+): \*\*(.+?)\*\* B/A ×([\d.]+) \[([\d.]+), ([\d.]+)\]",
                       (EXAMPLE / "summary.md").read_text(), re.M)
    assert len(cards) == 2 and {c[1] for c in cards} <= {"faster", "faster in this server start"}, cards
    got = [(lv.level, lv.word, f"{lv.ratio:.3f}", f"{lv.ci[0]:.3f}", f"{lv.ci[1]:.3f}") for lv in r.levels]
    assert got == [tuple(c) for c in cards]


def test_an_interrupted_run_without_statistics(board):
    r = _run(board, "ab-stopped")
    assert r.status == "interrupted" and r.levels == [] and r.link == "ab-stopped/"
    assert any("no statistics yet (make report RUN=" in n for n in r.notes)
    assert r.experiment_key == _run(board, "ab-done").experiment_key  # same arms and scenario: one experiment


def test_a_sequential_run_shows_where_its_looks_stopped_it(tmp_path):
    """The runner's look log under its own key (and, for folders written before it had one, under "sequential")."""
    stopped = {"looks": 3, "look_errors": [], "ignored_stops": [],
               "stopped": {"after_round": 4, "ab_rounds": 4, "reason": "every level decided"}}
    _copy_example(tmp_path / "new", **{LOOK_LOG: stopped})
    _copy_example(tmp_path / "old", sequential={"looks": 2, "look_errors": [], "ignored_stops": []})
    board = bd.model(tmp_path)
    assert "sequential: stopped after 4 A/B rounds (every level decided)" in _run(board, "new").notes
    assert "sequential: 2 look(s), no stop" in _run(board, "old").notes


def test_invalid_windows_are_listed(board):
    r = _run(board, "ab-later")
    assert r.status == "complete"
    assert r.invalid == [f"{R1_A}: manipulation check failed: syncs 0 != expected 540"]


def test_unreadable_folders_are_listed_with_the_reason(board):
    broken, future, stray = (_run(board, n) for n in ("ab-broken", "ab-future", "stray"))
    assert broken.status == future.status == stray.status == "unreadable"
    assert "not JSON" in broken.error and "manifest.json" in broken.error
    assert "unknown schema 'tts-ab/99'" in future.error
    assert "no manifest.json, preflight.json, results.json or report page" in stray.error


def test_a_locust_run_folder(tmp_path):
    """A folder the locustfile wrote (a window of the version-1 fixture run: its tts-run manifest and requests)."""
    shutil.copytree(ROOT / "tests" / "fixtures" / "v1-run" / "blocks" / "000-r0-aa-B", tmp_path / "locust-1")
    (r,) = bd.model(tmp_path).runs
    man = json.loads((tmp_path / "locust-1" / "manifest.json").read_text())
    assert (r.kind, r.status, r.backend_words, r.arms) == ("Locust", "complete", "not recorded", man["variant"])
    assert r.date.startswith("2026-11-30T") and r.link == "locust-1/" and r.levels == []
    assert f"{man['requests_lines']} request records" in r.notes


def test_backend_words(tmp_path):
    for name in ("vllm", "vllm-cpu", "sim"):
        _copy_example(tmp_path / name, backend={"name": name, "version": "x"})
    _copy_example(tmp_path / "odd", backend={"name": "tpu"})
    got = {r.folder: (r.backend, r.backend_words) for r in bd.model(tmp_path).runs}
    assert got["vllm"] == ("gpu", "real GPU") and got["vllm-cpu"] == ("cpu", "real server on CPU")
    assert got["sim"] == ("sim", "SIMULATED") and got["odd"][0] == "unknown" and "tpu" in got["odd"][1]


@pytest.mark.parametrize("a, b, moved", [
    ([1.0, 1.1], [1.2, 1.3], True), ([1.2, 1.3], [1.0, 1.1], True),  # disjoint either way
    ([1.0, 1.2], [1.1, 1.3], False), ([1.0, 1.2], [1.2, 1.3], False),  # overlapping, touching
    ([1.0, 1.3], [1.1, 1.2], False), (None, [1.2, 1.3], False), ([1.0, 1.1], None, False)])
def test_the_change_rule(a, b, moved):
    assert bd.changed(a, b) is moved


def test_history_marks_only_disjoint_intervals(board):
    (h,) = board.histories
    assert [x["folder"] for x in h.runs] == ["ab-done", "ab-later"] and h.levels == ["8", "64"]
    c64, c8 = h.runs[1]["levels"]["64"], h.runs[1]["levels"]["8"]
    assert c64["changed"] and c64["direction"] == "down" and not c8["changed"]
    assert h.runs[1]["git"] == "feedc0de" * 5 and h.runs[0]["server"] == "ttssim (tts-loadtest 0.1.0)"


def test_page_is_self_contained_and_a_pure_function_of_the_folders(folder, board):
    page = dashpage.html_page(board)
    assert page == dashpage.html_page(bd.model(folder))
    assert not re.search(r"(src|href)=['\"]https?://", page) and "fetch(location.pathname" in page
    assert "UNREADABLE RUN ab-broken" in page and "changed ↓" in page and page.count("<tr data-kind") == 6
    out = dash.write(folder, folder / "dash.html")
    assert out.read_text() == page


def test_serving_refuses_any_address_but_loopback(folder, capsys):
    assert dash.main([str(folder), "--serve", "--bind", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "127.0.0.1 only" in err
    assert dash.main([str(folder / "nothing")]) == 2 and "is not a folder" in capsys.readouterr().err


@pytest.mark.slow
def test_make_dashboard_lists_every_committed_run_folder_and_leaves_the_checkout_clean():
    """`make dashboard` as the README shows it: reports/index.html names every run folder the repository commits
    (.gitignore's exceptions under reports/), and the page it writes is not a tracked file, so a user's checkout shows
    no change after it."""
    p = subprocess.run(["make", "-s", "dashboard"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("reports/index.html"), p.stderr[-2000:]
    page = (ROOT / "reports" / "index.html").read_text()
    committed = re.findall(r"^!/reports/([^/\s]+)/$", (ROOT / ".gitignore").read_text(), re.M)
    assert {"example", "bench", "micro"} <= set(committed)
    folders = [f.relative_to(ROOT / "reports").as_posix() for f in bd.run_folders(ROOT / "reports")]
    for f in folders:
        if f.split("/")[0] in committed:
            assert f"<b>{f}</b>" in page, f
    assert "<b>example</b>" in page and "<b>bench</b>" in page
    if (ROOT / ".git").exists():
        tracked = subprocess.run(["git", "ls-files", "reports/index.html"], cwd=ROOT, capture_output=True, text=True)
        assert tracked.stdout == ""
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "reports"], cwd=ROOT,
                                 capture_output=True, text=True)
        assert changed.stdout == "", changed.stdout


def _running(root: Path, monkeypatch) -> tuple[runner.Runner, dict]:
    """A planned run under root whose runner is at its first window (status running), as the runner leaves it."""
    monkeypatch.setattr(provenance, "_run_quiet", lambda cmd, timeout=5.0: None)
    a = ab.parse_args(["--out", str(root), "--name", "ab-live", "--sim-config", "configs/sim/fast.yaml",
                       "--levels", "4,8", "--count-s", "1", "--rounds", "2", "--aa-rounds", "0", "--seed", "5"])
    run, manifest = plan.new_run(a)
    r = runner.Runner(run, manifest, progress=lambda line: None)
    r.log.status = "running"
    r._save()
    w = r.plan[0]
    scen = scenario.window_scenario(r.scenario, w.order, root.parent / f"{root.name}-w.yaml", count=True)
    r.schedule = Schedule(load_scenario(str(scen)), count=True)
    return r, w


def test_progress_written_by_the_runner_reads_back(tmp_path, monkeypatch):
    """The seam: the runner's own write_progress (through show, as during a window's load), the dashboard's reader;
    a window the runner judged invalid shows at once."""
    r, w = _running(tmp_path, monkeypatch)
    r.show(0, w, 1.5, r.window_s)
    live = _run(bd.model(tmp_path), "ab-live")
    assert live.status == "running"
    p = live.live["progress"]
    expected = r.schedule.at(1.5)
    assert (p["state"], p["window"], p["block_id"], p["rounds_done"], p["rounds_planned"]) == \
        ("load", 1, w.block_id, 0, 2)
    assert (p["level"], p["phase"]) == (expected.concurrency, expected.phase) == (w.levels[0], "warmup")
    assert p["left_s"] > 0 and p["windows_planned"] == len(r.plan)
    page = dashpage.html_page(bd.model(tmp_path))
    assert "Running: ab-live" in page and "rounds done 0/2" in page and f"c={w.levels[0]} warmup" in page
    assert "Invalid windows so far" not in page
    bdir = r.run / "blocks" / w.block_id
    bdir.mkdir(parents=True)
    records.write_json(bdir / "block.json", records.BlockRecord(
        block_id=w.block_id, round=0, kind="ab", arm=w.arm, variant=w.variant, status="invalid",
        reason="all 12 measure-phase requests failed: http 503 (12)").to_dict())
    page = dashpage.html_page(bd.model(tmp_path))
    assert f"Invalid windows so far:</p><ul><li>{w.block_id}: all 12 measure-phase requests failed" in page


def test_a_progress_file_of_another_format_is_refused(tmp_path):
    (tmp_path / progress.PROGRESS_FILE).write_text(json.dumps({"schema": "tts-progress/0", "state": "load"}))
    with pytest.raises(ValueError, match="unknown schema"):
        progress.read_progress(tmp_path)


# ----------------------------------------------------------------------------------------------- slow


COUNT_ROWS = "[...document.querySelectorAll('tr[data-kind]')].filter(r => r.style.display !== 'none').length"


def _choose(select: str, value: str) -> str:
    return (f"(() => {{ const e = document.getElementById('f-{select}'); e.value = '{value}'; "
            f"e.dispatchEvent(new Event('change')); return {COUNT_ROWS}; }})()")


@pytest.mark.slow
@needs_chromium
def test_the_page_in_headless_chromium(folder, board, tmp_path):
    page = dash.write(folder, folder / "index.html")
    key = _run(board, "ab-done").experiment_key
    res = browser.inspect(page, tmp_path / "dash.png", evaluate=(
        COUNT_ROWS,
        "[...document.querySelectorAll('tr[data-kind] td:nth-child(7) .st')].map(e => e.textContent).sort()",
        "document.querySelector('tr[data-kind] td:nth-child(6)').innerText",
        _choose("kind", "A/B"), _choose("backend", "sim"), _choose("exp", key),
        "[...document.querySelectorAll('section.history')].filter(s => s.style.display !== 'none').length + ':' "
        "+ location.hash",
        _choose("exp", ""), _choose("backend", ""), _choose("kind", "")))
    assert res["problems"] == []
    assert any("UNREADABLE RUN ab-future" in b and "unknown schema" in b for b in res["banners"])
    n, statuses, headline, ab_rows, sim_rows, exp_rows, hist, *_, back = res["evaluated"]
    assert n == back == 6
    assert statuses == ["complete", "complete", "interrupted", "unreadable", "unreadable", "unreadable"]
    assert re.search(r"c=8: faster.* ×1\.046 \[1\.040, 1\.050\]", headline), headline
    assert re.search(r"c=64: faster.* ×1\.120 \[1\.100, 1\.150\]", headline), headline
    assert (ab_rows, sim_rows, exp_rows) == (5, 3, 3)  # unreadable A/B folders have no backend or experiment
    assert hist == f"1:#exp={key}&backend=sim&kind=A%2FB"
    assert res["svgs"] == 1 and all(w > 400 for w in res["svgSizes"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_preflight_folder(tmp_path):
    """What `make preflight` writes on the simulator, as a dashboard row."""
    p = subprocess.run([sys.executable, "-m", "loadtest.preflight", "--backend", "sim", "--variant", "original",
                        "--out", str(tmp_path / "preflight-1")], cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (r,) = bd.model(tmp_path).runs
    assert (r.kind, r.backend_words, r.status, r.arms) == ("preflight", "SIMULATED", "complete", "original")
    assert r.link == "preflight-1/preflight.json" and " pass" in r.notes[0] and r.date


@pytest.mark.slow
@needs_chromium
@pytest.mark.timeout(240)
def test_the_served_page_refreshes_itself_in_chromium(tmp_path, monkeypatch):
    """In a browser the served page re-reads itself: the progress the runner keeps writing shows without a reload,
    and the filter chosen before stays chosen."""
    root = tmp_path / "reports"
    r, w = _running(root, monkeypatch)
    r.write_progress("load", 0, w, 1.0, r.window_s)
    _copy_example(root / "ab-done")
    server = subprocess.Popen([sys.executable, "-m", "ttsreport.dashboard", str(root), "--serve", "--port", "0"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()

    def runner_writes():  # a window's load goes on: a new elapsed time every second, as the runner writes it
        elapsed = 1.0
        while not done.wait(1.0):
            elapsed += 1.0
            r.write_progress("load", 0, w, elapsed, r.window_s)

    writer = threading.Thread(target=runner_writes)
    writer.start()
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/", server.stdout.readline()).group(0)
        wait = f"new Promise(ok => setTimeout(ok, {(dashpage.REFRESH_S + 3) * 1000}))"
        progress = "document.querySelector('.progress').textContent"
        res = browser.inspect(url, tmp_path / "live.png", evaluate=(
            progress, _choose("kind", "A/B"), wait, progress, COUNT_ROWS,
            "document.getElementById('f-kind').value + ' ' + document.body.hasAttribute('data-refreshed')"))
    finally:
        done.set()
        writer.join()
        server.terminate()
        server.wait(30)
    assert res["problems"] == []
    before, rows, _, after, rows_after, state = res["evaluated"]
    clock = re.compile(r"phase c=\d+ \w+ · (\d+)/\d+ s of the window")
    assert clock.search(before) and clock.search(after), (before, after)
    assert int(clock.search(after).group(1)) > int(clock.search(before).group(1)), (before, after)
    assert rows == rows_after == 2 and state == "A/B true"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_served_on_loopback_and_live_while_the_runner_writes(tmp_path):
    """The module serves on 127.0.0.1 only and its page follows a real sequential hot-swap run of the simulator (two
    rounds, a look after each) to its end."""
    root = tmp_path / "reports"
    root.mkdir()
    server = subprocess.Popen([sys.executable, "-m", "ttsreport.dashboard", str(root), "--serve", "--port", "0"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ab_run = None
    try:
        line = server.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert url, line
        assert listening_addresses(int(url.group(1))) == {"0100007F"}  # 127.0.0.1, nothing else
        assert "<tr data-kind" not in httpx.get(url.group(0), timeout=10).text
        ab_run = subprocess.Popen(
            [sys.executable, "-m", "loadtest.ab", "--a", "original", "--b", "fixed", "--design", "swap",
             "--until-decided", "--max-rounds", "2", "--min-rounds", "2", "--aa-rounds", "0", "--seed", "3",
             "--out", str(root), "--name", "live",
             "--sim-config", "configs/sim/fast.yaml", "--levels", "4,8", "--count-s", "1", "--warmup-s", "1",
             "--measure-s", "2", "--drain-s", "0", "--last-drain-s", "1", "--settle-s", "1"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: set[str] = set()
        windows: set[str] = set()
        rounds: set[str] = set()
        looks: set[str] = set()
        while ab_run.poll() is None:
            page = httpx.get(url.group(0), timeout=10).text
            m = re.search(r"<p class='progress'>(.*?)</p>", page)
            if "Running: live" in page and m:
                text = re.sub(r"<[^>]+>", "", m.group(1))
                phase = re.search(r"phase (c=\d+ \w+|starting its server|sequential look after the round)", text)
                seen.add(phase.group(1) if phase else text)
                windows |= set(re.findall(r"window (\d)/4", text))
                rounds |= set(re.findall(r"rounds done (\d/\d)", text))
                looks |= set(re.findall(r"<li>(after \d round\(s\): (?:continue|STOP))", page))
            time.sleep(0.3)
        out = ab_run.stdout.read()
        assert ab_run.returncode == 0, out
        assert windows == {"1", "2", "3", "4"} and {"0/2", "1/2"} <= rounds <= {"0/2", "1/2", "2/2"}, rounds
        assert {"starting its server", "sequential look after the round"} <= seen, seen
        assert {"c=4 count", "c=8 count"} & seen and {"c=4 measure", "c=8 measure"} & seen, seen
        assert "after 1 round(s): continue" in looks, looks  # the first look, shown while the second round ran
        final = httpx.get(url.group(0), timeout=10).text
        assert "Running: live" not in final and "<b>live</b>" in final
        assert "st-complete'>complete" in final and "live/index.html" in final
        assert httpx.get(url.group(0) + "live/index.html", timeout=10).status_code == 200
        assert progress.read_progress(root / "live").state == "ended"
    finally:
        for p in (ab_run, server):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(30)


def test_the_progress_file_is_the_documented_one():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    fields = re.search(r"`progress.json` \(`\"(tts-progress/\d+)\"`, `Progress`: `([^`]+)`", doc)
    assert fields and fields.group(1) == records.PROGRESS_SCHEMA
    names = [re.sub(r"\s*\(.*", "", f).strip() for f in re.sub(r"\([^)]*\)", "", fields.group(2)).split(",")]
    assert names == list(progress.PROGRESS_FIELDS)
