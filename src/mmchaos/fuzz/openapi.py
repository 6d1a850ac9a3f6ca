"""The schema-driven phase against an HTTP server: bodies from its own OpenAPI document.

For every JSON request body the server declares (``/openapi.json``, which FastAPI servers such
as ``mmchaos serve`` publish), one valid instance is built from the schema and then broken one
way at a time: a required key missing, a value of the wrong type, null, huge or deeply nested,
an unknown key; plus bodies that are not JSON at all. A client's mistake must get a 4xx; a 5xx,
a dropped connection or a timeout is a failure, deduplicated by (method, path, status, code).
Every request goes through the run's :class:`~mmchaos.chaos.budget.RequestLedger`.
"""

from __future__ import annotations

import base64
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmchaos.chaos.budget import BudgetExhausted, ErrorInspector, RequestLedger, budgeted_transports, is_typed_error

__all__ = ["HttpFailure", "SchemaOutcome", "http_replay_command", "replay_request", "schema_phase"]

_DEEP = 5000
"""Nesting depth of the deep-nesting bodies (past CPython's default recursion limit)."""


@dataclass
class HttpFailure:
    signature: str
    method: str
    path: str
    label: str
    body: bytes
    content_type: str
    detail: str
    hits: int = 1

    def to_json(self) -> bytes:
        record = {"method": self.method, "path": self.path, "content_type": self.content_type,
                  "body_b64": base64.b64encode(self.body).decode("ascii"), "label": self.label}  # fmt: skip
        return json.dumps(record, indent=1).encode()


@dataclass
class SchemaOutcome:
    found: bool = False
    reason: str = ""
    operations: int = 0
    requests: int = 0
    status_counts: dict[str, int] = field(default_factory=dict)
    failures: dict[str, HttpFailure] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"found": self.found, "reason": self.reason, "operations": self.operations,
                "requests": self.requests, "failures": len(self.failures), "statuses": self.status_counts}  # fmt: skip


