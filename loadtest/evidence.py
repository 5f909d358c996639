"""What an arm ran, proven and recorded: the manipulation check over a block's server log and /metrics
(check_evidence), the run manifest's record of an arm (arm_manifest: plugin or none, base image pinned by digest or
by tag only, executor, compile cache), and what sets each request's audio length (length_control, length_warning),
so a report can tell a faster arm from one that made shorter audio.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from loadtest.experiment import CPU_BACKEND, CPU_WHAT, PLUGIN_VERSION, Arm, Evidence
from tts_predictor.domain import VARIANT_NAMES
from tts_predictor.plugin import ENV_SKIP_SOURCE_CHECK
from ttsrecords import cpuserver
from ttsrecords.paths import ROOT
from ttsrecords.samples import total

# ----------------------------------------------------------------------------------------------- evidence


def describe(ev: Evidence) -> str:
    """The evidence in words, for dry runs, manifests and the check's reason."""
    parts = []
    if ev.sync_signature:
        parts.append(f"sync counters = {ev.sync_signature}'s closed form")
    parts += [f"log has /{p}/" for p in ev.log_present] + [f"log lacks /{p}/" for p in ev.log_absent]
    parts += [f"metric {m} > 0" for m in ev.metric_present]
    return "; ".join(parts)


def check_evidence(arm: Arm, server_log_text: str | None, metrics_samples) -> tuple[bool, str]:
    """The arm's manipulation check over one block: its server log and its last /metrics snapshot.

    metrics_samples: rows (sample name, labels, value) of one scrape at the block's end (loadtest.scraper
    parse_metrics(text)[1]); the server is fresh per block, so counters are the block's totals. A block whose arm
    fails this check is invalid: the reason says which item failed.
    """
    ev = arm.evidence
    log = server_log_text or ""
    rows = list(metrics_samples or [])
    for pattern in ev.log_present:
        if not re.search(pattern, log, re.M):
            return False, f"the server log has no line matching /{pattern}/"
    for pattern in ev.log_absent:
        m = re.search(pattern, log, re.M)
        if m:
            end = log.find("\n", m.end())
            line = log[log.rfind("\n", 0, m.start()) + 1:len(log) if end < 0 else end].strip()
            return False, f"the server log has a line matching /{pattern}/: {line[:200]}"
    for name in ev.metric_present:
        v = total(rows, name)
        if v is None:
            return False, f"metric {name} is not exposed"
        if v <= 0:
            return False, f"metric {name} is {v:g}, not > 0"
    if ev.sync_signature:
        from tts_predictor import metrics as pm
        from ttsrecords.outcomes import signature_holds

        # the variants that ran calls, and the one the info metric names (a server on a control file names no
        # variant there: its info says "controlled"; labels a plugin creates at zero ran nothing)
        variants = {labels.get("variant") for n, labels, v in rows
                    if (n == pm.CALLS and v > 0 or n == pm.INFO) and labels.get("variant") in VARIANT_NAMES}
        if variants != {ev.sync_signature}:
            return False, (f"the server reports variant(s) {sorted(variants)}, expected {ev.sync_signature}"
                           if variants else "the server exposes no tts_predictor counters (plugin not loaded?)")
        syncs, calls, tokens = (total(rows, n) for n in (pm.SYNCS, pm.OBSERVED_CALLS, pm.OBSERVED_TOKENS))
        if syncs is None or calls is None or tokens is None:
            return False, "the sync counters are missing"
        if calls <= 0:
            return False, "no call was observed by the sync sampler"
        holds, expected = signature_holds(ev.sync_signature, syncs, calls, tokens)
        if not holds:
            return False, (f"{syncs:g} syncs over {calls:g} observed calls ({tokens:g} tokens); "
                           f"{ev.sync_signature} means {expected:g}")
    return True, "evidence holds: " + describe(ev)


# ----------------------------------------------------------------------------------------------- the manifest's record of an arm


def pinned_digest(base_image: str | None) -> str | None:
    """The sha256 digest a base image reference pins (`repo:tag@sha256:...`), None for a tag-only reference."""
    if not base_image or "@" not in base_image:
        return None
    return base_image.split("@", 1)[1]


