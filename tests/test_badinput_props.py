"""Property-based tests of the validators: whatever a scenario file or a request body holds, the
validator either accepts something that satisfies the invariants or refuses it with its own error type; it never
crashes with another exception (which would be a traceback instead of one clear line or a 400)."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.client import Outcome, check_wav, run_request
from tts_predictor.domain import MODEL_NAME
from ttsrecords.scenario import Scenario, ScenarioError, parse_scenario
from ttssim.config import AudioConfig
from ttssim.server import FIELDS, RESPONSE_FORMATS, TASK_TYPES, ApiError, validate_body

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODEL = MODEL_NAME
AUDIO = AudioConfig()

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                           max_leaves=12)

VALID_SCENARIO = {"schema": "tts-scenario/1", "mode": "stream", "loop": "closed", "seed": 1,
                  "mix": {"short": 1, "medium": 2}, "timeout_s": 30,
                  "phases": {"warmup_s": 1, "measure_s": 2, "drain_s": 0}, "steps": [{"concurrency": 8}, 16]}
SCENARIO_KEYS = sorted(VALID_SCENARIO) + ["name", "prompts", "voice", "spawn_rate", "language", "description"]


# --- scenario validator -------------------------------------------------------------------------------------------

@SETTINGS
@given(json_values)
def test_scenario_any_document_is_accepted_or_refused_cleanly(doc):
    try:
        s = parse_scenario(doc, path="x.yaml")
    except ScenarioError as e:
        assert str(e).startswith("x.yaml")  # the message names the file
        return
    check_scenario_invariants(s)


special_numbers = st.one_of(st.floats(), st.integers(-5, 5), st.sampled_from([math.nan, math.inf, -math.inf, 0, -0.0]))
phase_st = st.dictionaries(st.sampled_from(["warmup_s", "measure_s", "drain_s"]), special_numbers, max_size=3)


@SETTINGS
@given(st.sampled_from(SCENARIO_KEYS), st.one_of(json_values, special_numbers, phase_st,
                                                 st.lists(st.one_of(special_numbers, phase_st), max_size=3)))
def test_scenario_one_field_replaced(key, value):
    """Numbers are over-weighted here: NaN and infinity (YAML .nan/.inf) once slipped through as timeouts."""
    doc = {**VALID_SCENARIO, key: value}
    try:
        s = parse_scenario(doc, path="x.yaml")
    except ScenarioError as e:
        assert "x.yaml" in str(e)
        return
    check_scenario_invariants(s)


@SETTINGS
@given(st.one_of(st.integers(max_value=0), st.floats(allow_nan=True), st.booleans(), st.text(max_size=5),
                 st.none()), st.integers(0, 3))
def test_scenario_concurrency_below_one_or_not_an_int_is_refused(conc, where):
    steps = [{"concurrency": 4} for _ in range(4)]
    steps[where] = {"concurrency": conc}
    try:
        parse_scenario({**VALID_SCENARIO, "steps": steps}, path="x.yaml")
    except ScenarioError as e:
        assert f"steps[{where}]" in str(e) and "concurrency" in str(e)
    else:
        raise AssertionError(f"concurrency {conc!r} accepted")


steps_st = st.lists(st.fixed_dictionaries({"concurrency": st.integers(1, 512)},
                                          optional={"warmup_s": st.floats(0, 100), "measure_s": st.floats(0.1, 100),
                                                    "drain_s": st.floats(0, 100)}), min_size=1, max_size=6)


@SETTINGS
@given(steps_st, st.integers(0, 2**31), st.sampled_from(["stream", "wav"]))
def test_valid_scenarios_parse_and_survive_the_wire(steps, seed, mode):
    """What the master sends its workers (to_dict) rebuilds the same scenario."""
    s = parse_scenario({**VALID_SCENARIO, "steps": steps, "seed": seed, "mode": mode}, path="x.yaml")
    check_scenario_invariants(s)
    assert [st_.concurrency for st_ in s.steps] == [x["concurrency"] for x in steps]
    assert Scenario.from_dict(s.to_dict()) == s


def check_scenario_invariants(s: Scenario) -> None:
    assert s.steps and s.mode in ("stream", "wav") and s.loop in ("closed", "open")
    assert s.timeout_s > 0 and s.spawn_rate > 0 and sum(s.mix.values()) > 0
    assert all(math.isfinite(x) for x in (s.timeout_s, s.spawn_rate, *s.mix.values()))
    for i, step in enumerate(s.steps):
        assert step.index == i and isinstance(step.concurrency, int) and step.concurrency >= 1
        assert step.measure_s > 0 and step.warmup_s >= 0 and step.drain_s >= 0
        assert all(math.isfinite(x) for x in (step.warmup_s, step.measure_s, step.drain_s))
        assert (step.rate is not None) == (s.loop == "open")


# --- request validator (simulator, shaped like vllm-omni) ----------------------------------------------------------

field_values = st.one_of(json_values, st.sampled_from(["pcm", "wav", "Base", "VoiceDesign", "English", MODEL,
                                                      "data:audio/wav;base64,AA==", "http://example.com/a.wav"]))
bodies = st.dictionaries(st.sampled_from(sorted(FIELDS) + ["extra"]), field_values, max_size=8)


@SETTINGS
@given(st.one_of(json_values, bodies))
def test_request_any_body_is_accepted_or_refused_cleanly(body):
    try:
        req = validate_body(body, MODEL, AUDIO)
    except ApiError as e:
        assert e.status in (400, 404) and e.message
        return
    check_request_invariants(req)


@SETTINGS
@given(st.sampled_from(sorted(FIELDS)), field_values)
def test_request_one_field_replaced(key, value):
    body = {"input": "hello there", "model": MODEL, "task_type": "Base", "ref_audio": "data:audio/wav;base64,AA==",
            "ref_text": "hi", "response_format": "pcm", "stream": True, key: value}
    try:
        req = validate_body(body, MODEL, AUDIO)
    except ApiError as e:
        assert e.status in (400, 404) and e.message and (e.param is None or e.param in FIELDS)
        return
    check_request_invariants(req)


@SETTINGS
@given(st.integers(AUDIO.max_input_chars + 1, AUDIO.max_input_chars * 4))
def test_request_input_length_is_bounded(n):
    try:
        validate_body({"input": "a" * n}, MODEL, AUDIO)
    except ApiError as e:
        assert e.param == "input" and "too long" in e.message
    else:
        raise AssertionError("an over-long input was accepted")


def check_request_invariants(req: dict) -> None:
    assert isinstance(req["input"], str) and req["input"].strip() and len(req["input"]) <= AUDIO.max_input_chars
    assert req["response_format"] in RESPONSE_FORMATS
    assert 0.25 <= req["speed"] <= 4.0
    assert 1 <= req["max_new_tokens"] <= 4096
    assert req["task_type"] in (None, *TASK_TYPES)
    if req["stream"]:
        assert req["response_format"] == "pcm" and req["speed"] == 1.0
    if req["task_type"] == "Base":
        assert req["ref_audio"].startswith(("http://", "https://", "data:"))
    if req["model"]:  # an empty name means the served model (as vLLM's serving layer treats it)
        assert req["model"] == MODEL


# --- the client never raises, whatever the server sends ------------------------------------------------------------

class ScriptedResponse:
    def __init__(self, status, chunks, ctype, fail_at):
        self.status, self._chunks, self._fail_at = status, chunks, fail_at
        self.headers = {"content-type": ctype}

    def chunks(self):
        for i, c in enumerate(self._chunks):
            if i == self._fail_at:
                raise ConnectionResetError("peer went away")
            yield c

    def close(self):
        pass


class ScriptedTransport:
    def __init__(self, resp, raise_on_post):
        self.resp, self.raise_on_post = resp, raise_on_post

    def post(self, path, body, headers):
        if self.raise_on_post:
            raise TimeoutError("connect timed out")
        return self.resp


@SETTINGS
@given(st.sampled_from([200, 200, 200, 400, 500, 503]), st.lists(st.binary(max_size=300), max_size=6),
       st.sampled_from(["audio/pcm", "audio/wav", "application/json", "text/html", ""]),
       st.one_of(st.none(), st.integers(0, 6)), st.booleans(), st.sampled_from(["stream", "wav"]),
       st.integers(1, 2000))
def test_client_never_raises(status, chunks, ctype, fail_at, raise_on_post, mode, max_bytes):
    t = iter(range(10**6))
    out = run_request(ScriptedTransport(ScriptedResponse(status, chunks, ctype, fail_at), raise_on_post), b"{}",
                      mode, expected_s=(0.0, 100.0), clock=lambda: next(t) * 0.01, max_bytes=max_bytes)
    assert isinstance(out, Outcome)
    assert out.ok == (out.error is None)
    assert out.bytes <= max_bytes + max((len(c) for c in chunks), default=0)
    if out.ok:
        assert status == 200 and out.bytes > 0 and out.audio_s > 0 and out.bytes <= max_bytes


def test_client_stops_reading_an_endless_stream():
    """A server that never stops sending: the client gives up at max_bytes instead of growing without bound."""

    class Endless(ScriptedResponse):
        def chunks(self):
            while True:
                yield b"\x01\x00" * 32768

    out = run_request(ScriptedTransport(Endless(200, [], "audio/pcm", None), False), b"{}", "wav",
                      max_bytes=10 * 65536)
    assert not out.ok and out.error.startswith("response exceeds 655360 bytes") and out.bytes <= 11 * 65536


@SETTINGS
@given(st.binary(max_size=2000))
def test_wav_check_never_raises(data):
    audio_s, err = check_wav(data)
    assert err is None or isinstance(err, str)
    if err is None:
        assert audio_s > 0
