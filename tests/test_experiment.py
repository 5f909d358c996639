"""Experiment files (loadtest/experiment.py): loading, validation; dry runs through docker/serve.sh (loadtest/launch.py);
the evidence check (loadtest/evidence.py)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

from loadtest import experiment as ex
from loadtest.evidence import arm_manifest, check_evidence, describe
from loadtest.launch import STOP_GRACE_S, dry_run, images, server_launch
from tts_predictor import metrics as pm
from tts_predictor.domain import DEFAULT_VARIANT

FILES = sorted((ROOT / "configs/experiments").glob("*.yaml"))
SIM_FILE = ROOT / "configs/experiments/sim/mission-sim.yaml"
REV = "0123456789abcdef0123456789abcdef01234567"


def _runs(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line.startswith("docker run -d ")]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_every_experiment_dry_runs_to_docker_commands_on_loopback(path):
    exp = ex.load_experiment(path)
    out = dry_run(exp, port=18091, model_revision=REV)
    runs = _runs(out)
    assert len(runs) == len(exp.arms) >= 2
    for argv in runs:
        assert argv[argv.index("-p") + 1] == "127.0.0.1:18091:8091"
        assert "--user" in argv and argv[argv.index("--user") + 1].count(":") == 1
        assert f"snapshots/{REV}" in argv[argv.index("serve") + 1]
    assert out.count("docker stop -t 30 ") >= 2 * len(exp.arms)  # stale container + graceful stop per arm
    assert "docker rm -f" not in out
    for c in images(exp, REV):
        assert c.argv[:2] == ["bash", "docker/serve.sh"]


def test_the_set_of_experiments():
    exps = {p.name: ex.load_experiment(p) for p in FILES}
    assert ex.MISSION.split("/")[-1] in exps
    mission = exps[ex.MISSION.split("/")[-1]]
    assert [a.variant for a in mission.arms.values()] == ["original", "fixed"]
    assert {a.vllm_omni for a in mission.arms.values()} == {"0.16.0"}
    versions = {a.vllm_omni for e in exps.values() for a in e.arms.values()}
    assert {"0.30.0", "0.32.0rc1"} <= versions  # at least one experiment targets vllm-omni >= 0.30
    confounded = [e for e in exps.values() if len({a.vllm_omni for a in e.arms.values()}) > 1]
    assert confounded and all("differ" in e.confounded for e in confounded)


@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_release_vs_release_dry_run_says_confounded():
    exp = ex.load_experiment(ROOT / "configs/experiments/release-016-fixed-vs-030.yaml")
    out = dry_run(exp, model_revision=REV)
    assert "# CONFOUNDED: Release against release" in out
    steps = [c.what for c in images(exp, REV)]
    assert steps == ["pull vllm/vllm-omni:v0.16.0", "build tts-vllm-omni:0.16.0-fixed",
                      "pull vllm/vllm-omni:v0.30.0", "build tts-vllm-omni:0.30.0",
                      f"fetch Qwen/Qwen3-TTS-12Hz-0.6B-Base@{REV}"]


def test_images_are_prepared_once_per_image():
    exp = ex.load_experiment(ROOT / "configs/experiments/v030-runner-v1-vs-v2.yaml")
    cmds = images(exp, REV)
    assert [c.argv[2] for c in cmds] == ["--pull-only", "--build-only", "--fetch-model"]
    assert cmds[2].env["MODEL_REVISION"] == REV
    assert images(ex.load_experiment(SIM_FILE)) == []


def test_sim_only_file_and_simulated_stand_ins():
    exp = ex.load_experiment(SIM_FILE)
    assert exp.simulated and exp.backends == {"sim"}
    out = dry_run(exp)
    assert "SIMULATED" in out and "docker run" not in out and "serve.sh" not in out
    launch = server_launch(exp, exp.arms["B"], 0, port_file="/tmp/p")
    assert launch.simulated and launch.argv[1:4] == ["-m", "ttssim", "--variant"]
    assert launch.argv[launch.argv.index("--host") + 1] == "127.0.0.1"
    assert launch.argv[-2:] == ["--port-file", "/tmp/p"]
    for path in FILES:
        real = ex.load_experiment(path)
        sim = ex.simulated(real)
        assert sim.simulated and sim.backends == {"sim"}
        assert [a.label for a in sim.arms.values()] == [a.label for a in real.arms.values()]
        for arm in sim.arms.values():
            assert arm.simulated_from and arm.evidence.sync_signature == arm.sim.variant
        assert "docker run" not in dry_run(sim)


def test_mission_shorthand_for_make_ab():
    exp = ex.mission("fixed", "vectorized")
    a, b = exp.arms.values()
    assert (a.variant, a.label, a.evidence.sync_signature, a.sim.variant) == ("fixed",) * 4
    assert (b.variant, b.evidence.sync_signature) == ("vectorized", "vectorized")
    assert [r.image for r in exp.arms.values()] == ["tts-vllm-omni:0.16.0-fixed", "tts-vllm-omni:0.16.0-vectorized"]
    with pytest.raises(ex.ExperimentError, match="both 'original'"):
        ex.mission("original", "original")
    with pytest.raises(ex.ExperimentError, match="arms.A.variant: 'turbo'"):
        ex.mission("turbo", "fixed")


def test_server_launch_of_a_vllm_arm():
    exp = ex.load_experiment(ROOT / ex.MISSION)
    launch = server_launch(exp, exp.arms["A"], 18000, model_revision=REV, control_dir="/tmp/ctl")
    assert launch.argv == ["bash", "docker/serve.sh"] and not launch.simulated
    assert launch.env["VARIANT"] == DEFAULT_VARIANT and launch.env["STAGES"] == "qwen3_tts_b256.yaml"
    assert launch.env["CONTROL_DIR"] == "/tmp/ctl" and launch.env["MODEL_REVISION"] == REV
    assert launch.health_url == "http://127.0.0.1:18000/health"
    assert launch.stop_timeout_s > STOP_GRACE_S
    v030 = ex.load_experiment(ROOT / "configs/experiments/v030-runner-v1-vs-v2.yaml")
    with pytest.raises(ex.ExperimentError, match="control channel needs the plugin"):
        server_launch(v030, v030.arms["v1"], 18000, control_dir="/tmp/ctl")


# ----------------------------------------------------------------------------------------------- validation


def _mission_data() -> dict:
    return yaml.safe_load((ROOT / ex.MISSION).read_text())


def _set(d: dict, dotted: str, value):
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d[k]
    if value is _DEL:
        del d[keys[-1]]
    else:
        d[keys[-1]] = value


_DEL = object()
BAD = [
    ("schema", "tts-experiment/0", "(top level): schema must be"),
    ("primary_metric", "error_rate", "primary_metric: 'error_rate' is not one of"),
    ("scenario", "configs/scenarios/nope.yaml", "scenario: no such file"),
    ("design.rounds", 0, "design: rounds must be >= 1"),
    ("design.seed", "x", "design.seed: want int"),
    ("arms.B", _DEL, "arms: an experiment needs two or more arms"),
    ("arms.A.backend", "tgi", "arms.A: backend 'tgi' is not one of"),
    ("arms.A.vllm_omni", "0.28.0", "arms.A.vllm_omni: 0.28.0 has no image here"),
    ("arms.A.base_image", "vllm/vllm-omni:latest", "arms.A.base_image: want a pinned"),
    ("arms.A.base_image", "vllm/vllm-omni:v0.30.0", "arms.A.base_image: tag v0.30.0 does not match"),
    ("arms.A.variant", "turbo", "arms.A: variant 'turbo' is not one of"),
    ("arms.A.stages", "qwen3_tts_b999.yaml", "arms.A.stages: no such file"),
    ("arms.A.deploy", "qwen3_tts.yaml", "arms.A.deploy: vllm-omni 0.16.0 has no deploy files"),
    ("arms.A.server_args", ["--port", "9"], "arms.A.server_args[0]: --port is set by docker/serve.sh"),
    ("arms.A.env", {"BAD-NAME": 1}, "arms.A.env.BAD-NAME: not an environment variable name"),
    ("arms.A.evidence", _DEL, "arms.A.evidence: missing"),
    ("arms.A.evidence", {"log_absent": ["x"]}, "arms.A.evidence: no positive evidence"),
    ("arms.A.evidence.sync_signature", "fixed", "arms.A.evidence.sync_signature: fixed but the arm runs variant"),
    ("arms.A.evidence.log_present", ["("], "arms.A.evidence.log_present[0]: not a regular expression"),
    ("arms.A.sim", {"set": ["model.nope=1"]}, "arms.A.sim.set: unknown keys in section 'model'"),
    ("arms.A.colour", "red", "arms.A.colour: unknown key"),
    ("arms.B.label", "original", "arms: arm labels must differ"),
    ("arms.B.vllm_omni", "0.30.0", "arms.B.base_image: tag v0.16.0 does not match vllm_omni 0.30.0"),
    ("model.revision", "main", "model.revision: want the 40-hex commit"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[b[0] + "=" + str(b[1])[:20] for b in BAD])
def test_bad_files_fail_with_one_line_naming_file_and_key(tmp_path, key, value, message):
    data = _mission_data()
    _set(data, key, value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ex.ExperimentError) as info:
        ex.load_experiment(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text


def test_mixed_releases_need_the_confounded_warning(tmp_path):
    data = yaml.safe_load((ROOT / "configs/experiments/release-016-fixed-vs-030.yaml").read_text())
    del data["confounded"]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ex.ExperimentError, match="confounded: missing: arms run different vllm-omni releases"):
        ex.load_experiment(path)


def test_upstream_arm_refuses_plugin_evidence_and_unknown_overlay(tmp_path):
    data = yaml.safe_load((ROOT / "configs/experiments/v030-runner-v1-vs-v2.yaml").read_text())
    data["arms"]["v1"]["evidence"]["sync_signature"] = "original"
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ex.ExperimentError, match="runs no plugin, so there are no sync counters"):
        ex.load_experiment(tmp_path / "a.yaml")
    data = yaml.safe_load((ROOT / "configs/experiments/v030-runner-v1-vs-v2.yaml").read_text())
    data["arms"]["v1"]["variant"] = "fixed"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ex.ExperimentError, match="arms.v1.variant: only vllm-omni 0.16.0 has the plugin"):
        ex.load_experiment(tmp_path / "c.yaml")
    data = yaml.safe_load((ROOT / "configs/experiments/v030-runner-v1-vs-v2.yaml").read_text())
    data["arms"]["v1"]["deploy"] = "tts_loadtest_nope.yaml"
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ex.ExperimentError, match="no such overlay configs/stages/deploy/0.30.0/"):
        ex.load_experiment(tmp_path / "b.yaml")


@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_cli_one_line_error_and_exit_2(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("schema: [unclosed\n")
    proc = subprocess.run([sys.executable, "-m", "loadtest.experiment", str(path), "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: {path}: line ")


@pytest.mark.slow  # runs a process (bash, a linter, the CLI)
def test_cli_dry_run_prints_commands():
    proc = subprocess.run([sys.executable, "-m", "loadtest.experiment", str(ROOT / ex.MISSION), "--dry-run",
                           "--model-revision", REV], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(_runs(proc.stdout)) == 2 and "TTS_PREDICTOR_VARIANT=fixed" in proc.stdout


# ----------------------------------------------------------------------------------------------- evidence


def _arm(**ev) -> ex.Arm:
    return ex.Arm("A", "a", "vllm", "0.16.0", "vllm/vllm-omni:v0.16.0", "original", "qwen3_tts_b8.yaml",
                  evidence=ex.Evidence(**ev))


def _counters(variant: str, syncs: float, calls: float, tokens: float) -> list:
    lab = {"variant": variant}
    return [(pm.INFO, {**lab, "backend": "vllm"}, 1.0), (pm.CALLS, lab, 1500.0), (pm.SYNCS, lab, syncs),
            (pm.OBSERVED_CALLS, lab, calls), (pm.OBSERVED_TOKENS, lab, tokens)]


def test_sync_signature_known_answers():
    arm = _arm(sync_signature="original")
    # 40 observed calls carrying 300 query tokens: original syncs T + 4 per call = 300 + 160
    assert check_evidence(arm, "", _counters("original", 460, 40, 300))[0]
    ok, why = check_evidence(arm, "", _counters("original", 200, 40, 300))
    assert not ok and "means 460" in why
    ok, why = check_evidence(arm, "", _counters("fixed", 200, 40, 300))
    assert not ok and "variant(s) ['fixed'], expected original" in why
    ok, why = check_evidence(arm, "", [])
    assert not ok and "no tts_predictor counters" in why
    ok, why = check_evidence(arm, "", _counters("original", 0, 0, 0))
    assert not ok and "no call was observed" in why
    assert check_evidence(_arm(sync_signature="fixed"), "", _counters("fixed", 200, 40, 300))[0]  # 5 per call
    assert check_evidence(_arm(sync_signature="vectorized"), "", _counters("vectorized", 0, 40, 300))[0]


def test_log_and_metric_evidence():
    arm = _arm(log_present=[r"Using MR v2 OmniARModelRunner for omni AR stage \(stage_id=0"],
               log_absent=["frame-local KV requires CUDA BF16"], metric_present=["vllm_omni:audio_ttfp_s_count"])
    log = "INFO x\n(EngineCore pid=1) INFO [gpu_ar_worker.py:127] Using MR v2 OmniARModelRunner for omni AR stage " \
          "(stage_id=0 model_stage=qwen3_tts).\n"
    rows = [("vllm_omni:audio_ttfp_s_count", {"stage": "1"}, 3.0)]
    assert check_evidence(arm, log, rows) == (True, "evidence holds: " + describe(arm.evidence))
    ok, why = check_evidence(arm, "INFO nothing\n", rows)
    assert not ok and "no line matching" in why
    bad_log = log + "WARNING Qwen3-TTS frame-local KV requires CUDA BF16; using re-prefill\n"
    ok, why = check_evidence(arm, bad_log, rows)
    assert not ok and why.endswith("WARNING Qwen3-TTS frame-local KV requires CUDA BF16; using re-prefill")
    ok, why = check_evidence(arm, log, [])
    assert not ok and "not exposed" in why
    ok, why = check_evidence(arm, log, [("vllm_omni:audio_ttfp_s_count", {}, 0.0)])
    assert not ok and "is 0, not > 0" in why


def test_versions_agree_with_serve_sh_and_manifest_says_where_the_plugin_is():
    text = (ROOT / "docker/serve.sh").read_text()
    assert f"SUPPORTED=({' '.join(ex.SUPPORTED_VERSIONS)})" in text and f"PLUGIN_VERSION={ex.PLUGIN_VERSION} " in text
    exp = ex.load_experiment(ROOT / "configs/experiments/release-016-fixed-vs-030.yaml")
    m016, m030 = (arm_manifest(a) for a in exp.arms.values())
    assert m016["plugin"] == "installed, variant fixed" and m016["image"] == "tts-vllm-omni:0.16.0-fixed"
    assert m030["plugin"].startswith("none: vllm-omni 0.30.0 has no _LocalPredictorKVCache")
    assert m030["deploy"] == "qwen3_tts.yaml" and m030["stages"] is None
    sim = arm_manifest(ex.simulated(exp).arms["v030"])
    assert sim["simulated"] and sim["simulated_from"] == "vllm-omni 0.30.0 qwen3_tts.yaml"
