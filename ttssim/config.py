"""Simulator configuration: typed sections, defaults equal to configs/sim/default.yaml (a test keeps them equal).

A YAML file and `--set section.key=value` overrides are merged over the defaults; an unknown key is an error, so a
typo never silently runs the default model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass(frozen=True)
class ModelConfig:
    name: str = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
    max_batch_size: int = 256
    max_waiting: int = 1024
    max_prefills_per_step: int = 16
    base_ms: float = 2.5
    per_request_ms: float = 1.05
    prefill_ms: float = 8.0
    code2wav_chunk_ms: float = 6.0
    stall_us_per_sync: float = 15.0
    extra_step_ms: float = 0.0
    extra_step_pct: float = 0.0
    block_size: int = 16
    max_seq_len: int = 16


@dataclass(frozen=True)
class AudioConfig:
    sample_rate: int = 24000
    frame_rate_hz: int = 12
    chunk_frames: int = 25
    frames_per_char: float = 0.8
    min_frames: int = 12
    default_max_new_tokens: int = 2048
    max_input_chars: int = 4096
    max_ref_audio_s: float = 60.0

    @property
    def samples_per_frame(self) -> int:
        return self.sample_rate // self.frame_rate_hz


@dataclass(frozen=True)
class ServerConfig:
    max_body_bytes: int = 32 * 1024 * 1024
    ref_audio_fetch_timeout_s: float = 15.0
    ref_audio_max_bytes: int = 50 * 1024 * 1024
    voices: tuple = ()
    sync_sample_every_steps: int = 10
    sync_sample_calls: str = "one"


@dataclass(frozen=True)
class FaultConfig:
    kill_after_steps: int | None = None
    hang_after_requests: int | None = None
    error_burst: dict | None = None
    cut_stream_every: int = 0
    malformed_audio_every: int = 0
    slow_readiness_s: float = 0.0


@dataclass(frozen=True)
class SimConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTIONS = {"model": ModelConfig, "audio": AudioConfig, "server": ServerConfig, "faults": FaultConfig}


def _coerce(section: str, key: str, value, default):
    """Check a value against its default's type (ints are accepted for floats)."""
    where = f"{section}.{key}"
    if default is None:  # optional fault knobs
        if value is None:
            return None
        if key == "error_burst":
            if not isinstance(value, dict):
                raise ValueError(f"{where} must be a mapping like {{after: 10, length: 5, status: 500}}")
            unknown = set(value) - {"after", "length", "status", "every"}
            if unknown:
                raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
            burst = {"after": 0, "length": 1, "status": 500, "every": 0, **value}
            for k, v in burst.items():
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"{where}.{k} must be a non-negative int, got {v!r}")
            if not 500 <= burst["status"] <= 599:
                raise ValueError(f"{where}.status must be a 5xx code, got {burst['status']}")
            return burst
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where} must be a non-negative int or null, got {value!r}")
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, tuple):
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ValueError(f"{where} must be {type(default).__name__}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # YAML's .nan / .inf: no model time or limit means it
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        raise ValueError(f"{where} must not be negative, got {value!r}")
    return value


def _merge(data: dict, base: SimConfig) -> SimConfig:
    if not isinstance(data, dict):
        raise ValueError("a simulator config must be a mapping of sections")
    out = {}
    for section, cls in _SECTIONS.items():
        current = getattr(base, section)
        values = data.get(section) or {}
        if not isinstance(values, dict):
            raise ValueError(f"section {section!r} must be a mapping")
        known = {f.name: getattr(current, f.name) for f in dataclasses.fields(cls)}
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown keys in section {section!r}: {sorted(unknown)}")
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        merged = dict(known)
        for k, v in values.items():
            merged[k] = _coerce(section, k, v, defaults[k])
        out[section] = cls(**merged)
    unknown = set(data) - set(_SECTIONS)
    if unknown:
        raise ValueError(f"unknown config sections: {sorted(unknown)}")
    cfg = SimConfig(**out)
    _check(cfg)
    return cfg


def _check(cfg: SimConfig) -> None:
    m, a, s = cfg.model, cfg.audio, cfg.server
    if m.max_batch_size < 1 or m.max_prefills_per_step < 1 or m.block_size < 1 or m.max_seq_len < 2:
        raise ValueError("model.max_batch_size, max_prefills_per_step, block_size must be >= 1, max_seq_len >= 2")
    if a.sample_rate % a.frame_rate_hz:
        raise ValueError("audio.sample_rate must be a multiple of audio.frame_rate_hz")
    if a.chunk_frames < 1 or a.min_frames < 1 or not 1 <= a.default_max_new_tokens <= 4096:
        raise ValueError("audio.chunk_frames and min_frames must be >= 1, default_max_new_tokens in 1..4096")
    if s.sync_sample_every_steps < 1 or s.sync_sample_calls not in ("one", "all"):
        raise ValueError("server.sync_sample_every_steps must be >= 1 and sync_sample_calls 'one' or 'all'")


def parse_override(text: str) -> dict:
    """`model.extra_step_ms=2.5` -> {"model": {"extra_step_ms": 2.5}} (the value is parsed as YAML)."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise ValueError(f"--set wants section.key=value, got {text!r}")
    return {parts[0]: {parts[1]: yaml.safe_load(raw)}}


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> SimConfig:
    """Defaults, then the YAML file, then each override in order."""
    cfg = SimConfig()
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        cfg = _merge(yaml.safe_load(text) or {}, cfg)
    for item in overrides:
        cfg = _merge(parse_override(item), cfg)
    _check(cfg)
    return cfg
