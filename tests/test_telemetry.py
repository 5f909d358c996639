"""Server telemetry (loadtest/telemetry.py): NVML per GPU through a fake library, the process tree from a fake /proc
with known CPU ticks, the sampler's thread, and errors that are logged once and never raised."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from loadtest.telemetry import MIB, HostCpu, Nvml, ProcessTree, Telemetry, container_gpus, describe
from ttsrecords import records


def write_proc(root, pid, ppid, ticks, rss_pages, start="100"):
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # pid (comm) state ppid ... field 14 utime, 15 stime, 22 starttime; the name holds a space and a ')'
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0"] + ["0"] * 6 + [start] + ["0"] * 20
    (d / "stat").write_text(f"{pid} (py thon) x) " + " ".join(fields) + "\n")
    (d / "statm").write_text(f"1000 {rss_pages} 0 0 0 0 0\n")


def test_process_tree_cpu_and_rss_from_proc(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 10, 1, ticks=100, rss_pages=256)
    write_proc(proc, 11, 10, ticks=50, rss_pages=512)  # a child
    write_proc(proc, 12, 11, ticks=0, rss_pages=256)  # a grandchild
    write_proc(proc, 99, 1, ticks=999, rss_pages=9999)  # not in the tree
    tree = ProcessTree(10, proc)
    assert sorted(tree.pids()) == [10, 11, 12]
    first = tree.read(100.0)
    assert first.source == "process" and first.cpu_pct is None  # no interval yet
    assert first.rss_mib == (256 + 512 + 256) * tree.page / MIB
    write_proc(proc, 10, 1, ticks=100 + tree.ticks // 2, rss_pages=256)  # half a core-second ...
    write_proc(proc, 11, 10, ticks=50 + tree.ticks // 2, rss_pages=512)  # ... twice
    second = tree.read(101.0)
    assert abs(second.cpu_pct - 100.0 * (tree.ticks // 2) * 2 / tree.ticks) < 1e-9
    for pid in (10, 11, 12):
        (proc / str(pid) / "stat").unlink()
    assert tree.read(102.0) is None  # the tree is gone


def test_host_cpu_busy_share_from_proc_stat(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    stat = proc / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, then the per-CPU lines
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    host = HostCpu(proc)
    first = host.read(1.0)
    assert first.source == "host" and first.host_cpu_pct is None  # no interval yet
    stat.write_text("cpu  250 0 100 850 50 0 0 0 0 0\n")  # +200 busy, +50 idle: 80 % busy
    assert abs(host.read(2.0).host_cpu_pct - 80.0) < 1e-9
    stat.write_text("cpu  250 0 100 850 50 0 0 0 0 0\n")  # no jiffies passed: no share to give
    assert host.read(3.0).host_cpu_pct is None
    stat.write_text("garbage\n")
    assert host.read(4.0) is None
    assert HostCpu(tmp_path / "nowhere").read(5.0) is None
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\n")
    t = Telemetry(tmp_path / "t.jsonl", None, interval_s=0.01, proc=proc)  # no server pid: the host source alone
    t.sample_once()
    t.sample_once()
    t.stop()
    rows = [records.TelemetrySample(**{k: v for k, v in __import__("json").loads(x).items() if k != "schema"})
            for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert rows and all(r.source == "host" for r in rows)
    assert "host" in describe(None, "sim")


class FakeNvml:
    NVML_CLOCK_SM = 1

    def __init__(self, fail_power=False):
        self.fail_power = fail_power

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=40 + h)

    def nvmlDeviceGetClockInfo(self, h, which):
        assert which == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(h + 1) * 1024 * MIB)

    def nvmlDeviceGetPowerUsage(self, h):
        if self.fail_power:
            raise RuntimeError("not supported")
        return 350_000


class BrokenNvml(FakeNvml):
    def nvmlInit(self):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")


def test_nvml_per_gpu_and_unsupported_counters_are_unknown():
    nv = Nvml.open(FakeNvml(fail_power=True))
    rows = nv.read(5.0)
    assert [(r.gpu, r.gpu_util_pct, r.sm_clock_mhz, r.mem_used_mib) for r in rows] == [(0, 40, 1980, 1024),
                                                                                     (1, 41, 1980, 2048)]
    assert all(r.power_w is None and r.source == "nvml" for r in rows)
    assert Nvml.open(FakeNvml()).read(0)[0].power_w == 350.0
    assert Nvml.open(BrokenNvml()) is None  # no driver: the process source only
    assert "not available" in describe(None, "sim")["nvml"] and "2 GPU" in describe(nv, "vllm")["nvml"]
    assert "not available" in describe(nv, "vllm")["process"]  # a container's processes are out of the host's sight


def test_sampler_writes_the_contract_and_never_raises(tmp_path, caplog):
    out = tmp_path / "telemetry.jsonl"
    t = Telemetry(out, os.getpid(), interval_s=0.01, nvml=Nvml.open(FakeNvml()))
    with t:
        pass
    rows, notes = records.read_jsonl(out, records.TELEMETRY_SCHEMA)
    assert not notes and len(rows) >= 2 * 4  # a sample at the start and at the stop: 2 GPUs, this process, the host
    assert {r["source"] for r in rows} == {"nvml", "process", "host"}
    assert set(rows[0]) | {"other_cpu_pct"} == {"schema", *records.TelemetrySample.__dataclass_fields__}
    assert any(r["rss_mib"] and r["rss_mib"] > 1 for r in rows if r["source"] == "process")

    class Exploding(Nvml):
        def read(self, t):
            raise RuntimeError("GPU fell off the bus")

    bad = Telemetry(tmp_path / "bad.jsonl", None, interval_s=0.01, nvml=Exploding(None, []))
    bad.start()
    bad.stop()
    assert len(bad.errors) >= 2 and caplog.text.count("GPU fell off the bus") == 1  # logged once
    gone = Telemetry(tmp_path / "x" / "t.jsonl", 2**22 + 12345, interval_s=0.01)  # no such pid: no process line, no error
    gone.start()
    gone.stop()
    gone_rows, _ = records.read_jsonl(tmp_path / "x" / "t.jsonl", records.TELEMETRY_SCHEMA)
    assert not gone.errors and {r["source"] for r in gone_rows} == {"host"}  # no process line; the host still shows


@pytest.mark.parametrize(("spec", "count", "want"), [
    ("all", 8, list(range(8))), ("2", 8, [0, 1]), ("device=3", 8, [3]), ('"device=1,5"', 8, [1, 5]),
    ("device=GPU-abc", 2, ["GPU-abc"]), ("9", 2, [0, 1])])
def test_container_gpus_follows_docker_gpus_syntax(spec, count, want):
    assert container_gpus(spec, count) == want


@pytest.mark.parametrize("spec", ["device=8", "0", "gpu0", "device="])
def test_container_gpus_refuses_what_docker_would_not_give(spec):
    with pytest.raises(ValueError, match="GPUS="):
        container_gpus(spec, 8)


class EightGpus(FakeNvml):
    def nvmlDeviceGetCount(self):
        return 8

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=90 if h == 3 else 0)  # only the server's GPU works


def test_telemetry_reads_the_containers_gpu_only_and_the_report_sees_its_utilisation(tmp_path):
    """An 8-GPU node, the server on GPU 3: utilisation and power are that GPU's, not an average/sum over eight."""
    from ttsreport.blocks import telemetry_window

    nv = Nvml.open(EightGpus(), spec="device=3")
    assert nv.indices == [3] and "host index 3" in describe(nv, "vllm")["nvml"]
    out = tmp_path / "telemetry.jsonl"
    clock = iter((1.0, 2.0, 3.0))
    tele = Telemetry(out, None, nvml=nv, proc=tmp_path / "no-proc", clock=lambda: next(clock))
    for _ in range(3):
        tele.sample_once()
    tele.stop()
    rows, _ = records.read_jsonl(out, records.TELEMETRY_SCHEMA)
    win = telemetry_window(rows, (0.0, 5.0))
    assert win["gpu_util_pct"] == 90 and win["power_w"] == 350 and win["gpu_indices"] == [3] and win["gpus"] == 1
    all8 = Nvml.open(EightGpus(), spec="all")
    assert len(all8.read(0.0)) == 8
    assert Nvml.open(EightGpus(), spec="device=9") is None  # a GPU the host does not have: no GPU telemetry


