"""The server's errors become HTTP answers in one place (server/http_errors.py): every code the
server raises has its own status there, each kind of error maps to the answer the API documents,
and no other module builds an error answer."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mmchaos.error_codes import CODES, status_of
from mmchaos.errors import CapabilityError, ConfigError, TargetCallError
from mmchaos.guard.breaker import BreakerState, CallNotPermitted
from mmchaos.guard.preflight import PREFLIGHT_CODES, Preflight, PreflightError
from mmchaos.server.errors import BadModelOutput, ModelFailure, ServerError
from mmchaos.server.http_errors import CLIENT_CLOSED, ErrorAnswer, http_status, to_answer
from tests.paths import REPO

SERVER = REPO / "src" / "mmchaos" / "server"


def _raised_codes() -> dict[str, str]:
    """code -> a module of the server raising it as ``ServerError(..., code="...")`` or ``BadModelOutput``."""
    found: dict[str, str] = {}
    for path in sorted(SERVER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or getattr(node.func, "id", None) not in (
                "ServerError",
                "BadModelOutput",
            ):
                continue
            for kw in node.keywords:
                if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                    found.setdefault(kw.value.value, str(path.relative_to(SERVER)))
    return found


def test_the_scan_finds_the_server_codes() -> None:
    """Guard against a scan that finds nothing (a test that cannot fail)."""
    codes = _raised_codes()
    assert {"queue_full", "model_not_found", "bad_model_output", "invalid_api_key"} <= set(codes)
    assert len(codes) > 25


@pytest.mark.parametrize("code", sorted(_raised_codes()))
def test_every_code_the_server_raises_has_its_status_in_the_table(code: str) -> None:
    """An unknown code falls back to 500: a new code without an entry would be a silent 5xx."""
    assert code in CODES
    assert http_status(code) == CODES[code].status


def test_a_code_has_the_tables_status_and_only_the_origin_can_override_it() -> None:
    assert http_status("image_too_large") == status_of("image_too_large") == 413
    assert http_status("no_such_code") == 500  # not in the table: the fallback
    assert http_status("no_such_code", fallback=422) == 422  # e.g. the status of the error's class
    # the bare decoder refused the request's image: the code's own status, guards on or off ...
    assert http_status("image_too_large", "request") == 413
    # ... and 400 where the code's status would blame the server for the request's content
    assert CODES["generate_failed"].status == 500 and http_status("generate_failed", "request") == 400
    assert http_status("http_error", "framework", 418) == 418  # Starlette's own status


def _body(answer: ErrorAnswer) -> dict[str, object]:
    body: dict[str, object] = json.loads(answer.response().body)["error"]
    return body


def test_server_errors_carry_status_param_and_retry_after() -> None:
    answer = to_answer(ServerError("at capacity", code="queue_full", retry_after=3))
    assert (answer.status, answer.headers["Retry-After"]) == (429, "3")
    assert _body(answer) == {"message": "at capacity", "type": "rate_limit_error", "param": None, "code": "queue_full"}
    answer = to_answer(ServerError("slow body", code="body_timeout", headers={"Connection": "close"}))
    assert (answer.status, answer.type, dict(answer.headers)) == (408, "timeout_error", {"Connection": "close"})
    answer = to_answer(ServerError("too many", code="too_many_inputs", param="input"))
    assert (answer.status, _body(answer)["param"]) == (413, "input")
    assert to_answer(ServerError("gone", code="client_disconnected")).status == CLIENT_CLOSED


def test_library_errors_map_to_the_documented_statuses() -> None:
    with pytest.raises(PreflightError) as refused:
        Preflight().text(b"\xff\xfe")  # type: ignore[arg-type]
    assert to_answer(refused.value).status == PREFLIGHT_CODES[refused.value.code]
    breaker = to_answer(CallNotPermitted("model", BreakerState.OPEN, retry_after=1.2))
    assert (breaker.status, breaker.code, breaker.headers["Retry-After"]) == (503, "call_not_permitted", "2")
    assert to_answer(CapabilityError("cannot embed", code="capability_missing")).status == 400
    refusal = to_answer(TargetCallError("no", code="a_plugins_own_code"))  # not in the table: its class's 422
    assert (refusal.status, refusal.code) == (422, "a_plugins_own_code")
    assert to_answer(TargetCallError("no", code="generate_failed")).status == status_of("generate_failed")
    assert to_answer(BadModelOutput("NaN", code="non_finite_output")).type == "server_error"
    assert to_answer(ConfigError("broken")).status == status_of("config_invalid")


def test_a_foreign_exception_is_the_models_failure() -> None:
    answer = to_answer(ZeroDivisionError("boom"))
    assert (answer.status, answer.code) == (500, "model_error")
    assert answer.message == "the model raised ZeroDivisionError: boom"
    assert to_answer(ModelFailure(KeyError("k"))).code == "model_error"


def test_fastapi_refusals() -> None:
    assert to_answer(StarletteHTTPException(404, "Not Found")).code == "not_found"
    allowed = to_answer(StarletteHTTPException(405, "Method Not Allowed", headers={"Allow": "GET"}))
    assert (allowed.status, allowed.code, dict(allowed.headers)) == (405, "method_not_allowed", {"Allow": "GET"})
    teapot = to_answer(StarletteHTTPException(418, "teapot"))
    assert (teapot.status, teapot.code) == (418, "http_error")
    parse = StarletteHTTPException(400, "parse error")
    parse.__cause__ = ValueError("bad utf-8")
    assert to_answer(parse).code == "invalid_json"
    invalid = to_answer(RequestValidationError([{"loc": ("body", "input"), "msg": "bad", "type": "x"}]))
    assert (invalid.status, invalid.code, invalid.param, invalid.message) == (
        400,
        "invalid_request",
        "input",
        "input: bad",
    )
    assert to_answer(RequestValidationError([{"loc": ("body",), "type": "json_invalid"}])).code == "invalid_json"


def test_a_stream_error_event_has_the_answer_body() -> None:
    answer = to_answer(ServerError("no token for 1s", code="request_timeout"))
    event = answer.event()
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[6:]) == answer.body()


def _answer_builders(root: Path) -> list[str]:
    """Where a module under ``root`` other than http_errors.py builds an HTTP error answer itself."""
    builders = {"ErrorAnswer", "JSONResponse", "HTTPError", "HTTPException"}
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "http_errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in builders:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {name}(")
    return found


def test_no_other_server_module_builds_an_error_answer() -> None:
    """One place maps errors to HTTP: elsewhere the server raises domain errors."""
    assert _answer_builders(SERVER) == []


def test_the_one_place_check_finds_a_planted_answer(tmp_path: Path) -> None:
    """The check above can fail: an answer built in an endpoint module is found, http_errors.py's are not."""
    (tmp_path / "endpoints").mkdir()
    (tmp_path / "endpoints" / "embeddings.py").write_text("JSONResponse({'error': {}}, status_code=400)\n")
    (tmp_path / "http_errors.py").write_text("ErrorAnswer(400, 'x', 'y')\n")
    assert _answer_builders(tmp_path) == ["endpoints/embeddings.py:1 JSONResponse("]
