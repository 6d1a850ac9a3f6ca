"""Why a steady-state probe did not hold: what missed the SLO, and what the failed good requests got.

A probe of clean traffic fails for one of two reasons. The service did not hold its SLO (errors,
timeouts, slow answers): a finding about the service. Or the service refused the harness's own
good requests as bad ones (a 4xx other than 408 and 429: a request form the endpoint does not take,
a wrong model name or API key, a size limit): then nothing about the service's resilience was
measured, and the journal and the finding say it is a harness or configuration problem.
"""

from __future__ import annotations

from typing import Any

from mmchaos.chaos.spec import SLOSpec
from mmchaos.chaos.windows import Phase

__all__ = ["explain_unmet", "is_refusal"]


def is_refusal(status: int | None) -> bool:
    """A 4xx that refuses the request itself (not a timeout, 408, or a rate limit, 429)."""
    return status is not None and 400 <= status < 500 and status not in (408, 429)


def _error_codes(ph: Phase) -> dict[int, dict[str, int]]:
    """The error codes of the answers to good traffic by status, from the phase's error bodies."""
    out: dict[int, dict[str, int]] = {}
    for label, n in (ph.errors.get("by_kind_status_code") or {}).items():
        kind, status, code = str(label).split(":", 2)
        if kind == "good":
            by = out.setdefault(int(status), {})
            by[code] = by.get(code, 0) + int(n)
    return out


def explain_unmet(ph: Phase, slo: SLOSpec, *, before: bool) -> dict[str, Any]:
    """``why`` (one line), ``failed_good_requests`` (status codes, error codes, transport errors) and
    ``harness_problem``: the probe ran before any fault and every failed request was refused (4xx)."""
    if ph.result is None:
        return {"why": f"not probed: {ph.skipped}", "failed_good_requests": {}, "harness_problem": False}
    r = ph.result
    failed = [x for x in r.records if x.error is not None and x.error != "client_shed"]
    statuses: dict[str, int] = {}
    transport: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for x in failed:
        kinds[x.kind] = kinds.get(x.kind, 0) + 1
        if x.status is not None:
            key = str(x.status) if x.error != "bad_body" else f"{x.status} (invalid body)"
            statuses[key] = statuses.get(key, 0) + 1
        else:
            transport[str(x.error)] = transport.get(str(x.error), 0) + 1
    codes = _error_codes(ph)
    described: list[str] = []
    for key, n in sorted(statuses.items(), key=lambda kv: -kv[1]):
        status = int(key.split()[0])
        by_code = codes.get(status) or {}
        if len(by_code) == 1:
            shown = f" {next(iter(by_code))}"
        else:
            shown = " (" + ", ".join(f"{c} x{m}" for c, m in sorted(by_code.items())) + ")" if by_code else ""
        described.append(f"{n} x HTTP {key}{shown}")
    described += [f"{n} x {kind}" for kind, n in sorted(transport.items(), key=lambda kv: -kv[1])]
    parts: list[str] = []
    if r.success_rate < slo.min_success_rate:
        parts.append(f"success rate {r.success_rate:.2%} < {slo.min_success_rate:.2%}")
    if r.latency.p99_ms is None:
        parts.append("no request completed")
    elif r.latency.p99_ms > slo.p99_ms:
        parts.append(f"p99 {r.latency.p99_ms:g} ms > {slo.p99_ms:g} ms")
    if r.attempted == 0:
        parts.append("no request was attempted")
    if described:
        parts.append("failed good requests: " + ", ".join(described))
    refused = sum(1 for x in failed if is_refusal(x.status))
    harness = before and refused > 0 and refused == len(failed)
    if before and refused:
        refusals = sorted({str(x.status) for x in failed if is_refusal(x.status)})
        refused_kinds = sorted({x.kind for x in failed if is_refusal(x.status)})
        parts.append(
            f"the service refused {refused} of mmchaos's own good requests (HTTP {', '.join(refusals)}; "
            f"{', '.join(refused_kinds)}): "
            "a harness or configuration problem (the request's image form, the model name, the API key, "
            "a size limit; the journal's experiment.traffic says what was sent), not a resilience failure"
        )
    return {
        "why": "; ".join(parts) or "the SLO was not met",
        "failed_good_requests": {
            "count": len(failed),
            "status_codes": statuses,
            "error_codes": {f"{s}:{c}": n for s, by in sorted(codes.items()) for c, n in sorted(by.items())},
            "transport": transport,
            "kinds": dict(sorted(kinds.items())),
        },
        "harness_problem": harness,
    }
