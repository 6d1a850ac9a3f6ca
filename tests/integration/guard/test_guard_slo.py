"""BurnRateSLO: each workbook alert fires when its long window has burned enough (and not before),
stops soon after the burning does, memory stays fixed; the Prometheus rules parse, and promtool
(when installed) accepts them and fires the same alerts on the same traffic."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mmchaos.guard import BurnRateSLO
from tests.support.guard_slo import PROMTOOL, Clock, Traffic, firing


@pytest.mark.integration
@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_accepts_the_rules_and_fires_them_on_the_same_traffic(tmp_path: Path) -> None:
    slo = BurnRateSLO(name="embeddings", objective=0.999, registry=CollectorRegistry())
    rules = tmp_path / "rules.yml"
    rules.write_text(slo.prometheus_rules_yaml())
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    group = slo.prometheus_rule_group()
    annotations = {r["labels"]["severity"]: r["annotations"] for r in group["rules"] if "alert" in r}

    def expected(*severities: str) -> list[dict[str, Any]]:
        return [
            {"exp_labels": {"severity": s, "slo": "embeddings"}, "exp_annotations": annotations[s]} for s in severities
        ]

    # 50 requests a minute (sampled every 5 m); 3 days clean, then 50% errors (burn 500): the 1 h
    # window passes 14.4x after ~2 minutes, the 1 d window 3x after ~9. In-process and promtool
    # must agree.
    series = {
        "requests": "0+250x870",
        "errors": "0x864 125+125x5",
    }
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": "5m",
        "tests": [
            {
                "interval": "5m",
                "input_series": [
                    {"series": 'mmchaos_slo_requests_total{slo="embeddings"}', "values": series["requests"]},
                    {"series": 'mmchaos_slo_errors_total{slo="embeddings"}', "values": series["errors"]},
                ],
                "alert_rule_test": [
                    {"eval_time": "4320m", "alertname": "MMChaosSLOErrorBudgetBurn", "exp_alerts": []},
                    {"eval_time": "4325m", "alertname": "MMChaosSLOErrorBudgetBurn", "exp_alerts": expected("page")},
                    {
                        "eval_time": "4335m",
                        "alertname": "MMChaosSLOErrorBudgetBurn",
                        "exp_alerts": expected("page", "ticket"),
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "tests.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr

    clock = Clock()
    mirror = BurnRateSLO(name="embeddings", objective=0.999, clock=clock, registry=CollectorRegistry())
    traffic = Traffic(mirror, clock)
    traffic.run(4320)
    assert firing(mirror) == set()
    traffic.run(1, error_ratio=0.5)
    assert firing(mirror) == set(), "one minute in, the 1 h window has not burned 14.4x yet"
    traffic.run(4, error_ratio=0.5)
    assert {s for s, _ in firing(mirror)} == {"page"}
    traffic.run(10, error_ratio=0.5)
    assert {s for s, _ in firing(mirror)} == {"page", "ticket"}
