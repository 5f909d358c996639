"""The request cases of the parity sweeps: one list, sent to the simulator and to vllm-omni 0.16.0 in process
(tests/engine/test_parity.py: its real router over a fake engine, DNS and downloads stubbed) and over HTTP to the real
server on this CPU (tests/real/test_real_server.py). A case "accepts" when the answer is audio; `stricter` marks where
vllm-omni accepts and the simulator deliberately refuses (docs/api-parity.md).
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass

import numpy as np

MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
SPEAKERS = ("Vivian", "Ryan")  # CustomVoice speakers configured on both sides (the Base model has none: no check)
HOSTS = {  # test DNS: name -> address (the real server and the simulator both resolve through socket.getaddrinfo)
    "public.example": "93.184.216.34", "internal.example": "10.0.0.5", "metadata.example": "169.254.169.254",
    "zero.example": "0.0.0.0", "mapped.example": "::ffff:127.0.0.1",
}


def _wav(seconds=1.0, sr=24000, channels=1, fmt="WAV") -> bytes:
    t = np.arange(int(seconds * sr)) / sr
    x = (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    if channels == 2:
        x = np.stack([x, x], axis=1)
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt, **({"subtype": "PCM_16"} if fmt == "WAV" else {}))
    return buf.getvalue()


WAV = _wav()
B64 = base64.b64encode(WAV).decode()
URI = "data:audio/wav;base64," + B64


@dataclass(frozen=True)
class Case:
    id: str
    body: object  # a dict (sent as JSON) or raw bytes
    content_type: str | None = "application/json"
    stricter: str | None = None  # why the simulator deliberately refuses what vllm-omni accepts


def base(**kw) -> dict:
    """The load generator's Base streaming body (loadtest.prompts.speech_payload), with overrides."""
    body = {"model": MODEL, "input": "Hello there, this is a test.", "task_type": "Base", "ref_audio": URI,
            "ref_text": "A reference.", "language": "English", "response_format": "pcm", "stream": True}
    body.update(kw)
    return {k: v for k, v in body.items() if v is not ...}


COERCION = "type coercion: pydantic's lax mode converts it, the simulator wants the JSON type"
FIELDS = {  # field -> a valid value in a minimal CustomVoice body (for the null and wrong-type sweeps)
    "input": "hi", "model": MODEL, "voice": "vivian", "instructions": "calm", "response_format": "wav", "speed": 1.0,
    "stream_format": "audio", "stream": False, "task_type": "CustomVoice", "language": "English", "ref_audio": URI,
    "ref_text": "A reference.", "x_vector_only_mode": False, "max_new_tokens": 64,
}
BASE_ONLY = {"ref_audio", "ref_text", "x_vector_only_mode"}
# where pydantic's lax mode turns the wrong JSON type into a valid value: "1" -> 1.0 / 1 / True, True -> 1.0 / 1,
# 1 -> True (stream too, but stream=true then needs pcm, which this minimal body lacks)
COERCED = {("speed", "bool"), ("speed", "str"), ("max_new_tokens", "bool"), ("max_new_tokens", "str"),
           ("x_vector_only_mode", "int"), ("x_vector_only_mode", "str")}


def generated_cases() -> list[Case]:
    out = []
    for name, good in FIELDS.items():
        body = {"input": "hi", "task_type": "Base", "ref_audio": URI} if name in BASE_ONLY else {"input": "hi"}
        out.append(Case(f"valid-{name}", {**body, name: good}))
        out.append(Case(f"null-{name}", {**body, name: None}))
        for label, wrong in (("bool", True), ("int", 1), ("float", 1.5), ("str", "1"), ("list", ["x"]),
                             ("object", {"a": 1})):
            if type(wrong) is type(good) or (isinstance(good, float) and label == "int"):
                continue
            stricter = COERCION if (name, label) in COERCED else None
            out.append(Case(f"type-{name}-{label}", {**body, name: wrong}, stricter=stricter))
    return out


