"""Which host CPUs the GPU server and the load generator get, and what the CPU governor is.

The function under test (the code predictor's metadata build) is host-CPU work, so the server gets one NUMA node of
its own (`docker run --cpuset-cpus/--cpuset-mems`, docker/serve.sh) and Locust the other CPUs (the A/B runner pins
itself, and with it every Locust process it starts). A host with one NUMA node keeps its last quarter (at least 2
CPUs) for Locust. The governor (performance, powersave, ...) changes clock speed under load, so it is recorded.

    python -m loadtest.pinning server   # "CPUS MEMS" for docker/serve.sh (SERVER_NUMA_NODE, default 0)
    python -m loadtest.pinning load     # the load generator's CPUs
    python -m loadtest.pinning          # the whole plan and the governors, as JSON
Standard library only: docker/serve.sh runs it with any python3.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

SYS = "/sys/devices/system"
MIN_LOAD_CPUS = 2  # one host: Locust keeps at least this many CPUs (a master and a worker)
MIN_SPLIT_CPUS = 4  # below this a host is not split at all (both share every CPU; the plan says so)


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' (the kernel's cpulist format) -> [0, 1, 2, 3, 8, 10, 11]."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def format_cpulist(cpus: list[int]) -> str:
    """The inverse of parse_cpulist: ranges where they are contiguous (what --cpuset-cpus and taskset take)."""
    out, run = [], []
    for c in sorted(set(cpus)):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def numa_nodes(sys_root: str | os.PathLike = SYS) -> dict[int, list[int]]:
    """Node id -> its CPUs, from /sys/devices/system/node/node*/cpulist; {} when the kernel shows no nodes."""
    nodes = {}
    for p in Path(sys_root, "node").glob("node[0-9]*"):
        try:
            cpus = parse_cpulist((p / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:
            nodes[int(p.name[4:])] = cpus
    return dict(sorted(nodes.items()))


def online_cpus(sys_root: str | os.PathLike = SYS) -> list[int]:
    try:
        return parse_cpulist(Path(sys_root, "cpu/online").read_text())
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Plan:
    server_cpus: str  # --cpuset-cpus
    server_mems: str  # --cpuset-mems ("" when the kernel shows no NUMA nodes: the flag is left out)
    load_cpus: str  # the A/B runner's (and so Locust's) CPU affinity
    why: str


def plan(node: int = 0, sys_root: str | os.PathLike = SYS) -> Plan:
    """The server on NUMA node `node`, the load generator on the rest (see the module docstring)."""
    nodes = numa_nodes(sys_root)
    if nodes and node not in nodes:
        raise ValueError(f"SERVER_NUMA_NODE={node}: this host has NUMA nodes {sorted(nodes)}")
    if len(nodes) >= 2:
        rest = [c for n, cpus in nodes.items() if n != node for c in cpus]
        return Plan(format_cpulist(nodes[node]), str(node), format_cpulist(rest),
                    f"server on NUMA node {node} ({len(nodes[node])} CPUs), load generator on the other "
                    f"{len(nodes) - 1} node(s) ({len(rest)} CPUs)")
    cpus = online_cpus(sys_root)
    mems = str(next(iter(nodes))) if nodes else ""
    if len(cpus) < MIN_SPLIT_CPUS:
        every = format_cpulist(cpus)
        return Plan(every, mems, every, f"only {len(cpus)} CPUs: server and load generator share all of them")
    k = max(MIN_LOAD_CPUS, len(cpus) // 4)
    return Plan(format_cpulist(cpus[:-k]), mems, format_cpulist(cpus[-k:]),
                f"one NUMA node: server on {len(cpus) - k} CPUs, load generator on the last {k}")


def governors(sys_root: str | os.PathLike = SYS) -> dict[str, str]:
    """Governor -> the CPUs running it ({} when cpufreq is not exposed, e.g. in a VM)."""
    by: dict[str, list[int]] = {}
    for p in Path(sys_root, "cpu").glob("cpu[0-9]*"):
        try:
            g = (p / "cpufreq/scaling_governor").read_text().strip()
        except OSError:
            continue
        by.setdefault(g, []).append(int(p.name[3:]))
    return {g: format_cpulist(c) for g, c in sorted(by.items())}


def describe(p: Plan, sys_root: str | os.PathLike = SYS) -> dict:
    """What the run manifest records about the host's CPUs."""
    gov = governors(sys_root)
    return {**asdict(p), "governors": gov or None,
            "governor_warning": None if not gov or set(gov) == {"performance"} else
            f"CPU governor(s) {', '.join(sorted(gov))}: clocks follow load; `cpupower frequency-set -g performance` "
            "holds them (the function under test is host-CPU work)"}


def pin_load_generator(p: Plan) -> list[int]:
    """Pin this process (and every process it starts from now on, Locust included) to the load generator's CPUs."""
    cpus = parse_cpulist(p.load_cpus)
    os.sched_setaffinity(0, cpus)
    return sorted(os.sched_getaffinity(0))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        p = plan(int(os.environ.get("SERVER_NUMA_NODE") or 0))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args == ["server"]:
        print(p.server_cpus, p.server_mems)
    elif args == ["load"]:
        print(p.load_cpus)
    elif not args:
        print(json.dumps(describe(p), indent=1))
    else:
        print("usage: python -m loadtest.pinning [server|load]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
