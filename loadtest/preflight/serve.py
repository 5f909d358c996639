"""The server checks: one server per start through the one harness (loadtest.server_process), ready by /health and
the log's stages line; the variants in turn through its control file (hot swap) or a plain arm's requests and
evidence; the telemetry the runner will sample; the stop, and the host's /dev/shm compared with before the start.
STARTED lists every server this process started, so the command line stops them whatever happens."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from loadtest.client import HttpxTransport, run_request
from loadtest.evidence import check_evidence
from loadtest.experiment import CPU_BACKEND, CPU_WHAT, HEALTH_TIMEOUT_S, SIM_READY_S, Arm, Experiment
from loadtest.launch import server_launch
from loadtest.preflight.host import MIB
from loadtest.preflight.metrics import scrape, sync_signature
from loadtest.preflight.report import Report, Shell, last_line
from loadtest.preflight.requests import LOG_READ_CHARS, engine_dead, request_check
from loadtest.readiness import REQUEST_TIMEOUT_S, Probe, wait_stages
from loadtest.server_process import ServerError, ServerProcess, ServerSpec, free_port
from loadtest.telemetry import Nvml, gpus_spec
from tts_predictor import metrics as pm
from tts_predictor.control import write_control
from tts_predictor.domain import VARIANT_NAMES
from ttsrecords.samples import total

EXTRA_REQUESTS = 4  # more streamed requests while the sync sampler has not observed a call yet
STARTED: list[ServerProcess] = []  # every server this process started: stopped on the way out, whatever happens


@dataclass
class Server:
    arm: Arm
    process: ServerProcess
    control: Path | None
    simulated: bool
    shm_before: set[str] | None = None  # the host's /dev/shm entries before the start


SHM = Path("/dev/shm")


def shm_entries() -> set[str] | None:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return None


def start_server(rep: Report, shell: Shell, exp: Experiment, arm: Arm, folder: Path, variant: str | None,
                 *, hot_swap: bool) -> Server | None:
    """One server of `arm` through the one harness; hot_swap: with a control file (variant, observe off, epoch 0)."""
    name = f"server.{arm.name}"
    control = None
    if hot_swap:
        control_dir = folder / f"control-{arm.name}"
        control = control_dir / "control.json"
    if arm.backend == "sim":
        port_file = folder / f"{arm.name}.port"
        launch = server_launch(exp, arm, 0, port_file=str(port_file))
        argv = list(launch.argv) + (["--control", str(control)] if control else [])
        spec = ServerSpec(cmd=argv, env=None, port_file=port_file, stop_wait_s=launch.stop_timeout_s)
        ready_s = SIM_READY_S
    else:
        port = free_port()
        launch = server_launch(exp, arm, port, control_dir=str(control.parent) if control else None)
        spec = ServerSpec(cmd=list(launch.argv), env={**os.environ, **launch.env}, port=port,
                          stop_wait_s=launch.stop_timeout_s)
        ready_s = float(HEALTH_TIMEOUT_S) + 60.0
    if shell.dry_run:
        if control:
            shell.print_line(f"# write {control}: {{\"variant\": \"{variant}\", \"observe\": false, \"epoch\": 0}}")
        shell.show(spec.cmd, launch.env if arm.backend != "sim" else None)
        shell.print_line(f"# wait for {launch.health_url.replace(':0/', ':<port>/')} (up to {ready_s:g} s) and the "
                         "log's stages-initialised line, then the requests below; stop: SIGTERM to the process "
                         f"group, {launch.stop_timeout_s:g} s")
        rep.add(name, "skip", "dry run")
        return None
    if control:
        control.parent.mkdir(parents=True, exist_ok=True)
        write_control(control, variant or arm.variant or VARIANT_NAMES[0], observe=False, epoch=0)
    shm_before = shm_entries()
    proc = ServerProcess(spec, folder / f"server-{arm.name}.log")
    STARTED.append(proc)
    t0 = time.monotonic()
    try:
        proc.start()
        proc.wait_ready(ready_s)
        stages = wait_stages(proc, max(10.0, ready_s - (time.monotonic() - t0)))
    except (ServerError, OSError) as e:
        tail = last_line(proc.log_tail())
        proc.stop()
        fix = (f"read {proc.log_path.name}; a simulator that does not start is a bug of this checkout"
               if arm.backend == "sim"
               else "read the server log (the container's last 80 lines are there): a PluginError line means the "
                    "image's vllm-omni differs from 0.16.0; CUDA out of memory: see host.gpu_memory")
        rep.add(name, "fail", f"{e}; last log line: {tail}", fix)
        return None
    what = "SIMULATED (ttssim)" if arm.backend == "sim" else CPU_WHAT if arm.backend == CPU_BACKEND else \
        f"vllm-omni {arm.vllm_omni} ({arm.image})"
    rep.add(name, "pass", f"{what} ready at {proc.url} in {time.monotonic() - t0:.1f} s"
            + (", control file " + control.name if control else "") + f"; stages: {stages[-80:]!r}")
    return Server(arm, proc, control, arm.backend == "sim", shm_before)


def run_variant(rep: Report, shell: Shell, server: Server | None, variant: str, epoch: int, probe: Probe) -> bool:
    """One variant through a hot-swap server: control file, WAV + stream requests, its sync signature. False when
    the engine died (the caller stops the variant loop)."""
    url = "http://127.0.0.1:<port>" if server is None else server.process.url
    if shell.dry_run or server is None:
        shell.print_line(f"# write control.json: {{\"variant\": \"{variant}\", \"observe\": true, \"epoch\": {epoch}}}")
        shell.print_line(f"$ GET {url}/metrics")
        for mode in ("wav", "stream"):
            shell.print_line(f"$ POST {url}/v1/audio/speech  # Base, {mode}: {probe.text!r}, ref_audio data: URI")
        shell.print_line(f"$ GET {url}/metrics  # {pm.CONTROL_EPOCH} == {epoch}; calls under {variant} only; "
                         "syncs = expected_syncs")
        for what in ("wav", "stream", "metrics"):
            rep.add(f"variant.{variant}.{what}", "skip", "dry run")
        return True
    write_control(server.control, variant, observe=True, epoch=epoch)
    transport = HttpxTransport(url, timeout_s=REQUEST_TIMEOUT_S)
    try:
        before = scrape(url)
        for mode in ("wav", "stream"):
            out = request_check(rep, f"variant.{variant}.{mode}", transport, probe, mode, simulated=server.simulated)
            dead = None if out.ok else engine_dead(server)
            if dead:
                rep.add(f"variant.{variant}.metrics", "fail", f"the engine died: {dead}",
                        "the variant loop stops here: every later variant would fail for the wrong reason")
                return False
        after = scrape(url)
        extra = 0
        while extra < EXTRA_REQUESTS and (total(after, pm.OBSERVED_CALLS) or 0.0) \
                <= (total(before, pm.OBSERVED_CALLS) or 0.0) \
                and pm.CALLS in {n for n, _, _ in after}:
            run_request(transport, probe.bodies["stream"], "stream")
            after = scrape(url)
            extra += 1
    except Exception as e:  # /metrics unreachable: the server died
        rep.add(f"variant.{variant}.metrics", "fail", f"/metrics: {type(e).__name__}: {str(e)[:200]}",
                "the server stopped answering: read its log in the preflight folder")
        return engine_dead(server) is None
    finally:
        transport.close()
    status, detail, fix = sync_signature(before, after, variant, epoch)
    rep.add(f"variant.{variant}.metrics", status, detail, fix)
    write_control(server.control, variant, observe=False, epoch=epoch)  # the observer off again, as in timing
    return True


def check_log_evidence(rep: Report, server: Server, arms: list[Arm]) -> None:
    """The plugin arms' log evidence (log_present / log_absent of the experiment file) over the hot-swap server's
    log; their sync signatures were checked per variant above."""
    name = f"server.{server.arm.name}.log_evidence"
    evidence = [replace(a, evidence=replace(a.evidence, sync_signature=None, metric_present=()))
                for a in arms if a.evidence.log_present or a.evidence.log_absent]
    if not evidence:
        rep.add(name, "skip", "the experiment names no log lines for these arms")
        return
    log = server.process.log_tail(LOG_READ_CHARS)
    for arm in evidence:
        ok, reason = check_evidence(arm, log, [])
        if not ok:
            rep.add(name, "fail", f"arm {arm.name}: {reason}", "the server did not run as the experiment file "
                    f"says (evidence of arm {arm.name}); read {server.process.log_path.name}")
            return
    rep.add(name, "pass", "; ".join(f"/{p}/" for p in dict.fromkeys(
        p for a in evidence for p in a.evidence.log_present)) + " in the server log")


def run_plain_arm(rep: Report, shell: Shell, arm: Arm, server: Server | None, probe: Probe) -> None:
    """An arm without the plugin: the requests, then the arm's own evidence (loadtest.evidence.check_evidence)."""
    if shell.dry_run or server is None:
        for what in ("wav", "stream", "evidence"):
            rep.add(f"arm.{arm.name}.{what}", "skip", "dry run")
        return
    transport = HttpxTransport(server.process.url, timeout_s=REQUEST_TIMEOUT_S)
    try:
        for mode in ("wav", "stream"):
            request_check(rep, f"arm.{arm.name}.{mode}", transport, probe, mode, simulated=False)
    finally:
        transport.close()
    try:
        rows = scrape(server.process.url)
    except Exception as e:
        rep.add(f"arm.{arm.name}.evidence", "fail", f"/metrics: {type(e).__name__}: {str(e)[:200]}",
                "the server stopped answering: read its log in the preflight folder")
        return
    ok, reason = check_evidence(arm, server.process.log_tail(LOG_READ_CHARS), rows)
    rep.add(f"arm.{arm.name}.evidence", "pass" if ok else "fail", reason,
            None if ok else "the arm's evidence (experiment file) does not hold on this server: read its log")


