"""``mmchaos alert-rules`` and ``mmchaos chaos-mesh``: the files they write parse, hold what they
say, use only Chaos Mesh's documented fields, and bad flags exit 2 with a clear message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mmchaos.chaos.manifests import ChaosMeshTarget, chaos_mesh_manifests, toxic_to_chaos_mesh, undocumented_fields
from mmchaos.checks.serving.faults import FAULT_CATALOGUE

TARGET = ChaosMeshTarget(namespace="ml", labels={"app": "clip"}, port=8080, duration="30s")


def test_alert_rules_writes_the_guard_and_burn_rate_alerts(run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "rules.yml"
    code, _, err = run_cli("alert-rules", "--breaker-for", "2m", "-o", str(out))
    assert code == 0, err
    groups = yaml.safe_load(out.read_text())["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert set(alerts) == {
        "MMChaosCircuitBreakerOpen",
        "MMChaosDriftAlarm",
        "MMChaosModelLoadMismatch",
        "MMChaosSLOErrorBudgetBurn",
    }
    assert alerts["MMChaosCircuitBreakerOpen"]["for"] == "2m"
    code, _, err = run_cli("alert-rules", "--breaker-for", "two minutes")
    assert code == 2 and "Prometheus duration" in err


def test_chaos_mesh_exports_the_serving_suites_faults_as_one_workflow(run_cli: Any) -> None:
    code, out, err = run_cli("chaos-mesh", "-n", "ml", "-l", "app=clip", "--port", "8080", "--duration", "30s")
    assert code == 0, err
    skipped = [line for line in out.splitlines() if line.startswith("# skipped")]
    [wf] = list(yaml.safe_load_all(out))
    assert wf["kind"] == "Workflow" and undocumented_fields(wf) == []
    kinds = {t["templateType"] for t in wf["spec"]["templates"]}
    assert kinds == {"Serial", "Suspend", "NetworkChaos", "HTTPChaos", "PodChaos"}
    serial = wf["spec"]["templates"][0]
    faults = [c for c in serial["children"] if not c.startswith("pause-")]
    assert "mmchaos-latency-moderate" in faults and "mmchaos-http-503-heavy" in faults
    assert any("slicer" in line for line in skipped), "a fault without a counterpart is named, not dropped"
    for t in wf["spec"]["templates"][1:]:
        if t["templateType"] != "Suspend":
            inner = next(v for k, v in t.items() if k.endswith("Chaos"))
            assert inner["selector"] == {"namespaces": ["ml"], "labelSelectors": {"app": "clip"}}


def test_chaos_mesh_separate_objects_and_bad_flags(run_cli: Any) -> None:
    code, out, err = run_cli("chaos-mesh", "--separate", "-l", "app=clip")
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert len(docs) > 5 and all(undocumented_fields(d) == [] for d in docs)
    assert all(d["spec"]["duration"] == "60s" for d in docs)
    code, _, err = run_cli("chaos-mesh", "-l", "clip")
    assert code == 2 and "KEY=VALUE" in err
    code, _, err = run_cli("chaos-mesh", "--duration", "soon")
    assert code == 2 and "duration" in err
    code, _, err = run_cli("chaos-mesh", "--suite", "quick")
    assert code == 2 and "no serving_faults" in err


def test_each_mapping_keeps_the_faults_numbers_and_says_what_it_changes() -> None:
    latency = toxic_to_chaos_mesh("latency", FAULT_CATALOGUE["latency"]["heavy"].toxic, TARGET).manifest
    assert latency is not None and latency["spec"]["delay"] == {
        "latency": "1500ms",
        "jitter": "100ms",
        "correlation": "0",
    }
    status = toxic_to_chaos_mesh("h", FAULT_CATALOGUE["http_503"]["moderate"].toxic, TARGET).manifest
    assert status is not None and status["kind"] == "HTTPChaos"
    assert status["spec"]["replace"] == {"code": 503} and status["spec"]["port"] == 8080
    assert "not 5%" in status["metadata"]["annotations"]["mmchaos.io/approximation"]
    down = toxic_to_chaos_mesh("d", FAULT_CATALOGUE["down"]["moderate"].toxic, TARGET).manifest
    assert down is not None and down["spec"]["mode"] == "fixed-percent" and down["spec"]["value"] == "5"
    assert toxic_to_chaos_mesh("s", FAULT_CATALOGUE["slicer"]["heavy"].toxic, TARGET).manifest is None


def test_the_field_check_catches_what_chaos_mesh_does_not_document() -> None:
    manifests, _ = chaos_mesh_manifests(
        [("l", dict(FAULT_CATALOGUE["latency"]["moderate"].toxic))], TARGET, workflow=False
    )
    [m] = manifests
    assert undocumented_fields(m) == []
    bad = {**m, "spec": {**m["spec"], "delay": {"latncy": "5ms"}, "mode": "most", "duration": "1 minute"}}
    assert set(undocumented_fields(bad)) == {"spec.delay.latncy", "spec.mode='most'", "spec.duration '1 minute'"}
