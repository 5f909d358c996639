"""What a variant's window shows on /metrics: the control epoch the server applied, calls under the variant's label
only, and its sync signature (syncs over the observed calls equal to the variant's closed form)."""

from __future__ import annotations

from loadtest.scraper import http_get, parse_metrics
from tts_predictor import metrics as pm
from ttsrecords.outcomes import signature_holds
from ttsrecords.samples import by_label, gauge, total


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    return parse_metrics(http_get(url.rstrip("/") + "/metrics", 10.0))[1]


def sync_signature(before, after, variant: str, epoch: int | None) -> tuple[str, str, str | None]:
    """(status, detail, fix) for one variant's window: epoch confirmed, calls under its label only, syncs over the
    observed calls equal to metrics.expected_syncs within outcomes.SYNC_TOLERANCE."""
    names = {n for n, _, _ in after}
    if pm.CALLS not in names:
        return ("fail", "/metrics has no tts_predictor_* series",
                "the tts_predictor plugin is not loaded: the image must be docker/Dockerfile's (0.16.0 + plugin); "
                "the server log shows the plugin's start-up line or its PluginError")
    if epoch is not None:
        shown = gauge(after, pm.CONTROL_EPOCH)
        if shown is None or int(shown) != epoch:
            return ("fail", f"{pm.CONTROL_EPOCH} shows {shown}, the control file says epoch {epoch}: the server did not "
                    "apply the control file", "the server must read the control file (sim: --control; docker: "
                    "CONTROL_DIR mounts it and sets TTS_PREDICTOR_CONTROL); the server log shows 'change refused' lines")
    c0, c1 = by_label(before, pm.CALLS, "variant"), by_label(after, pm.CALLS, "variant")
    moved = sorted(v for v in c1 if c1[v] - c0.get(v, 0.0) > 0)
    if moved != [variant]:
        return ("fail", f"calls moved under {moved or 'no label'}, expected only {variant!r}",
                "the variant switch did not take effect at a step boundary: compare the control file with "
                "tts_predictor_active_variant and the server log")
    calls = (total(after, pm.OBSERVED_CALLS) or 0.0) - (total(before, pm.OBSERVED_CALLS) or 0.0)
    tokens = (total(after, pm.OBSERVED_TOKENS) or 0.0) - (total(before, pm.OBSERVED_TOKENS) or 0.0)
    syncs = (total(after, pm.SYNCS) or 0.0) - (total(before, pm.SYNCS) or 0.0)
    n_calls = c1[variant] - c0.get(variant, 0.0)
    if calls <= 0:
        return ("fail", f"{n_calls:g} calls under {variant}, none observed by the sync sampler",
                "the observer is off: the control file's observe must be true and TTS_PREDICTOR_SYNC_SAMPLE > 0")
    holds, expected = signature_holds(variant, syncs, calls, tokens)
    detail = (f"epoch {epoch} live; {n_calls:g} calls under {variant} only; {syncs:g} syncs over {calls:g} observed "
              f"calls ({tokens:g} tokens), expected {expected:g}")
    if not holds:
        return ("fail", detail + f" ({syncs / calls:.2f} vs {expected / calls:.2f} per call)",
                "a different build_attn_metadata ran than the variant claims: rebuild the image from this checkout "
                "and check the GPU's attention backend (docs/gpu-host.md, 'Attention backend')")
    return "pass", detail, None