def check_telemetry(rep: Report, shell: Shell, server: Server | None, backend: str) -> None:
    if backend == "vllm":
        if shell.dry_run:
            rep.add("telemetry.gpu", "skip", "dry run (NVML: utilisation, SM clock, memory, power of the container's "
                    f"GPU(s), GPUS={gpus_spec()})")
            return
        try:
            import pynvml  # noqa: F401  (the runner's sampler, loadtest.telemetry.Nvml, needs it)
        except ImportError:
            rep.add("telemetry.gpu", "skip", "nvidia-ml-py not installed (the `load` extra brings nvidia-ml-py; "
                    "`make venv` after it is merged)")
            return
        nvml = Nvml.open()  # exactly what the runner samples during a window
        if nvml is None:
            rep.add("telemetry.gpu", "fail", f"NVML did not initialise for GPUS={gpus_spec()} (see the log line "
                    "above)", "the runner samples the GPU through NVML: the driver's libnvidia-ml must be loadable "
                    "by this user")
            return
        rows = nvml.read(time.monotonic())
        rep.add("telemetry.gpu", "pass", "NVML " + "; ".join(
            f"GPU {r.gpu}: {r.gpu_util_pct:.0f} % busy, SM {r.sm_clock_mhz:.0f} MHz, {r.mem_used_mib:.0f} MiB used, "
            f"{r.power_w:.0f} W" if None not in (r.gpu_util_pct, r.sm_clock_mhz, r.mem_used_mib, r.power_w) else
            f"GPU {r.gpu}: some counters unsupported ({r})" for r in rows) + f" (GPUS={gpus_spec()})")
        return
    rep.add("telemetry.gpu", "skip", "simulator: no GPU" if backend == "sim" else "the CPU server: no GPU")
    if shell.dry_run or server is None or server.process.proc is None:
        rep.add("telemetry.process", "skip", "dry run" if shell.dry_run else "blocked: no server")
        return
    pid = server.process.proc.pid
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
        cpu_s = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError) as e:
        rep.add("telemetry.process", "fail", f"/proc/{pid}: {e}",
                "the runner's CPU/RSS telemetry reads /proc: run on Linux with /proc mounted")
        return
    rep.add("telemetry.process", "pass", f"/proc/{pid}: {cpu_s:.1f} s CPU so far, RSS {rss:.0f} MiB")


