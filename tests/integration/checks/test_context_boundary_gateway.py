"""``context_boundary`` over ``openai:`` against ``mmchaos serve --target builtin:tiny-clip`` (real
server, real model), directly and behind a FAKE gateway that strips the ``mmchaos`` block of
``/v1/models`` (tests/fakes/gateway.py). Issue 20: behind the gateway the check became a skip with
no reason and the warning that fails ``--strict`` was lost; now the limit is probed, in a bounded
number of requests, and the evidence says where it came from."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mmchaos.checks.engine.context_boundary import ContextBoundary
from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding, Verdict
from mmchaos.server import ServerConfig, ServerThread
from mmchaos.targets import load_target
from mmchaos.targets.openai_http import OpenAITarget
from tests.fakes.gateway import stripping_gateway
from tests.support import run_check_class

pytestmark = pytest.mark.integration

DATA = make_shapes(8, seed=1)


@pytest.fixture(scope="module")
def served() -> Iterator[ServerThread]:
    pytest.importorskip("transformers")
    clip = load_target("builtin:tiny-clip")
    with ServerThread(clip, ServerConfig()) as srv:
        yield srv
    clip.close()


def _parts(url: str) -> dict[str, Finding]:
    target = OpenAITarget.connect(url)
    try:
        return {f.evidence["part"]: f for f in run_check_class(ContextBoundary, target, {}, data=DATA)}
    finally:
        target.close()


@pytest.mark.check_contract("context_boundary", "broken")
def test_behind_a_gateway_the_limit_is_probed_and_the_warning_kept(served: ServerThread) -> None:
    direct = _parts(served.base_url)
    assert direct["beyond"].verdict == Verdict.WARN and direct["beyond"].evidence["limit_source"] == "metadata"
    with stripping_gateway(served.url) as (url, gateway):
        parts = _parts(url)
        embeddings = sum(r == "POST /v1/embeddings" for r in gateway.requests)
    beyond = parts["beyond"]
    assert beyond.verdict == Verdict.WARN  # the same warning as without the gateway: --strict still fails
    assert beyond.evidence["limit_source"] == "probed"
    assert beyond.evidence["limit"] == direct["beyond"].evidence["limit"] == 32  # tiny-clip's positions
    probe = beyond.evidence["limit_probe"]
    assert probe["outcome"] == "found" and probe["requests"] <= 12
    assert parts["within"].verdict == Verdict.PASS and parts["eos"].verdict == Verdict.PASS
    assert len(probe["tried"]) == probe["requests"] and embeddings >= probe["requests"] + 10  # + 8 texts, EOS pair
