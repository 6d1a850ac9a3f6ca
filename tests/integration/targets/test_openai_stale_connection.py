"""A keep-alive connection the server closed after its 500 (uvicorn's way, under ``transformers
serve``) must not turn the NEXT request into a crash of its own: the openai target sends a request
reset on a reused connection again, once, on a new one. A reset on a new connection stays the
server's failure (``connection_failed``), not retried."""

from __future__ import annotations

import pytest

from mmchaos.targets.generation import GenerationParams
from mmchaos.targets.openai_http import EndpointError, OpenAITarget
from tests.fakes.closing_server import ClosingConfig, closing_server

pytestmark = pytest.mark.integration

ONE = GenerationParams(max_new_tokens=2, logprobs=False)


def test_the_request_after_a_500_is_not_blamed_for_the_closed_connection() -> None:
    config = ClosingConfig()
    with closing_server(config) as url:
        target = OpenAITarget.connect(url, capabilities=["generate"], max_concurrency=1)
        try:
            with pytest.raises(EndpointError) as crashed:
                target.generate("crash now", (), ONE)
            assert crashed.value.status == 500  # the bad request's own failure, reported
            assert target.generate("hello", (), ONE).text == "ok"  # the next one is answered
            assert target.generate("again", (), ONE).text == "ok"
            with pytest.raises(EndpointError):
                target.generate("crash now", (), ONE)
            assert "".join(target.generate_stream("a stream", (), ONE)) == "ok"  # a stream, too
        finally:
            target.close()
    assert config.dropped == 2, "the next requests did reach the given-up connections (the race, lost)"
    assert target.reconnects == 2
    assert target.describe()["endpoint"]["reconnects"] == 2


def test_a_reset_on_a_new_connection_is_still_the_servers_failure() -> None:
    config = ClosingConfig(reset_all=True)
    with closing_server(config) as url:
        target = OpenAITarget.connect(url, capabilities=["generate"], max_concurrency=1)
        try:
            with pytest.raises(EndpointError) as reset:
                target.generate("hello", (), ONE)
        finally:
            target.close()
    assert reset.value.code == "connection_failed"
    # The first try went out on the connection kept alive from GET /models and was sent again; the
    # second, on a new connection, was reset too: that one is the server's, and not retried.
    assert config.dropped == 2 and target.reconnects == 1
