"""The runner's resume and rerun policy: which windows a resumed run or a failed round repeats. The runner applies
it; the planner records it in the manifest (resume_policy), so a run folder says what rule its windows ran under."""

from __future__ import annotations

DONE = ("complete", "invalid")  # a resumed run never repeats these: their load ran; a rerun would only hide the cause
# A window that failed (infrastructure) reruns its whole round at once, in a new attempt, this many times; after that
# the round keeps its failure (a server that never starts is not retried forever) and the run goes on.
FAILED_RERUNS_MAX = 1
RESUME_POLICY = {"never_rerun": list(DONE), "always_rerun": ["interrupted"], "failed_reruns_max": FAILED_RERUNS_MAX,
                 "how": "a failed window reruns its whole round at once (both windows), at most failed_reruns_max "
                        "times (block.json attempt); earlier attempts are kept under attempts/. On a resume, design "
                        "fresh runs each window not done; swap and nested rerun every round not done as a whole "
                        "(its two windows belong in one server start)"}
