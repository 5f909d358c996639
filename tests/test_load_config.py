"""Scenario validation, the prompt corpus, the reference voice and the deterministic prompt sequence."""

from __future__ import annotations

import base64
import io

import pytest
import soundfile as sf
import yaml
from conftest import ROOT

from loadtest.prompts import PayloadCache, PromptSequence, load_corpus, load_voice
from loadtest.scenario import load_scenario
from ttsrecords.scenario import Scenario, ScenarioError, parse_scenario

SCEN = ROOT / "configs" / "scenarios"


def test_shipped_scenarios_are_valid():
    d = load_scenario(SCEN / "default.yaml")
    assert [s.concurrency for s in d.steps] == [8, 16, 32, 64, 128, 256]
    smoke = load_scenario(SCEN / "smoke.yaml")
    assert [s.concurrency for s in smoke.steps] == [8, 16] and smoke.duration_s < 60
    demo = load_scenario(SCEN / "demo.yaml")
    assert [s.concurrency for s in demo.steps] == [8, 64] and demo.duration_s <= 41  # 6 windows: `make demo` < 5 min
    assert load_scenario(SCEN / "ab-default.yaml").loop == "closed"
    op = load_scenario(SCEN / "open-poisson.yaml")
    assert op.loop == "open" and all(s.rate > 0 for s in op.steps)
    assert Scenario.from_dict(d.to_dict()) == d  # the master sends it to workers this way


@pytest.mark.parametrize("name", sorted(p.name for p in SCEN.glob("*.yaml")))
def test_every_shipped_scenario_round_trips_through_its_document(name, tmp_path):
    """The format's writer and reader agree: a scenario written as a document (the run's and each window's
    scenario.yaml) parses back to the same scenario, and to_dict/from_dict (master -> workers) too."""
    s = load_scenario(SCEN / name)
    assert parse_scenario(s.to_document(), path=s.path, sha256=s.sha256) == s
    assert Scenario.from_dict(s.to_dict()) == s
    (tmp_path / name).write_text(yaml.safe_dump(s.to_document(), sort_keys=False))
    back = load_scenario(tmp_path / name)
    assert back.steps == s.steps and back.mix == s.mix and back.loop == s.loop and back.timeout_s == s.timeout_s


def test_a_document_keeps_open_loop_rates_and_the_count_phase():
    s = parse_scenario({"loop": "open", "phases": {"count_s": 2, "warmup_s": 1, "measure_s": 3, "drain_s": 1},
                        "steps": [{"concurrency": 8, "rate": 1.5}, {"concurrency": 64, "rate": 4, "users": 5}]})
    doc = s.to_document()
    assert doc["phases"] == {"count_s": 2.0} and [(d["rate"], d["users"]) for d in doc["steps"]] == [(1.5, 8), (4.0, 5)]
    assert parse_scenario(doc) == s