CASES = [
    # the bodies this project sends
    Case("loadgen-stream", base()),
    Case("loadgen-wav", base(response_format="wav", stream=False)),
    Case("minimal", {"input": "hi"}),
    Case("extra-keys-ignored", {"input": "hi", "temperature": 0.7, "seed": 1}),
    # transport: content type and body
    Case("ct-charset", {"input": "hi"}, "application/json; charset=utf-8"),
    Case("ct-case", {"input": "hi"}, "Application/JSON"),
    Case("ct-text", {"input": "hi"}, "text/plain"),
    Case("ct-missing", {"input": "hi"}, None),
    Case("ct-json5", {"input": "hi"}, "application/json5"),
    Case("ct-suffix", {"input": "hi"}, "application/merge-patch+json"),
    Case("body-not-json", b"{not json"),
    Case("body-empty", b""),
    Case("body-array", b'[{"input": "hi"}]'),
    Case("body-null", b"null"),
    Case("body-utf16", json.dumps({"input": "hi"}).encode("utf-16")),
    Case("body-duplicate-key", b'{"input": 5, "input": "hi"}'),
    Case("body-nan-speed", b'{"input": "hi", "speed": NaN}'),
    Case("body-infinity-speed", b'{"input": "hi", "speed": Infinity}'),
    # input
    Case("input-empty", {"input": ""}),
    Case("input-blank", {"input": " \n\t"}),
    Case("input-missing", {"model": MODEL}),
    Case("input-4096", {"input": "a" * 4096}),
    Case("input-5000", {"input": "a" * 5000}, stricter="input longer than audio.max_input_chars (4096)"),
    # model
    Case("model-other", {"input": "hi", "model": "other/model"}),
    Case("model-empty", {"input": "hi", "model": ""}),
    Case("model-case", {"input": "hi", "model": MODEL.lower()}),
    # format, speed, streaming
    *(Case(f"format-{f}", {"input": "hi", "response_format": f}) for f in ("wav", "pcm", "flac", "mp3", "opus")),
    Case("format-upper", {"input": "hi", "response_format": "WAV"}),
    Case("format-ogg", {"input": "hi", "response_format": "ogg"}),
    *(Case(f"speed-{s}", {"input": "hi", "speed": s}) for s in (0.25, 4, 0.2, 4.01, 0, -1)),
    Case("stream-wav", {"input": "hi", "stream": True}),
    Case("stream-pcm", {"input": "hi", "stream": True, "response_format": "pcm"}),
    Case("stream-speed", {"input": "hi", "stream": True, "response_format": "pcm", "speed": 1.5}),
    Case("stream-speed-1", {"input": "hi", "stream": True, "response_format": "pcm", "speed": 1}),
    Case("stream-speed-null", {"input": "hi", "stream": True, "response_format": "pcm", "speed": None}),
    Case("stream-format-sse", {"input": "hi", "stream_format": "sse"}),
    Case("stream-format-upper", {"input": "hi", "stream_format": "AUDIO"}),
    # task types and their cross-field rules
    Case("task-lowercase", {"input": "hi", "task_type": "base"}),
    Case("base-without-ref", {"input": "hi", "task_type": "Base"}),
    Case("base-x-vector", base(x_vector_only_mode=True, stream=..., response_format=...)),
    Case("base-without-ref-text", base(ref_text=...)),
    Case("customvoice-ref-text", {"input": "hi", "ref_text": "x"}),
    Case("customvoice-x-vector-false", {"input": "hi", "x_vector_only_mode": False}),
    Case("customvoice-ref-audio", {"input": "hi", "ref_audio": URI}),
    Case("voicedesign-no-instructions", {"input": "hi", "task_type": "VoiceDesign"}),
    Case("voicedesign-empty-instructions", {"input": "hi", "task_type": "VoiceDesign", "instructions": ""}),
    Case("voicedesign", {"input": "hi", "task_type": "VoiceDesign", "instructions": "A calm voice."}),
    Case("instructions-500", {"input": "hi", "instructions": "x" * 500}),
    Case("instructions-501", {"input": "hi", "instructions": "x" * 501}),
    # language, voice
    Case("language-lower", {"input": "hi", "language": "english"}),
    Case("language-empty", {"input": "hi", "language": ""}),
    Case("language-auto", {"input": "hi", "language": "Auto"}),
    Case("voice-known-upper", {"input": "hi", "voice": "RYAN"}),
    Case("voice-unknown", {"input": "hi", "voice": "bob"}),
    Case("voice-unknown-base", base(voice="bob")),
    Case("voice-unknown-voicedesign", {"input": "hi", "task_type": "VoiceDesign", "instructions": "x", "voice": "b"}),
    # lax type coercion in vllm-omni's request model (pydantic), refused by the simulator
    Case("coerce-stream-string", {"input": "hi", "stream": "true", "response_format": "pcm"}, stricter=COERCION),
    Case("coerce-stream-zero", {"input": "hi", "stream": 0}, stricter=COERCION),
    Case("coerce-max-new-tokens-float", {"input": "hi", "max_new_tokens": 64.0}, stricter=COERCION),
    Case("coerce-speed-string", {"input": "hi", "speed": "1.5"}, stricter=COERCION),
    Case("coerce-max-new-tokens-fraction", {"input": "hi", "max_new_tokens": 64.5}),  # refused by both
    Case("coerce-stream-yes", {"input": "hi", "stream": "yes", "response_format": "pcm"}, stricter=COERCION),
    # max_new_tokens
    *(Case(f"max-new-tokens-{n}", {"input": "hi", "max_new_tokens": n}) for n in (1, 4096, 0, 4097, -5)),
    # ref_audio as a data: URI
    Case("ref-wrapped-base64", base(ref_audio="data:audio/wav;base64," + "\n".join(
        B64[i:i + 76] for i in range(0, len(B64), 76)))),
    Case("ref-base64-spaces", base(ref_audio="data:audio/wav;base64," + " ".join(
        B64[i:i + 64] for i in range(0, len(B64), 64)))),
    Case("ref-no-padding", base(ref_audio=URI.rstrip("="))),
    Case("ref-urlsafe", base(ref_audio="data:audio/wav;base64," + base64.urlsafe_b64encode(WAV).decode())),
    Case("ref-no-comma", base(ref_audio="data:" + B64)),
    Case("ref-other-media-type", base(ref_audio="data:text/plain;base64," + B64)),
    Case("ref-no-base64-marker", base(ref_audio="data:audio/wav," + B64)),
    Case("ref-empty-payload", base(ref_audio="data:audio/wav;base64,")),
    Case("ref-not-audio", base(ref_audio="data:audio/wav;base64," + base64.b64encode(b"hello world").decode())),
    Case("ref-flac", base(ref_audio="data:audio/flac;base64," + base64.b64encode(_wav(fmt="FLAC")).decode())),
    Case("ref-stereo", base(ref_audio="data:audio/wav;base64," + base64.b64encode(_wav(channels=2)).decode())),
    Case("ref-8khz", base(ref_audio="data:audio/wav;base64," + base64.b64encode(_wav(sr=8000)).decode())),
    Case("ref-zero-samples", base(ref_audio="data:audio/wav;base64," + base64.b64encode(_wav(seconds=0)).decode()),
         stricter="ref_audio with no samples"),
    Case("ref-61s", base(ref_audio="data:audio/wav;base64," + base64.b64encode(_wav(61, sr=4000)).decode()),
         stricter="ref_audio longer than audio.max_ref_audio_s (60 s)"),
    Case("ref-upper-scheme", base(ref_audio="DATA:audio/wav;base64," + B64)),
    Case("ref-leading-space", base(ref_audio=" " + URI)),
    Case("ref-path", base(ref_audio="/tmp/ref.wav")),
    Case("ref-file-url", base(ref_audio="file:///etc/passwd")),
    Case("ref-ftp-url", base(ref_audio="ftp://public.example/a.wav")),
    # ref_audio as a URL (DNS and download stubbed, the same WAV on both sides)
    Case("url-public", base(ref_audio="https://public.example/voice.wav")),
    Case("url-public-http-port", base(ref_audio="http://public.example:8080/voice.wav?x=1")),
    Case("url-upper-scheme", base(ref_audio="HTTPS://public.example/voice.wav")),
    Case("url-no-host", base(ref_audio="http:///voice.wav")),
    Case("url-unresolvable", base(ref_audio="http://nowhere.invalid/voice.wav")),
    Case("url-private-name", base(ref_audio="http://internal.example/voice.wav")),
    Case("url-metadata-name", base(ref_audio="http://metadata.example/latest")),
    Case("url-loopback", base(ref_audio="http://127.0.0.1:9/voice.wav")),
    Case("url-private-ip", base(ref_audio="http://192.168.1.20/voice.wav")),
    Case("url-link-local-ip", base(ref_audio="http://169.254.169.254/latest")),
    Case("url-ipv6-loopback", base(ref_audio="http://[::1]/voice.wav")),
    Case("url-ipv6-ula", base(ref_audio="http://[fd00::1]/voice.wav")),
    Case("url-zero-ip", base(ref_audio="http://0.0.0.0/voice.wav"),
         stricter="SSRF: 0.0.0.0/8 reaches the local host; vllm-omni 0.16.0 does not block it"),
    Case("url-zero-name", base(ref_audio="http://zero.example/voice.wav"),
         stricter="SSRF: 0.0.0.0/8 reaches the local host; vllm-omni 0.16.0 does not block it"),
    Case("url-ipv4-mapped", base(ref_audio="http://[::ffff:127.0.0.1]/voice.wav"),
         stricter="SSRF: an IPv4-mapped IPv6 loopback; vllm-omni 0.16.0 compares it only with IPv6 networks"),
    Case("url-ipv4-mapped-name", base(ref_audio="http://mapped.example/voice.wav"),
         stricter="SSRF: an IPv4-mapped IPv6 loopback; vllm-omni 0.16.0 compares it only with IPv6 networks"),
    *generated_cases(),
]


