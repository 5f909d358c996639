"""The import rules of docs/architecture.md, checked on the syntax trees of the code (nothing is imported or run).

Data flows one way: configs -> load -> raw files -> statistics -> report. tts_predictor (the code under test) uses no
other package of ours; ttsrecords (the on-disk contract: records, run settings, metric table, sample keys) builds on
tts_predictor's plain names only; ttssim and loadtest build on tts_predictor and ttsrecords; ttsreport reads the raw
files through ttsrecords and the fitted simulator model and never imports loadtest; the real CPU server
(cpu_server/serve.py and its plugin) is a process to the rest: it builds on tts_predictor's plain names and
ttsrecords.cpuserver, and no other package imports it; no product package uses tools/ (benchmarks, soak, fakes), and
the A/B command line stays light (no numpy, scipy, torch or ttsreport behind `import loadtest.ab`). Every module
counts, sub-folders included.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from conftest import ROOT

OURS = ("tts_predictor", "ttsrecords", "ttssim", "loadtest", "ttsreport", "cpu_server", "tts_omni_cpu", "tools",
        "tests")
PRODUCT = ("tts_predictor", "ttsrecords", "ttssim", "loadtest", "ttsreport", "cpu_server")
# cpu_server/plugin is a distribution of its own (tts-omni-cpu), installed into the real server's venv and imported
# there as tts_omni_cpu. Its modules are scanned under that name, as a package with its own rule (ALLOWED): they run
# in that venv (vLLM's processes, the tiny model's builder), where not all of our packages are installed.
PLUGIN = ROOT / "cpu_server" / "plugin"
CPU_SERVER = ("cpu_server", "tts_omni_cpu")


def modules(package: str) -> dict[str, ast.Module]:
    return {".".join(p.relative_to(PLUGIN if p.is_relative_to(PLUGIN) else ROOT).with_suffix("").parts)
            .removesuffix(".__init__"): ast.parse(p.read_text()) for p in sorted((ROOT / package).rglob("*.py"))}


def imports(name: str, tree: ast.Module, top_level_only: bool = False) -> set[str]:
    """Absolute names of the modules `name` imports (relative imports resolved)."""
    package = name if name.count(".") == 0 else name.rsplit(".", 1)[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # imports under `if TYPE_CHECKING:` or try/except at module level still count
        nodes = [n for stmt in tree.body for n in ast.walk(stmt)
                 if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = package + ("." + base if base else "")
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


def ours(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in OURS}


ALL = {name: tree for pkg in (*PRODUCT, "tools") for name, tree in modules(pkg).items()}
# what each product package may import of ours (besides itself): every allowed edge, named
ALLOWED = {
    "tts_predictor": set(),
    # the contract: plain-Python names of the code under test (metric names, domain constants), nothing else
    "ttsrecords": {"tts_predictor.metrics", "tts_predictor.domain"},
    "ttssim": {"tts_predictor", "ttsrecords"},
    # experiment files validate a simulator arm's settings (loadtest.experiment) and read its audio length
    # (loadtest.evidence); the planner predicts request lengths by replaying an arm's simulator stand-in in virtual
    # time (loadtest.window_fit: pure arithmetic, no server; imported when planning)
    "loadtest": {"tts_predictor", "ttsrecords", "ttssim.config", "ttssim.virtual", "ttssim.audio"},
    # the contract; ttssim.fit is the fitted simulator model (pure arithmetic, no server) whose predicted difference
    # the report shows beside the observed one, with the modules it needs
    "ttsreport": {"tts_predictor", "ttsrecords", "ttssim.fit", "ttssim.config", "ttssim.virtual", "ttssim.public",
                  "ttssim.model", "ttssim.heldout"},  # heldout: the banner's held-out figure
    # serve.py, a script the suite starts as a process: the code under test's plain names, what it and the suite
    # agree on (ttsrecords.cpuserver, standard library only) and its own plugin (put on its sys.path)
    "cpu_server": {"tts_predictor.domain", "ttsrecords.cpuserver", "tts_omni_cpu"},
    # the plugin in the real server's venv: the tiny model's audio constants; 0.30.0's venv holds a copy of
    # tts_predictor and nothing else of ours (cpu_server/venv.sh)
    "tts_omni_cpu": {"tts_predictor.domain"},
}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_product_packages_import_only_what_the_flow_allows(package):
    bad = {}
    for name, tree in ALL.items():
        if name.split(".")[0] != package:
            continue
        for imp in ours(imports(name, tree)):
            head = imp.split(".")[0]
            if head == package:
                continue
            if not any(imp == a or imp.startswith(a + ".") or (a.startswith(imp + ".") and "." not in a[len(imp) + 1:])
                       for a in ALLOWED[package]):
                bad.setdefault(name, []).append(imp)
    assert not bad, bad


@pytest.mark.parametrize("name", sorted(n for n in ALL if n.startswith("ttsrecords")))
def test_the_contract_is_standard_library_only(name):
    names = imports(name, ALL[name])
    third_party = {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - set(OURS) - {"__future__"}
    assert not third_party, third_party


def test_the_cpu_server_is_reached_only_as_a_process():
    """No other product package imports cpu_server/serve.py or its plugin, neither by an import statement nor by a
    path put on sys.path or loaded from a file: the suite passes serve.py flags and reads its exit status."""
    loaders = {"insert", "append", "extend", "spec_from_file_location", "run_path", "import_module", "SourceFileLoader"}
    found = {}
    for name, tree in ALL.items():
        if name.split(".")[0] in CPU_SERVER or name.split(".")[0] not in PRODUCT:
            continue
        bad = {imp for imp in ours(imports(name, tree)) if imp.split(".")[0] in CPU_SERVER}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in loaders:
                bad |= {f"{node.func.attr}({c.value!r})" for arg in node.args for c in ast.walk(arg)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        and any(s in c.value for s in CPU_SERVER)}
        if bad:
            found[name] = sorted(bad)
    assert not found, found


def test_the_report_never_imports_the_load_generator():
    users = {name for name, tree in ALL.items() if name.startswith("ttsreport")
             for imp in ours(imports(name, tree)) if imp.split(".")[0] == "loadtest"}
    assert not users, users


@pytest.mark.parametrize("module,allowed", [("ttsrecords.runsettings", {"ttsrecords.windows"}),
                                            ("ttsrecords.windows", set())])
def test_the_run_settings_and_the_plan_are_standard_library_only(module, allowed):
    names = imports(module, ALL[module])
    mine = {n for n in ours(names) if not any(n == a or n.startswith(a + ".") for a in allowed)}
    assert not mine, mine
    rest = {n.split(".")[0] for n in names if n not in ours(names)}
    assert rest <= set(sys.stdlib_module_names) | {"__future__"}, names


def _closure(start: str) -> set[str]:
    """Modules of ours that importing `start` executes (module-level imports, transitively)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b runs a/__init__ first
            todo.append(".".join(parts[:i]))
        if name in ALL:
            todo += [n for n in ours(imports(name, ALL[name], top_level_only=True)) if n in ALL or n in OURS]
    return seen


