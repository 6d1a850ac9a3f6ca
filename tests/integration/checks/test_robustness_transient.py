"""Step 2 over a real HTTP hop: one upstream 500 in the middle of a sweep (as a LiteLLM proxy gives
now and then) is retried and counted, and every finding is still produced."""

from __future__ import annotations

import pytest

from mmchaos.checks.base import CheckContext
from mmchaos.checks.robustness.robustness import Robustness, RobustnessParams
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Verdict
from mmchaos.targets import load_target
from tests.fakes.openai_server import FakeConfig, fake_openai_server

pytestmark = pytest.mark.integration

PARAMS = {"perturbations": ["gaussian_noise", "gaussian_blur"], "severities": [1, 3], "samples": 16,
          "shard_size": 8, "batch_size": 8}  # fmt: skip


def sweep(fail_after: int | None) -> list[tuple[str, Verdict, float]]:
    config = FakeConfig()
    with fake_openai_server(config) as url:
        target = load_target(f"openai:{url}")
        try:
            if fail_after is not None:  # after the connect-time probes: a request in the sweep's middle
                config.fail_at = {len(config.requests) + fail_after}
            ctx = CheckContext(target=target, dataset=make_shapes(16, seed=2), seed=0, check_id="robustness")
            found = list(Robustness(RobustnessParams(**PARAMS)).run(ctx))
        finally:
            target.close()
    return [(f.title, f.verdict, f.metrics.get("endpoint_retries", 0.0)) for f in found]


def test_one_upstream_500_is_retried_counted_and_every_finding_produced() -> None:
    clean = sweep(None)
    flaky = sweep(6)
    assert [(t, v) for t, v, _ in flaky] == [(t, v) for t, v, _ in clean]
    assert all(v != Verdict.ERROR for _, v, _ in flaky)
    assert sum(r for _, _, r in flaky[:-1]) == 1.0 and flaky[-1][2] == 1.0  # one perturbation, and the summary