def test_one_request_limit_for_client_holds_and_watchdog():
    cpu = load_scenario(SCEN / "cpu.yaml")
    assert cpu.request_limit_s() == cpu.request_limit_s(None) == cpu.request_limit_s(0) == cpu.timeout_s
    assert cpu.request_limit_s(cpu.timeout_s + 7.5) == cpu.timeout_s + 7.5  # --request-timeout wins


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"steps": []}, "steps must be a non-empty list"),
        ({"phases": {"warmup_s": 1, "measure_s": 1, "drain_s": 1}, "steps": [{"concurency": 8}]},
         "unknown key(s) ['concurency']"),
        ({"phases": {"warmup_s": 1, "measure_s": 1}, "steps": [8]}, "drain_s missing"),
        ({"phases": {"warmup_s": 1, "measure_s": 0, "drain_s": 1}, "steps": [8]}, "measure_s must be > 0"),
        ({"phases": {"warmup_s": 1, "measure_s": 2, "drain_s": 1}, "steps": [{"concurrency": 0}]},
         "steps[0].concurrency must be >= 1"),
        ({"phases": {"warmup_s": 1, "measure_s": 2, "drain_s": 1}, "steps": [{"concurrency": "8"}]},
         "must be an integer"),
        ({"mode": "mp3", "phases": {"warmup_s": 1, "measure_s": 2, "drain_s": 1}, "steps": [8]}, "mode must be one of"),
        ({"loop": "open", "phases": {"warmup_s": 1, "measure_s": 2, "drain_s": 1}, "steps": [8]}, "rate"),
        ({"phases": {"warmup_s": 1, "measure_s": 2, "drain_s": 1}, "steps": [{"concurrency": 8, "rate": 2}]},
         "only apply when loop is open"),
        ({"phases": {"warmup_s": -1, "measure_s": 2, "drain_s": 1}, "steps": [8]}, "warmup_s must be >= 0"),
        ([1, 2], "top level must be a mapping"),
        ({"schema": "tts-scenario/9", "steps": [8]}, "schema must be"),
    ],
)
def test_bad_scenarios_name_the_field(doc, message):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(doc, path="bad.yaml")
    assert message in str(e.value) and "bad.yaml" in str(e.value)


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "missing.yaml")
    p = tmp_path / "x.yaml"
    p.write_text("steps: [8\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(p)


def test_corpus_has_three_buckets_of_increasing_length():
    c = load_corpus(ROOT / "configs/prompts/en.yaml")
    assert set(c.buckets) == {"short", "medium", "long"}
    mean = {b: sum(len(p.text) for p in ps) / len(ps) for b, ps in c.buckets.items()}
    assert mean["short"] * 3 < mean["medium"] and mean["medium"] * 2 < mean["long"]
    lo, hi = c.bounds.range_for("x" * 400)
    assert lo < 400 / 15 < hi


def test_voice_is_24k_mono_with_transcript_and_data_uri():
    v = load_voice(ROOT / "configs/voices/ref.yaml")
    info = sf.info(v.audio_path)
    assert info.samplerate == 24000 and info.channels == 1 and 1.0 < info.duration < 10.0
    assert v.transcript and v.data_uri.startswith("data:audio/wav;base64,")
    data, sr = sf.read(io.BytesIO(base64.b64decode(v.data_uri.split(",", 1)[1])))
    assert sr == 24000 and len(data) == info.frames
    meta = yaml.safe_load((ROOT / "configs/voices/ref.yaml").read_text())
    assert meta["transcript"] == v.transcript


def test_prompt_sequence_is_deterministic_per_seed_and_worker():
    c = load_corpus(ROOT / "configs/prompts/en.yaml")
    mix = {"short": 1, "medium": 2, "long": 1}

    def seq(seed, worker):
        s = PromptSequence(c, mix, seed, worker)
        return [s.next().id for _ in range(200)]

    assert seq(7, 0) == seq(7, 0)
    assert seq(7, 0) != seq(8, 0) and seq(7, 0) != seq(7, 1)
    ids = seq(7, 0)
    assert {i[0] for i in ids} == {"s", "m", "l"}
    assert 0.35 < sum(i.startswith("m") for i in ids) / len(ids) < 0.65  # weight 2 of 4
    only_short = PromptSequence(c, {"short": 1, "long": 0}, 1)
    assert all(only_short.next().bucket == "short" for _ in range(50))
    with pytest.raises(ValueError, match="not in the corpus"):
        PromptSequence(c, {"huge": 1}, 1)


def test_payload_is_a_base_voice_clone_request():
    import json

    c = load_corpus(ROOT / "configs/prompts/en.yaml")
    v = load_voice(ROOT / "configs/voices/ref.yaml")
    p = c.buckets["short"][0]
    stream = json.loads(PayloadCache(v, model="m", language="English", mode="stream").body(p))
    assert stream["task_type"] == "Base" and stream["stream"] is True and stream["response_format"] == "pcm"
    assert stream["input"] == p.text and stream["ref_text"] == v.transcript and stream["ref_audio"] == v.data_uri
    wav = json.loads(PayloadCache(v, model="m", language="English", mode="wav").body(p))
    assert wav["stream"] is False and wav["response_format"] == "wav"