def test_other_jobs_cpu_is_the_hosts_busy_cores_less_the_suites_tree(tmp_path):
    """The host line says what the rest of the box used: on 2 CPUs at 80 % busy (1.6 cores) with the suite's tree
    (runner, Locust, the server it started) at 100 % of a core, other jobs used 60 % of a core."""
    from loadtest.telemetry import other_cpu_pct

    assert other_cpu_pct(80.0, 2, 100.0) == pytest.approx(60.0)
    assert other_cpu_pct(40.0, 2, 100.0) == 0.0  # read a moment apart: never below 0
    assert other_cpu_pct(None, 2, 100.0) is None and other_cpu_pct(80.0, 2, None) is None
    proc = tmp_path / "proc"
    write_proc(proc, 10, 1, ticks=0, rss_pages=1)  # the suite: runner 10, its server 11
    write_proc(proc, 11, 10, ticks=0, rss_pages=1)
    write_proc(proc, 99, 1, ticks=0, rss_pages=1)  # another job
    (proc / "stat").write_text("cpu  0 0 0 1000 0 0 0 0 0 0\n")
    clock = iter([100.0, 101.0])
    t = Telemetry(tmp_path / "t.jsonl", 11, proc=proc, clock=lambda: next(clock), suite_pid=10)
    t.cpus = 2
    t.sample_once()
    ticks = t.suite.ticks
    write_proc(proc, 11, 10, ticks=ticks, rss_pages=1)  # the server: one core-second in one second
    write_proc(proc, 99, 1, ticks=ticks // 2, rss_pages=1)  # the other job: half a core
    total = 2 * ticks  # two CPUs over one second, in jiffies at the same rate
    busy = ticks + ticks // 2
    (proc / "stat").write_text(f"cpu  {busy} 0 0 {1000 + total - busy} 0 0 0 0 0 0\n")
    t.sample_once()
    t._writer.close()
    rows, _ = records.read_jsonl(tmp_path / "t.jsonl", records.TELEMETRY_SCHEMA)
    host = [r for r in rows if r["source"] == "host"]
    assert "other_cpu_pct" not in host[0] and host[1]["other_cpu_pct"] == pytest.approx(100.0 * (ticks // 2) / ticks)
    no_suite = Telemetry(tmp_path / "u.jsonl", 11, proc=proc)  # a Docker server: not in the suite's tree
    assert no_suite.suite is None
