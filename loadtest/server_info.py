"""What the server says it is, read once from its /metrics when a run starts: variant, version, backend, device.

The variant a run's records carry comes from here, not from a label typed on the command line: `tts_predictor_info`'s
variant (the simulator, the plugin in one process), else the one variant the predictor's call counters are labelled
with (the plugin under Prometheus multiprocess mode, which does not export Info), else "not reported". `--variant`
is then a check (`variant_conflict`). A hot-swapping run (`--control`) names the variant itself and skips the check.
"""

from __future__ import annotations

from tts_predictor import metrics as pm
from ttsrecords.loadrun import NOT_REPORTED, ServerIdentity

CONTROLLED = "controlled"  # the plugin's info label when its control file picks the variant (tts_predictor.plugin)
METRICS_TIMEOUT_S = 10.0


def identity_from_text(text: str, source: str) -> ServerIdentity:
    """The identity in one /metrics exposition (pure: parses the text only)."""
    from loadtest.scraper import parse_metrics

    _, rows = parse_metrics(text)
    info = next((labels for name, labels, _ in rows if name == pm.INFO), {})
    variant = info.get("variant") or ""
    if not variant or variant == CONTROLLED:
        labelled = sorted({labels.get("variant") for name, labels, _ in rows
                           if name == pm.CALLS and labels.get("variant")})
        variant = labelled[0] if len(labelled) == 1 else ""
    server = info.get("server") or ""
    backend = info.get("backend") or ""
    return ServerIdentity(variant=variant or NOT_REPORTED, version=server or NOT_REPORTED,
                          backend=backend or NOT_REPORTED, device=info.get("device") or NOT_REPORTED, source=source)


def read_identity(metrics_url: str | None, *, get=None) -> ServerIdentity:
    """The identity from `metrics_url`; never raises (a server without /metrics reports nothing, and says why)."""
    if not metrics_url:
        return ServerIdentity(source="no /metrics URL (--metrics-url none)")
    import httpx

    try:
        resp = (get or httpx.get)(metrics_url, timeout=METRICS_TIMEOUT_S)
        if resp.status_code != 200:
            return ServerIdentity(source=f"{metrics_url} answered HTTP {resp.status_code}")
        return identity_from_text(resp.text, metrics_url)
    except Exception as e:  # noqa: BLE001  (an unreadable /metrics means: nothing reported)
        return ServerIdentity(source=f"{metrics_url} could not be read ({type(e).__name__})")


def variant_conflict(given: str | None, ident: ServerIdentity) -> str | None:
    """The one-line refusal when --variant names another variant than the server reports; None when they agree or
    the server reports none."""
    if not given or ident.variant == NOT_REPORTED or given == ident.variant:
        return None
    return (f"--variant {given} but the server reports variant {ident.variant} on {ident.source}: its records would "
            f"carry the wrong label (leave --variant out to take the server's)")


def with_label(ident: ServerIdentity, given: str | None) -> tuple[ServerIdentity, str | None]:
    """(identity with its variant_source, the label the records carry): the server's variant when it reports one,
    else --variant when given, else none."""
    from dataclasses import replace

    if ident.variant != NOT_REPORTED:
        return replace(ident, variant_source="server"), ident.variant
    if given:
        return replace(ident, variant_source="--variant (the server reports none)"), given
    return replace(ident, variant_source="none"), None