def outcome(status: int, ctype: str, body: bytes) -> dict:
    """What a server answered a case: accepted (audio), else its status and vLLM-shaped error."""
    accepted = status == 200 and ctype.startswith("audio/")
    err = None
    if not accepted:
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            err = {"message": body[:200].decode(errors="replace"), "code": None}
    return {"accept": accepted, "status": status, "content_type": ctype, "error": err}


def raw(case: Case) -> bytes:
    return case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()


def network_bound(case: Case) -> bool:
    """A URL reference: its answer depends on DNS and a download (stubbed in the engine tier, absent on this box)."""
    return isinstance(case.body, dict) and str(case.body.get("ref_audio") or "").lower().startswith(("http", "ftp"))


def kills_the_real_engine(body: object) -> str | None:
    """Why vllm-omni 0.16.0 would kill its engine on this body, None if it would not (measured on the real CPU server:
    both pass the API's validation, then the talker worker raises in its preprocess and EngineCore dies, every later
    request fails while /health still answers): a CustomVoice request on the Base model ("Unsupported speaker:
    Vivian", the default voice) and a Base request without ref_text and without x_vector_only_mode ("Base in-context
    voice cloning requires `ref_text` or tokenized `ref_ids`")."""
    if not isinstance(body, dict):
        return None
    task = body.get("task_type") or "CustomVoice"
    if task == "CustomVoice":
        return "CustomVoice on the Base model: the talker raises Unsupported speaker"
    if task == "Base" and not body.get("ref_text") and body.get("x_vector_only_mode") is not True:
        return "Base without ref_text or x_vector_only_mode: the talker raises in its in-context prompt"
    return None


