"""The A/B manifest, typed (ttsrecords.manifest): every committed manifest reads back into RunManifest + RunLog and
writes out as the same object, version 1 upgrades at load time, the planner and the runner never share a key, and a
manifest that cannot be read is one line."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import ROOT

from ttsrecords.manifest import RUNNER_KEYS, ManifestError, RunLog, RunManifest, read_manifest

COMMITTED = sorted(p for p in (ROOT / "reports").glob("**/manifest.json")
                   if json.loads(p.read_text(encoding="utf-8")).get("schema", "").startswith("tts-ab/"))


def test_there_are_committed_ab_manifests_to_check():
    assert len(COMMITTED) >= 5


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_committed_manifest_round_trips(path):
    d = json.loads(path.read_text(encoding="utf-8"))
    m = read_manifest(d)
    assert m.to_dict() == d and json.loads(json.dumps(m.to_dict())) == d
    assert read_manifest(m.to_dict()) == m
    assert not m.extra, m.extra  # every key of a current manifest has a typed home
    assert m.design_name in ("fresh", "swap", "nested") and m.log.status in ("complete", "interrupted", "failed")


def test_version_1_gets_its_homes_at_load_time():
    d = json.loads((ROOT / "tests/fixtures/v1-run/manifest.json").read_text(encoding="utf-8"))
    m = read_manifest(d)
    assert m.schema == "tts-ab/1" and m.design_name == "fresh" and m.simulated
    assert len(m.windows_to_run) == len(d["plan"]) and m.log.status == "complete"


def test_the_planner_and_the_runner_never_share_a_key():
    planned = {f.name for f in dataclasses.fields(RunManifest)} - {"log", "extra", "nulls"}
    assert not planned & set(RUNNER_KEYS)
    assert RunLog().to_dict() == {"status": "planned"}  # what the planner writes of the runner's part


def test_a_stopped_run_keeps_its_plan_and_runs_less():
    d = json.loads((ROOT / "reports/example/manifest.json").read_text(encoding="utf-8"))
    d["plan_not_run"] = d["plan"][4:]
    m = read_manifest(d)
    assert len(m.plan) == 6 and [w.block_id for w in m.windows_to_run] == [w["block_id"] for w in d["plan"][:4]]
    assert m.to_dict() == d


def test_an_unknown_key_is_kept_not_lost():
    d = json.loads((ROOT / "reports/example/manifest.json").read_text(encoding="utf-8"))
    m = read_manifest({**d, "written_by_a_newer_runner": {"x": 1}})
    assert m.extra == {"written_by_a_newer_runner": {"x": 1}} and m.to_dict()["written_by_a_newer_runner"] == {"x": 1}


@pytest.mark.parametrize("bad,says", [
    ([1], "not a JSON object"),
    ({"schema": "tts-run/2"}, "not an A/B run's"),
    ({"schema": "tts-ab/2", "run_id": "x", "plan": [{"block_id": "0", "round": 0, "kind": "ab"}]},
     "plan entry 0: no arm"),
])
def test_a_manifest_that_cannot_be_read_is_one_line(bad, says):
    with pytest.raises(ManifestError, match=says) as e:
        read_manifest(bad, "r/manifest.json")
    assert str(e.value).startswith("r/manifest.json: ") and "\n" not in str(e.value)
