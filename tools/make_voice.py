"""Regenerate the reference voice clip: espeak-ng speech, resampled to 24 kHz mono PCM16.

The clip is committed; this exists so anyone can see (and redo) how it was made:
    python -m tools.make_voice [--out configs/voices]
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

from tts_predictor.domain import SAMPLE_RATE_HZ as RATE

TRANSCRIPT = "The quick brown fox jumps over the lazy dog."


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Band-limited resampling in the frequency domain (the clip is short; no scipy needed)."""
    n_out = int(round(len(x) * sr_out / sr_in))
    spec = np.fft.rfft(x)
    out_bins = n_out // 2 + 1
    if out_bins <= len(spec):
        spec = spec[:out_bins]
    else:
        spec = np.concatenate([spec, np.zeros(out_bins - len(spec), dtype=spec.dtype)])
    return np.fft.irfft(spec, n_out) * (n_out / len(x))


def synthesize(text: str = TRANSCRIPT) -> np.ndarray:
    """Return int16 mono samples at 24 kHz for `text` spoken by espeak-ng."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise SystemExit("espeak-ng not found: run scripts/system-deps.sh")
    wav = subprocess.run([exe, "-v", "en-us", "-s", "150", "--stdout", text], check=True, capture_output=True).stdout
    data, sr = sf.read(io.BytesIO(wav), dtype="float64", always_2d=True)
    mono = data.mean(axis=1)
    out = resample(mono, sr, RATE)
    peak = float(np.max(np.abs(out))) or 1.0
    return np.clip(out / peak * 0.9 * 32767, -32768, 32767).astype(np.int16)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="configs/voices")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pcm = synthesize()
    sf.write(out / "ref.wav", pcm, RATE, subtype="PCM_16")
    meta = {
        "schema": "tts-voice/1",
        "audio": "ref.wav",
        "transcript": TRANSCRIPT,
        "language": "English",
        "sample_rate": RATE,
        "made_with": "espeak-ng -v en-us -s 150, resampled to 24 kHz mono PCM16 by tools/make_voice.py",
    }
    (out / "ref.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    print(f"wrote {out / 'ref.wav'} ({len(pcm) / RATE:.2f} s) and {out / 'ref.yaml'}")


if __name__ == "__main__":
    main()