def test_import_loadtest_ab_pulls_in_no_statistics_and_no_torch():
    closure = _closure("loadtest.ab")
    assert {"loadtest.plan", "loadtest.runner", "ttsrecords.records"} <= closure
    assert not {n for n in closure if n.startswith(("ttsreport", "ttssim", "tools"))}, closure
    third_party = {i.split(".")[0] for n in closure if n in ALL for i in imports(n, ALL[n], top_level_only=True)}
    assert not third_party & {"scipy", "numpy", "torch", "matplotlib"}, third_party


def test_schema_ids_are_spelled_once():
    """Every record schema id is a string in ttsrecords/records.py only; the code uses its name (the tests pin the
    values themselves, as the documented format)."""
    pattern = re.compile(r"^tts-(request|counters|run|ab|block|summary|comparison|micro|scenario)/\d+$")
    found = {}
    for pkg in (*PRODUCT, "tools"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value):
                    found.setdefault(str(p.relative_to(ROOT)), set()).add(node.value)
    assert set(found) == {"ttsrecords/records.py"}, found


DOMAIN_NAMES = re.compile(r"^(VARIANT_NAMES|DEFAULT_VARIANT|CALLS_PER_STEP|PREFILL_CALLS_PER_STEP|"
                          r"DECODE_CALLS_PER_STEP|SAMPLE_RATE(_HZ)?|SAMPLES_PER_CODEC_FRAME|CODEC_FRAME_RATE(_HZ)?|"
                          r"FRAMES_PER_AUDIO_S|BYTES_PER_SAMPLE|CHUNK_FRAMES|MODEL_NAME|DEFAULT_MODEL)$")


def test_domain_constants_are_defined_once():
    """tts_predictor/domain.py is the one place of these names: no other module assigns them."""
    defined = {}
    for name, tree in ALL.items():
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and DOMAIN_NAMES.match(t.id):
                    defined.setdefault(t.id, []).append(name)
    assert all(where == ["tts_predictor.domain"] for where in defined.values()), defined


def test_domain_names_match_the_code_under_test():
    from tts_predictor import domain
    from tts_predictor.variants import VARIANTS

    assert tuple(VARIANTS) == domain.VARIANT_NAMES and domain.DEFAULT_VARIANT in VARIANTS
    assert domain.CALLS_PER_STEP == 15 and domain.CODEC_FRAME_RATE_HZ == 12.5
    assert domain.SAMPLE_RATE_HZ == domain.SAMPLES_PER_CODEC_FRAME * domain.CODEC_FRAME_RATE_HZ


@pytest.mark.slow
def test_import_loadtest_ab_is_light_when_run():
    """The same as the closure test above, measured: what a fresh interpreter really imports."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", "import loadtest.ab"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in p.stderr.splitlines() if "|" in line}
    assert "loadtest" in loaded and not loaded & {"scipy", "numpy", "torch", "matplotlib", "ttsreport"}, loaded
