"""serving_poison against a chat server that closes its connection after each poison request's 500
(uvicorn's way, under transformers serve): the good requests the server answers are not counted as
failed next to poison because one went out on the connection the server had just given up. It is
sent again, and the finding counts it; the poison's 500s are still the server's failures."""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.serving.poison import ServingPoison
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Verdict
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.closing_server import ClosingConfig, closing_server
from tests.support import run_check_class
from tests.support.serving import FAST

pytestmark = pytest.mark.integration

DATA = make_shapes(6, seed=4)
PARAMS: dict[str, Any] = {**FAST, "poisons": ["malformed_base64", "garbage_image", "truncated_png"],
                          "poison_s": 1.5, "poison_share": 0.3,
                          "slo": {**FAST["slo"], "p99_ms": 20_000}}  # fmt: skip
"""A p99 objective no loaded machine misses: the verdict is about failures, not speed."""


@pytest.mark.check_contract("serving_poison", "clean")
def test_good_requests_are_not_blamed_for_a_connection_closed_after_a_poison_500() -> None:
    config = ClosingConfig(crash_on_bad_image=True)
    with closing_server(config) as url:
        target = OpenAITarget.connect(url, capabilities=["generate"])
        try:
            findings = run_check_class(ServingPoison, target, PARAMS, data=DATA)
        finally:
            target.close()
    by_title = {f.title.split(":")[0]: f for f in findings}
    isolation = by_title["isolation"]
    assert isolation.verdict == Verdict.PASS, (isolation.title, isolation.evidence.get("good_failures"))
    assert config.dropped >= 1, "no request went out on a given-up connection: the test tested nothing"
    assert isolation.evidence["resent_after_closed_connection"] >= 1
    for kind in PARAMS["poisons"]:
        poisoned = by_title[f"poison {kind}"]
        assert poisoned.verdict == Verdict.FAIL and "5xx" in poisoned.title, poisoned.title  # the server's own 500