def on_base(case: Case) -> Case | None:
    """The case as the real Base server can take it over HTTP without losing its engine, or None (left to the engine
    tier, where a fake engine cannot die). A body without a task type gets the Base fields (task_type, ref_audio,
    ref_text) under its own keys; a Base body that is not about ref_text or x_vector_only_mode gets a ref_text; a body
    that still kills the engine (kills_the_real_engine) or names another task type is left out; so is a URL reference
    (network_bound)."""
    if network_bound(case):
        return None
    body = case.body
    if isinstance(body, bytes):
        try:
            decoded = json.loads(body)  # bytes in any JSON encoding, as the server reads them
        except ValueError:
            return case
        return None if kills_the_real_engine(decoded) and "task_type" not in decoded else case
    task = body.get("task_type", ...)
    if task is ...:
        body = {"task_type": "Base", "ref_audio": URI, "ref_text": "A reference.", **body}
    elif task != "Base":
        return None
    about = case.id.replace("_", "-")
    if "ref_text" not in body and "ref-text" not in about and "x-vector" not in about:
        body = {**body, "ref_text": "A reference."}
    if kills_the_real_engine(body) and not _refused_before_the_engine(body):
        return None
    return Case(case.id, body, case.content_type, case.stricter)


def _refused_before_the_engine(body: dict) -> bool:
    """A wrong JSON type is refused by the request model before anything reaches the talker."""
    return any(not isinstance(body.get(k), (str, type(None))) for k in ("ref_text", "ref_audio", "task_type")) or \
        not isinstance(body.get("x_vector_only_mode"), (bool, type(None)))
