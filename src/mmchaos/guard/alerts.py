"""Prometheus alert rules for the guards' own signals, written next to the SLO burn-rate rules.

The burn-rate alerts (:mod:`mmchaos.guard.slo`) say *that* users are hurt; these say *which guard saw
why*, from the series ``mmchaos serve`` and the guards export:

- ``MMChaosCircuitBreakerOpen``: ``mmchaos_breaker_state`` shows a breaker out of ``closed`` (open,
  half-open or forced open) for ``breaker_for``. Open and half-open are summed so a breaker that keeps
  failing its trial calls (open -> half_open -> open) does not restart the ``for`` clock each time.
- ``MMChaosDriftAlarm``: ``mmchaos_drift_alarm`` is 1 (the last window of a modality alarmed).
- ``MMChaosModelLoadMismatch``: ``mmchaos_model_load_mismatch_total`` > 0: this process started with
  model components that do not belong together (the 004 write-up's grey release); the server stays
  unready, so it pages at once.

Every rule keeps the scrape's labels (``instance``, ``job``) so Alertmanager can route per replica.
:func:`serving_rules_yaml` writes one rules file with these and each SLO's burn-rate group;
``promtool check rules`` accepts it and the test suite runs ``promtool test rules`` on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from mmchaos.guard.slo import BurnRateSLO

__all__ = ["guard_alert_group", "serving_rules", "serving_rules_yaml"]

#: Breaker states in which calls are refused or only trial calls pass.
_NOT_CLOSED = "open|half_open|forced_open"


def guard_alert_group(
    *, breaker_for: str = "1m", drift_for: str = "0s", group: str = "mmchaos-guards"
) -> dict[str, Any]:
    """One rule group (an entry of a rules file's ``groups:``) with the three guard alerts.

    ``breaker_for``: how long a breaker must stay out of ``closed`` before paging; a breaker that
    opens for one wait duration during a fault and closes again is working, not an incident.
    """
    return {
        "name": group,
        "rules": [
            {
                "alert": "MMChaosCircuitBreakerOpen",
                "expr": f'sum without (state) (mmchaos_breaker_state{{state=~"{_NOT_CLOSED}"}}) > 0',
                "for": breaker_for,
                "labels": {"severity": "page"},
                "annotations": {
                    "summary": "Circuit breaker {{ $labels.name }} is not closed",
                    "description": (
                        "The circuit breaker {{ $labels.name }} on {{ $labels.instance }} has refused calls "
                        f"(open or half-open) for {breaker_for}: the model behind it keeps failing or is too slow."
                    ),
                },
            },
            {
                "alert": "MMChaosDriftAlarm",
                "expr": "mmchaos_drift_alarm > 0",
                "for": drift_for,
                "labels": {"severity": "ticket"},
                "annotations": {
                    "summary": "Embedding drift on {{ $labels.name }} ({{ $labels.modality }})",
                    "description": (
                        "The last drift window of modality {{ $labels.modality }} alarmed (KL over its dynamic "
                        "threshold or an MMD test): the inputs or the model's outputs moved away from the reference."
                    ),
                },
            },
            {
                "alert": "MMChaosModelLoadMismatch",
                "expr": "mmchaos_model_load_mismatch_total > 0",
                "labels": {"severity": "page"},
                "annotations": {
                    "summary": "{{ $labels.instance }} loaded model components that do not belong together",
                    "description": (
                        "At start-up the weights, config, tokenizer or processor did not match (or did not match "
                        "the expected fingerprint); the server stays unready. Roll back the release."
                    ),
                },
            },
        ],
    }


def serving_rules(slos: Iterable[BurnRateSLO] = (), **guard_options: Any) -> dict[str, Any]:
    """A rules file as a mapping: the guard alert group, then one burn-rate group per SLO."""
    groups = [guard_alert_group(**guard_options)]
    groups += [slo.prometheus_rule_group() for slo in slos]
    return {"groups": groups}


def serving_rules_yaml(slos: Iterable[BurnRateSLO] = (), **guard_options: Any) -> str:
    """:func:`serving_rules` as YAML: load it through ``rule_files:`` in ``prometheus.yml``."""
    return yaml.safe_dump(serving_rules(slos, **guard_options), sort_keys=False, width=1000)