def pin_warning(arm: Arm) -> str | None:
    """A tag can be re-pushed, so two runs of the same file may run different images; only a digest pins."""
    if arm.backend != "vllm" or pinned_digest(arm.base_image):
        return None
    return (f"arm {arm.name}: base image {arm.base_image} is pinned by tag only (a tag can be re-pushed); write "
            f"base_image: {arm.base_image}@sha256:<digest> (docs/gpu-host.md, \"Pinning the base images\")")


def local_digests(image: str, run=subprocess.run) -> list[str]:
    """The repository digests Docker holds for a pulled image (`docker image inspect .RepoDigests`); [] when Docker
    or the image is not there. What a tag-only arm actually ran, recorded next to the tag."""
    try:
        p = run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image], capture_output=True,
                text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if p.returncode != 0:
        return []
    try:
        found = json.loads(p.stdout or "[]") or []
    except ValueError:
        return []
    return sorted(d for d in found if isinstance(d, str) and "@sha256:" in d)


# docker/serve.sh says before each start whether the image's compile-cache folder held anything (warm) or not (cold)
_CACHE_LINE = re.compile(r"^serve\.sh: compile cache (cold|warm): ", re.M)


def compile_cache_state(server_log_text: str | None) -> str | None:
    """"cold" or "warm" for a start of docker/serve.sh (its server log), None when the log does not say."""
    m = _CACHE_LINE.search(server_log_text or "")
    return m.group(1) if m else None


def arm_manifest(arm: Arm) -> dict[str, Any]:
    """The arm as the run manifest records it; says whether our plugin is in the image, and why not when it is not."""
    if arm.backend == "sim":
        return {"arm": arm.name, "label": arm.label, "backend": "sim", "simulated": True,
                "simulated_from": arm.simulated_from, "variant": arm.variant,
                "sim_config": arm.sim.config if arm.sim else None, "sim_set": list(arm.sim.set) if arm.sim else [],
                "length_control": length_control(arm), "evidence": describe(arm.evidence)}
    if arm.backend == CPU_BACKEND:
        # executor and the thread/wait env the server gets from serve.py and from this process's environment
        settings = cpuserver.recorded(arm.executor or cpuserver.DEFAULT_EXECUTOR, PLUGIN_VERSION, os.environ)
        return {"arm": arm.name, "label": arm.label, "backend": CPU_BACKEND, "simulated": False,
                "vllm_omni": PLUGIN_VERSION, "what": CPU_WHAT, "plugin": f"installed, variant {arm.variant}",
                "variant": arm.variant, "stages": cpuserver.STAGES, "host_delay_us": arm.host_delay_us,
                **settings, "length_control": length_control(arm), "evidence": describe(arm.evidence)}
    plugin = (f"installed, variant {arm.variant}" if arm.vllm_omni == PLUGIN_VERSION else
              f"none: vllm-omni {arm.vllm_omni} has no _LocalPredictorKVCache to patch (removed by #1617)")
    return {"arm": arm.name, "label": arm.label, "backend": "vllm", "simulated": False, "vllm_omni": arm.vllm_omni,
            "base_image": arm.base_image, "base_image_digest": pinned_digest(arm.base_image),
            "base_image_pin": "digest" if pinned_digest(arm.base_image) else "tag only",
            "pin_warning": pin_warning(arm), "image": arm.image, "plugin": plugin,
            "plugin_source_check": "skipped" if dict(arm.env).get(ENV_SKIP_SOURCE_CHECK) == "1" else "on",
            "stages": arm.stages, "executor": _stage_executor(arm),
            "deploy": arm.deploy, "server_args": list(arm.server_args), "env": dict(arm.env),
            "host_delay_us": arm.host_delay_us, "length_control": length_control(arm),
            "evidence": describe(arm.evidence)}


def _stage_executor(arm: Arm) -> str | None:
    """The executor a 0.16.0 arm's stage file names ("mp", "uni"; "mixed: ..." when its stages differ), None for a
    deploy-file arm (the release's default unless server_args say otherwise)."""
    if arm.vllm_omni != PLUGIN_VERSION or not arm.stages:
        return None
    found = executors_of(ROOT / "configs/stages" / arm.stages, PLUGIN_VERSION)
    names = sorted({str(x) for x in found})
    return names[0] if len(names) == 1 else "mixed: " + ", ".join(str(x) for x in found)


def executors_of(config: Path, release: str) -> list[str | None]:
    """The executor each stage of a stage/deploy file names (None where it names none: vLLM's choice)."""
    data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    if release == PLUGIN_VERSION:
        return [(st.get("engine_args") or {}).get("distributed_executor_backend") for st in data.get("stage_args") or []]
    return [data.get("distributed_executor_backend")] * max(1, len(data.get("stages") or []))


