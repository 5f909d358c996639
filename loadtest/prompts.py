"""Request inputs: the prompt corpus (length buckets), the reference voice, and the deterministic prompt sequence."""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

PROMPTS_SCHEMA = "tts-prompts/1"
VOICE_SCHEMA = "tts-voice/1"
BUCKETS = ("short", "medium", "long")


@dataclass(frozen=True)
class Prompt:
    id: str
    bucket: str
    text: str


@dataclass(frozen=True)
class DurationBounds:
    """Speaking-rate band a response must fall in, so empty, truncated and runaway audio fail."""

    min_chars_per_s: float = 4.0
    max_chars_per_s: float = 40.0
    slack_s: float = 2.0

    def range_for(self, text: str) -> tuple[float, float]:
        n = len(text)
        return max(0.0, n / self.max_chars_per_s - self.slack_s), n / self.min_chars_per_s + self.slack_s


@dataclass(frozen=True)
class Corpus:
    language: str
    buckets: dict[str, tuple[Prompt, ...]]
    bounds: DurationBounds


@dataclass(frozen=True)
class Voice:
    audio_path: str
    transcript: str
    data_uri: str


def load_corpus(path: str | Path) -> Corpus:
    p = Path(path)
    data = yaml.safe_load(p.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("schema") != PROMPTS_SCHEMA:
        raise ValueError(f"{p}: not a prompt corpus (schema {PROMPTS_SCHEMA!r} expected)")
    buckets: dict[str, tuple[Prompt, ...]] = {}
    seen: set[str] = set()
    for bucket, items in (data.get("buckets") or {}).items():
        if not items:
            raise ValueError(f"{p}: bucket {bucket!r} is empty")
        prompts = []
        for item in items:
            pid, text = str(item["id"]), str(item["text"]).strip()
            if pid in seen or not text:
                raise ValueError(f"{p}: duplicate id or empty text at {pid!r}")
            seen.add(pid)
            prompts.append(Prompt(pid, str(bucket), text))
        buckets[str(bucket)] = tuple(prompts)
    d = data.get("duration") or {}
    return Corpus(str(data.get("language", "English")), buckets, DurationBounds(**d))


def load_voice(path: str | Path) -> Voice:
    """The reference clip as a data: URI (vllm-omni refuses loopback URLs, so a local test must inline it)."""
    p = Path(path)
    meta = yaml.safe_load(p.read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or meta.get("schema") != VOICE_SCHEMA:
        raise ValueError(f"{p}: not a voice description (schema {VOICE_SCHEMA!r} expected)")
    audio = p.parent / meta["audio"]
    uri = "data:audio/wav;base64," + base64.b64encode(audio.read_bytes()).decode("ascii")
    return Voice(str(audio), str(meta["transcript"]), uri)


class PromptSequence:
    """Deterministic prompts: the n-th prompt drawn in a process depends only on (seed, worker index, n), and after
    restart(stream) on (seed, worker index, stream, draws since). The session restarts a stream per level at the
    measure edge, so every window measures a level on the same prompts whatever ran before it in the window."""

    def __init__(self, corpus: Corpus, mix: dict[str, float], seed: int, worker_index: int = 0):
        unknown = sorted(set(mix) - set(corpus.buckets))
        if unknown:
            raise ValueError(f"mix names bucket(s) {unknown} not in the corpus {sorted(corpus.buckets)}")
        self._names = [b for b in mix if mix[b] > 0]
        self._weights = [mix[b] for b in self._names]
        self._corpus = corpus
        self._key = f"tts-prompts:{seed}:{worker_index}"
        self._rng = random.Random(self._key)
        self.drawn = 0  # prompts handed out so far; the n-th one is seq n - 1

    def restart(self, stream: str) -> None:
        """Go on from the start of a named stream of this (seed, worker); `drawn` keeps counting."""
        self._rng = random.Random(f"{self._key}:{stream}")

    def next(self) -> Prompt:
        self.drawn += 1
        bucket = self._rng.choices(self._names, self._weights)[0]
        items = self._corpus.buckets[bucket]
        return items[self._rng.randrange(len(items))]


class PayloadCache:
    """Pre-encoded request bodies: the 200 kB voice URI is serialised once, not per request."""

    def __init__(self, voice: Voice, *, model: str, language: str, mode: str, kind: str = "base"):
        self._voice, self._model, self._language, self._mode, self._kind = voice, model, language, mode, kind
        self._cache: dict[str, bytes] = {}

    def body(self, prompt: Prompt) -> bytes:
        b = self._cache.get(prompt.id)
        if b is None:
            b = json.dumps(speech_payload(prompt.text, self._voice, model=self._model, language=self._language,
                                          mode=self._mode, kind=self._kind)).encode()
            self._cache[prompt.id] = b
        return b


# The request kinds an experiment can name (`request:`), in the order preflight falls back through them: Base with
# reference audio and its transcript (voice clone, the default) -> Base with the speaker embedding only
# (x_vector_only_mode: no transcript, public reports tie the 0.16.0 failures to that path) -> a CustomVoice model with
# a built-in speaker (no reference audio at all; the same 12 Hz tokenizer and code predictor as the 0.6B Base model).
REQUEST_KINDS = ("base", "base_xvector", "custom_voice")
CUSTOM_VOICE_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
CUSTOM_VOICE_SPEAKER = "Vivian"  # one of the CustomVoice models' built-in speakers (Qwen3-TTS model card)


def speech_payload(text: str, voice: Voice, *, model: str, language: str, mode: str, kind: str = "base") -> dict:
    """POST /v1/audio/speech body of one request kind (REQUEST_KINDS); stream requires pcm on vllm-omni.

    Streaming names stream_format "audio" (raw PCM chunks): 0.16.0's default, but from 0.30.0 on `stream: true`
    alone means SSE events (vllm-omni 0.30.0 protocol/audio.py; tests/upstream checks both request models).
    """
    if kind not in REQUEST_KINDS:
        raise ValueError(f"request kind {kind!r} is not one of {list(REQUEST_KINDS)}")
    body: dict = {"model": model, "input": text}
    if kind == "custom_voice":
        body.update(task_type="CustomVoice", voice=CUSTOM_VOICE_SPEAKER)
    else:
        body.update(task_type="Base", ref_audio=voice.data_uri)
        if kind == "base":
            body["ref_text"] = voice.transcript
        else:
            body["x_vector_only_mode"] = True
    body.update(language=language, response_format="pcm" if mode == "stream" else "wav", stream=mode == "stream")
    if mode == "stream":
        body["stream_format"] = "audio"
    return body