def stop_server(rep: Report, server: Server) -> None:
    t0 = time.monotonic()
    code = server.process.stop()
    took = time.monotonic() - t0
    if code in (0, -15, 143):
        rep.add(f"server.{server.arm.name}.stop", "pass", f"stopped in {took:.1f} s (exit {code})")
    else:
        rep.add(f"server.{server.arm.name}.stop", "fail", f"exit {code} after {took:.1f} s",
                "the server did not stop gracefully: read its log; on docker, `docker ps -a --filter "
                "name=tts-vllm-omni` and `ls /dev/shm` for leftovers")
    after = shm_entries()
    name = f"server.{server.arm.name}.shm"
    if server.shm_before is None or after is None:
        rep.add(name, "skip", f"{SHM} is not readable here")
        return
    left = sorted(after - server.shm_before)
    if left:  # a warning: on a shared host another process may have made them
        rep.add(name, "pass", f"{len(left)} new entries in the host's {SHM} after the stop: {', '.join(left[:5])}",
                warning="shared memory may have leaked out of the server (docker/serve.sh gives the container its own "
                "/dev/shm with --shm-size; an --ipc=host container or a killed process leaves segments) unless "
                f"another process made them: `ls -l {SHM}`, remove them once no server runs")
    else:
        rep.add(name, "pass", f"no new entries in the host's {SHM} after the stop ({len(after)} there)")
