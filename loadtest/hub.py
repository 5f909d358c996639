"""The Hugging Face hub's current commit of a model: what `make preflight PREPARE=1` offers to pin as MODEL_REVISION.

One GET of `<endpoint>/api/models/<model>/revision/<ref>` (JSON with the commit in "sha"), bounded by a timeout.
The endpoint is HF_ENDPOINT when set (the variable huggingface_hub reads, for mirrors), else https://huggingface.co.
No token is sent: the model is public, and HF_TOKEN goes to the model download only (docs/gpu-host.md). Never raises:
a failure is a one-line reason that says how to set MODEL_REVISION by hand.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from loadtest.experiment import REVISION_PATTERN

DEFAULT_ENDPOINT = "https://huggingface.co"
ENDPOINT_ENV = "HF_ENDPOINT"
TIMEOUT_S = 15.0
_MAX_BYTES = 1 << 20  # the revision document is a few kB; a larger answer is not it


@dataclass(frozen=True)
class Resolved:
    """sha: the 40-hex commit, or None with `error` saying why; url: what was asked."""

    model: str
    ref: str
    url: str
    sha: str | None
    error: str | None = None


def endpoint() -> str:
    return (os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")


def revision_url(model: str, ref: str = "main", base: str | None = None) -> str:
    return f"{(base or endpoint()).rstrip('/')}/api/models/{model}/revision/{urllib.parse.quote(ref, safe='')}"


def by_hand(model: str) -> str:
    """How to pin without this machine reaching the hub."""
    return (f"look the commit up where the hub is reachable (https://huggingface.co/{model}/commits/main, or "
            f"`git ls-remote https://huggingface.co/{model} HEAD`) and `export MODEL_REVISION=<40-hex commit>`")


def resolve(model: str, ref: str = "main", *, base: str | None = None, timeout_s: float = TIMEOUT_S) -> Resolved:
    """The commit `ref` of `model` points at now, per the hub's API."""
    url = revision_url(model, ref, base)

    def fail(why: str) -> Resolved:
        return Resolved(model, ref, url, None, f"could not resolve {model}@{ref} from {url}: {why}; {by_hand(model)}")

    if not url.startswith(("http://", "https://")):
        return fail(f"{ENDPOINT_ENV} must be an http(s) URL")
    req = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "tts-loadtest-preflight"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (http(s) only, checked above)
            body = resp.read(_MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        return fail(f"HTTP {e.code} {e.reason}")
    except urllib.error.URLError as e:
        return fail(f"unreachable ({e.reason})")
    except (TimeoutError, OSError) as e:
        return fail(f"no answer within {timeout_s:g} s" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}")
    if len(body) > _MAX_BYTES:
        return fail("the answer is larger than a revision document")
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return fail("the answer is not JSON")
    sha = doc.get("sha") if isinstance(doc, dict) else None
    if not isinstance(sha, str) or not REVISION_PATTERN.fullmatch(sha):
        return fail(f"the answer has no 40-hex \"sha\" (got {str(sha)[:60]!r})")
    return Resolved(model, ref, url, sha)
