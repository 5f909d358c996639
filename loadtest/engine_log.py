"""What a server's log says about its engine: started (every stage initialised) or dead.

vllm-omni's `/health` checks nothing (0.16.0 entrypoints/async_omni.py), and on a start-up timeout it only warns and
serves anyway (entrypoints/omni.py), so the log is where a start tells whether its stages came up, and where an engine
that died on a request (a Base request on 0.16.0, per public reports) says so while `/health` still answers 200.
The lines, restated from the releases' sources:
- ready: "[<Orchestrator>] All stages initialized successfully" (vllm-omni 0.16.0 entrypoints/omni.py,
  _wait_for_stages_ready), "[OmniEngine] Orchestrator ready with 2 stages" (0.30.0 engine/omni_engine_base.py);
  the simulator prints "ttssim: all stages initialized" once it listens
- not ready: "Initialization timeout: 1/2 stages ready" (the same function, on timeout)
- dead: "EngineCore encountered a fatal error." (vLLM 0.16.0 v1/engine/core.py), "EngineDeadError" /
  "EngineCore encountered an issue" (v1/engine/exceptions.py), "Engine core initialization failed" (v1/engine/utils.py),
  "Engine core proc ... died unexpectedly" (v1/engine/core_client.py)
"""

from __future__ import annotations

import re

READY = re.compile(r"All stages initialized successfully|Orchestrator ready with \d+ stages"
                   r"|ttssim: all stages initialized")
STAGE_TIMEOUT = re.compile(r"Initialization timeout: \d+/\d+ stages ready")
DEAD = re.compile(r"EngineCore encountered a fatal error|EngineDeadError|EngineCore encountered an issue"
                  r"|Engine core initialization failed|Engine core proc \S+ died unexpectedly")


def _line_of(text: str, m: re.Match) -> str:
    end = text.find("\n", m.end())
    return text[text.rfind("\n", 0, m.start()) + 1:len(text) if end < 0 else end].strip()[:300]


def dead_line(log_text: str | None) -> str | None:
    """The first line that says the engine died, None while it lives (as far as the log says)."""
    m = DEAD.search(log_text or "")
    return _line_of(log_text or "", m) if m else None


def stages_state(log_text: str | None) -> tuple[str, str | None]:
    """("ready" | "timeout" | "dead" | "unknown", the line that says so)."""
    text = log_text or ""
    for state, pattern in (("dead", DEAD), ("timeout", STAGE_TIMEOUT), ("ready", READY)):
        m = pattern.search(text)
        if m:
            return state, _line_of(text, m)
    return "unknown", None