def _resolve(schema: Any, doc: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    if not isinstance(schema, dict) or depth > 20:
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = doc
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return _resolve(node, doc, depth + 1)
    for key in ("anyOf", "oneOf"):
        options = [o for o in schema.get(key, []) if _resolve(o, doc, depth + 1).get("type") != "null"]
        if options:
            return _resolve(options[0], doc, depth + 1)
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(_resolve(part, doc, depth + 1))
        return merged
    return schema


def example(schema: Any, doc: dict[str, Any], hints: dict[str, Any], depth: int = 0) -> Any:
    """A small valid instance of ``schema`` (required keys only; ``hints`` by property name)."""
    s = _resolve(schema, doc)
    if "default" in s and s["default"] is not None:
        return s["default"]
    if s.get("enum"):
        return s["enum"][0]
    if "const" in s:
        return s["const"]
    kind = s.get("type")
    if kind == "object" or "properties" in s:
        props = s.get("properties", {})
        out = {}
        for name in s.get("required", []):
            out[name] = hints[name] if name in hints else example(props.get(name, {}), doc, hints, depth + 1)
        return out
    if kind == "array":
        return [example(s.get("items", {}), doc, hints, depth + 1)] if depth < 6 else []
    if kind == "integer":
        return int(s.get("minimum", 1))
    if kind == "number":
        return float(s.get("minimum", 1.0))
    if kind == "boolean":
        return False
    if kind == "string":
        return "a photo of a cat"
    return "a photo of a cat"


def _bad_values(rng: np.random.Generator) -> list[tuple[str, Any]]:
    values: list[tuple[str, Any]] = [
        ("null", None), ("int", 123456789), ("negative", -1), ("huge_int", 2**70), ("float", 1e308),
        ("string", "x"), ("empty_string", ""), ("blank_string", " \t\n"), ("long_string", "A" * 200_000),
        ("empty_list", []), ("list", [1, "a", None]), ("object", {"a": {"b": [1]}}), ("bool", True),
        ("nested_list", [[[[[]]]]]),
    ]  # fmt: skip
    order = rng.permutation(len(values))
    return [values[int(i)] for i in order]


def _cases(body: dict[str, Any], props: dict[str, Any], rng: np.random.Generator) -> list[tuple[str, bytes, str]]:
    js = "application/json"
    out: list[tuple[str, bytes, str]] = [("valid", json.dumps(body).encode(), js)]
    for name in props:
        if name in body:
            rest = {k: v for k, v in body.items() if k != name}
            out.append((f"missing {name}", json.dumps(rest).encode(), js))
        for label, value in _bad_values(rng):
            out.append((f"{name}={label}", json.dumps({**body, name: value}).encode(), js))
    out += [
        ("unknown key", json.dumps({**body, "mmchaos_unknown": 1}).encode(), js),
        ("empty body", b"", js),
        ("truncated JSON", json.dumps(body).encode()[:-3], js),
        ("JSON array", b"[]", js),
        ("JSON null", b"null", js),
        ("deeply nested", b"[" * _DEEP + b"]" * _DEEP, js),
        ("deeply nested object", b'{"a":' * _DEEP + b"1" + b"}" * _DEEP, js),
        ("invalid UTF-8", b'{"input": "\xff\xfe"}', js),
        ("text/plain", json.dumps(body).encode(), "text/plain"),
    ]
    return out


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    ops = []
    for path, item in sorted((doc.get("paths") or {}).items()):
        if not isinstance(item, dict) or "{" in path:
            continue
        for method, op in sorted(item.items()):
            if method != "post" or not isinstance(op, dict):
                continue
            content = (op.get("requestBody") or {}).get("content") or {}
            schema = (content.get("application/json") or {}).get("schema")
            if schema is not None:
                ops.append((method.upper(), path, schema))
    return ops


def _accepted_body(
    client: Any, method: str, url: str, schema: Any, doc: dict[str, Any], hints: dict[str, Any], outcome: SchemaOutcome
) -> dict[str, Any]:
    """The base body to break: the required keys, plus the first optional key the server needs.

    A schema often cannot say "one of these two keys" (``input`` or ``messages``); the server can.
    Up to one request per optional property finds a body it accepts (else the required keys only).
    """
    import httpx

    s = _resolve(schema, doc)
    base = example(schema, doc, hints)
    base = base if isinstance(base, dict) else {}
    props = s.get("properties", {})
    candidates = [base] + [
        {**base, name: hints[name] if name in hints else example(sub, doc, hints)}
        for name, sub in props.items()
        if name not in base
    ]
    for body in candidates[:8]:
        try:
            resp = client.request(method, url, json=body)
        except httpx.HTTPError:
            continue
        outcome.requests += 1
        if resp.status_code < 400:
            return body
    return base


def _signature(method: str, path: str, status: int | None, body: bytes, exc: str) -> str:
    if status is None:
        return f"http:{method} {path}:{exc}"
    _, code = is_typed_error(body)
    return f"http:{method} {path}:{status}:{code or 'untyped'}"


def schema_phase(
    base_url: str, ledger: RequestLedger, rng: np.random.Generator, *, model: str = "", timeout_s: float = 10.0
) -> SchemaOutcome:
    """Fetch the OpenAPI document and send broken bodies for every JSON operation, within ``ledger``."""
    import httpx

    outcome = SchemaOutcome()
    _, sync_cls = budgeted_transports()
    transport = sync_cls(httpx.HTTPTransport(), ledger, ErrorInspector())
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    with httpx.Client(transport=transport, timeout=timeout_s, trust_env=False, follow_redirects=False) as client:
        doc: Any = None
        for url in (f"{root}/openapi.json", f"{base_url.rstrip('/')}/openapi.json"):
            try:
                resp = client.get(url)
            except (httpx.HTTPError, BudgetExhausted) as exc:
                outcome.reason = f"GET {url}: {type(exc).__name__}"
                continue
            if resp.status_code == 200:
                try:
                    doc = resp.json()
                except ValueError:
                    doc = None
                if isinstance(doc, dict) and "paths" in doc:
                    break
            outcome.reason = f"GET {url}: HTTP {resp.status_code}"
        if not isinstance(doc, dict) or "paths" not in doc:
            outcome.reason = outcome.reason or "no OpenAPI document"
            return outcome
        outcome.found = True
        outcome.reason = ""
        hints: dict[str, Any] = {"role": "user", **({"model": model} if model else {})}
        ops = _operations(doc)
        outcome.operations = len(ops)
        for n, (method, path, schema) in enumerate(ops):
            share = ledger.remaining_requests() // (len(ops) - n)  # the budget split evenly over operations
            sent = ledger.sent
            props = _resolve(schema, doc).get("properties", {})
            try:
                body = _accepted_body(client, method, f"{root}{path}", schema, doc, hints, outcome)
            except BudgetExhausted:
                return outcome
            cases = _cases(body if isinstance(body, dict) else {}, props, rng)
            left = max(0, share - (ledger.sent - sent))
            if left < len(cases):  # a sample of the broken bodies, the valid one first
                keep = sorted(int(i) for i in rng.choice(np.arange(1, len(cases)), max(0, left - 1), replace=False))
                cases = [cases[0], *(cases[i] for i in keep)][:left]
            for label, content, ctype in cases:
                try:
                    resp = client.request(method, f"{root}{path}", content=content, headers={"Content-Type": ctype})
                    status: int | None = resp.status_code
                    answer, exc_name = resp.content, ""
                except BudgetExhausted:
                    return outcome
                except httpx.HTTPError as exc:
                    status, answer, exc_name = None, b"", type(exc).__name__
                outcome.requests += 1
                key = str(status) if status is not None else exc_name
                outcome.status_counts[key] = outcome.status_counts.get(key, 0) + 1
                if status is not None and status < 500:
                    continue
                sig = _signature(method, path, status, answer, exc_name)
                if sig in outcome.failures:
                    outcome.failures[sig].hits += 1
                    continue
                detail = f"HTTP {status}" if status is not None else f"no answer ({exc_name})"
                outcome.failures[sig] = HttpFailure(sig, method, path, label, content, ctype, detail)
    return outcome


def http_replay_command(uri: str, file_name: str) -> str:
    parts = ["mmchaos", "fuzz-replay", f"evidence/{file_name}", "--target", uri]
    return " ".join(shlex.quote(p) for p in parts)


def replay_request(base_url: str, record: dict[str, Any], *, timeout_s: float = 30.0) -> tuple[int | None, str]:
    """Send one saved request again (loopback only); (status or None, what happened)."""
    import httpx

    from mmchaos.net import is_loopback_host

    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    url = httpx.URL(f"{root}{record['path']}")
    if not is_loopback_host(url.host):
        from mmchaos.errors import UsageError

        raise UsageError(f"refusing to replay against {url.host}: not a loopback address", code="remote_not_allowed")
    body = base64.b64decode(record.get("body_b64", ""))
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        try:
            ctype = str(record.get("content_type", "application/json"))
            resp = client.request(str(record["method"]), url, content=body, headers={"Content-Type": ctype})
        except httpx.HTTPError as exc:
            return None, f"no answer ({type(exc).__name__})"
    return resp.status_code, f"HTTP {resp.status_code}: {resp.text[:200]}"