# ----------------------------------------------------------------------------------------------- output length

# What sets the length of a request's audio, per release. 0.16.0 builds the talker's sampling params from the stage
# file and never passes the request's max_new_tokens to it (its speech route validates the field, then the talker
# runs to the stage's max_tokens or the codec end id); 0.30.0 honours the request's max_new_tokens; 0.32.0rc1 does and
# also caps a runaway output. Requests of this suite send no max_new_tokens (loadtest.prompts.speech_payload).
STAGE_LENGTH = "stage max_tokens"
REQUEST_LENGTH = "request max_new_tokens"
RELEASE_LENGTH = {PLUGIN_VERSION: (STAGE_LENGTH, None), "0.30.0": (REQUEST_LENGTH, None),
                  "0.32.0rc1": (REQUEST_LENGTH, "Base: at most 12 codec frames per text token, at least 192")}
REQUEST_MAX_NEW_TOKENS = None  # what every request sends: nothing, so the release's (or the simulator's) default


def _talker_max_tokens(stage_file: Path) -> int | None:
    """The talker stage's (stage_id 0) default_sampling_params.max_tokens of a 0.16.0 stage file, None if absent."""
    data = yaml.safe_load(stage_file.read_text(encoding="utf-8")) or {}
    for st in data.get("stage_args") or []:
        if isinstance(st, dict) and st.get("stage_id") == 0:
            v = (st.get("default_sampling_params") or {}).get("max_tokens")
            return v if isinstance(v, int) else None
    return None


def length_control(arm: Arm) -> dict[str, Any]:
    """The length control this arm's release honours: `honours` (STAGE_LENGTH | REQUEST_LENGTH), `max_frames` (the
    codec frames every request may run to, None: the release's own default), `source` (where the number comes from),
    `cap` (a release's own limit on runaway outputs, or None) and `text` (the three in words)."""
    if arm.backend == "sim":
        from ttssim.config import load_config

        try:
            cfg = load_config(ROOT / arm.sim.config if arm.sim and arm.sim.config else None,
                              list(arm.sim.set) if arm.sim else [])
        except (OSError, ValueError) as e:  # the server refuses the same settings at its start, where the run says so
            cfg, why = None, str(e)
        lc = {"honours": REQUEST_LENGTH,
              "max_frames": REQUEST_MAX_NEW_TOKENS or (cfg.audio.default_max_new_tokens if cfg else None),
              "source": "the simulator's audio.default_max_new_tokens (requests send none)" if cfg else
                        f"the simulator's config did not load ({why})", "cap": None}
    elif arm.backend == CPU_BACKEND or arm.vllm_omni == PLUGIN_VERSION:
        stages = cpuserver.STAGES if arm.backend == CPU_BACKEND else f"configs/stages/{arm.stages}"
        lc = {"honours": STAGE_LENGTH, "max_frames": _talker_max_tokens(ROOT / stages),
              "source": f"{stages}: talker (stage 0) default_sampling_params.max_tokens", "cap": None}
    else:
        honours, cap = RELEASE_LENGTH[arm.vllm_omni]
        lc = {"honours": honours, "max_frames": REQUEST_MAX_NEW_TOKENS,
              "source": f"vllm-omni {arm.vllm_omni}: the request's max_new_tokens (requests send none: the "
                        "release's default)", "cap": cap}
    n = "its default" if lc["max_frames"] is None else f"{lc['max_frames']} frames"
    return {**lc, "text": f"{lc['honours']} ({n}{', capped ' + lc['cap'] if lc['cap'] else ''})"}


def length_warning(arms: dict[str, Arm]) -> str | None:
    """A warning when the arms' length controls differ: audio per request can then differ for reasons that are not
    speed (the report compares audio seconds per prompt between the arms)."""
    controls = {name: length_control(arm) for name, arm in arms.items()}
    keys = {(c["honours"], c["max_frames"], c["cap"]) for c in controls.values()}
    if len(keys) <= 1:
        return None
    return ("the arms set audio length differently (" + "; ".join(f"{n}: {c['text']}" for n, c in
                                                                   controls.items())
            + "): audio per request can differ for reasons that are not speed; the report compares audio seconds "
              "per prompt between the arms")
