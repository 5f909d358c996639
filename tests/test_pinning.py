"""loadtest.pinning: the server's NUMA node, the load generator's CPUs, the governor, on fake /sys trees."""

from __future__ import annotations

import os

import pytest

from loadtest import pinning


def fake_sys(tmp_path, nodes: dict[int, str] | None, online: str, governors: dict[int, str] | None = None):
    root = tmp_path / "sys"
    (root / "cpu").mkdir(parents=True)
    (root / "cpu/online").write_text(online + "\n")
    for n, cpus in (nodes or {}).items():
        (root / f"node/node{n}").mkdir(parents=True)
        (root / f"node/node{n}/cpulist").write_text(cpus + "\n")
    for cpu, g in (governors or {}).items():
        (root / f"cpu/cpu{cpu}/cpufreq").mkdir(parents=True)
        (root / f"cpu/cpu{cpu}/cpufreq/scaling_governor").write_text(g + "\n")
    return root


@pytest.mark.parametrize(("text", "cpus"), [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", [])])
def test_cpulist_round_trip(text, cpus):
    assert pinning.parse_cpulist(text) == cpus
    assert pinning.format_cpulist(cpus) == text


def test_two_nodes_server_gets_one_node_load_the_other(tmp_path):
    root = fake_sys(tmp_path, {0: "0-15,32-47", 1: "16-31,48-63"}, "0-63")
    p = pinning.plan(0, root)
    assert (p.server_cpus, p.server_mems, p.load_cpus) == ("0-15,32-47", "0", "16-31,48-63")
    p = pinning.plan(1, root)
    assert (p.server_cpus, p.server_mems, p.load_cpus) == ("16-31,48-63", "1", "0-15,32-47")
    with pytest.raises(ValueError, match="SERVER_NUMA_NODE=2: this host has NUMA nodes \\[0, 1\\]"):
        pinning.plan(2, root)


def test_one_node_keeps_the_last_quarter_for_the_load_generator(tmp_path):
    p = pinning.plan(0, fake_sys(tmp_path, {0: "0-15"}, "0-15"))
    assert (p.server_cpus, p.server_mems, p.load_cpus) == ("0-11", "0", "12-15")
    assert set(pinning.parse_cpulist(p.server_cpus)).isdisjoint(pinning.parse_cpulist(p.load_cpus))


def test_a_tiny_host_is_not_split_and_says_so(tmp_path):
    p = pinning.plan(0, fake_sys(tmp_path, None, "0-1"))
    assert p.server_cpus == p.load_cpus == "0-1" and p.server_mems == "" and "share" in p.why


def test_governors_recorded_and_a_non_performance_one_warned(tmp_path):
    root = fake_sys(tmp_path, {0: "0-3"}, "0-3", {0: "performance", 1: "performance", 2: "powersave", 3: "powersave"})
    d = pinning.describe(pinning.plan(0, root), root)
    assert d["governors"] == {"performance": "0-1", "powersave": "2-3"}
    assert "powersave" in d["governor_warning"] and "cpupower" in d["governor_warning"]
    root = fake_sys(tmp_path / "b", {0: "0-3"}, "0-3", {c: "performance" for c in range(4)})
    assert pinning.describe(pinning.plan(0, root), root)["governor_warning"] is None
    root = fake_sys(tmp_path / "c", {0: "0-3"}, "0-3")
    assert pinning.describe(pinning.plan(0, root), root)["governors"] is None  # a VM without cpufreq


def test_pin_load_generator_sets_this_process_affinity():
    before = os.sched_getaffinity(0)
    try:
        one = sorted(before)[-1]
        got = pinning.pin_load_generator(pinning.Plan("0", "", str(one), "test"))
        assert got == [one] == sorted(os.sched_getaffinity(0))
    finally:
        os.sched_setaffinity(0, before)
