"""The text attack: greedy meaning-kept substitutions (fast tier: numpy targets, no model)."""

from __future__ import annotations

import pytest

from mmchaos.checks.adversarial.text_attack import TextAttack
from mmchaos.data.shapes import make_shapes
from tests.fakes.targets import ShapeColourTarget
from tests.support import run_check_class


@pytest.mark.integration  # a real reference server on loopback
def test_text_and_typographic_attacks_run_black_box_over_http_as_in_process() -> None:
    """Both need only embeddings: through an ``openai:`` endpoint they find what they find in-process."""
    from mmchaos.checks.adversarial.typographic_attack import TypographicAttack
    from mmchaos.server import ServerThread
    from mmchaos.targets import load_target

    data = make_shapes(8)
    local = ShapeColourTarget()
    with ServerThread(ShapeColourTarget()) as srv:
        remote = load_target(f"openai:{srv.base_url}")
        try:
            for check, params in (
                (TextAttack, {"samples": 8, "query_budget": 20}),
                (TypographicAttack, {"samples": 8}),
            ):
                [over_http] = run_check_class(check, remote, params, data=data)
                [in_process] = run_check_class(check, local, params, data=data)
                assert over_http.verdict == in_process.verdict and over_http.metrics == in_process.metrics
                assert over_http.metrics["attacked"] >= 1
        finally:
            remote.close()
