"""The chat experiments' known-answer probe: the service must still answer *correctly* after the method.

A steady state counts answers; it does not read them. A chat server can keep answering 200 within its
SLO after a fault while what it says is wrong (a cache or a request state the fault left behind, a
worker that came back broken) or empty. So before the method and after it, a chat experiment asks
colour questions about known-answer images of the built-in data
(:func:`mmchaos.data.vqa.known_answer_samples`, one colour each), every one once non-streamed and once
streamed, greedy, one at a time, through the proxy with no fault in. An item answered right before
must still be answered right after; one the target got wrong before is not held against it (the
model may not know the shapes), and with none right before nothing is judged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmchaos.chaos.payloads import good_path, png_data_url
from mmchaos.checks.evidence import png_bytes
from mmchaos.data.vqa import known_answer_samples
from mmchaos.findings import Finding, Severity, Verdict
from mmchaos.targets.openai_forms import chat_body, chat_image_content
from mmchaos.tasks.answers import is_right

if TYPE_CHECKING:
    import random

    import httpx

    from mmchaos.chaos.experiment import Experiment
    from mmchaos.chaos.load import LoadRequest
    from mmchaos.checks.base import AnyCheck, CheckContext
    from mmchaos.data.base import Sample

__all__ = ["AnswerProbe", "answers_finding", "known_answer_samples_for", "probe_answers"]

KIND = "colour"
"""The kind of question the probe asks (graded with :func:`mmchaos.tasks.answers.is_right`)."""


@dataclass
class AnswerProbe:
    """One pass of the probe: each item's outcome (``right``, ``wrong``, ``cut stream``, ``HTTP 500``,
    a transport error kind, ``not sent``) and the text it got."""

    label: str
    items: list[str]
    outcomes: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)

    @property
    def right(self) -> list[str]:
        return [k for k in self.items if self.outcomes.get(k) == "right"]

    def summary(self) -> dict[str, Any]:
        return {k: {"outcome": self.outcomes.get(k, "not sent"), "text": self.texts.get(k, "")[:80]}
                for k in self.items}  # fmt: skip


def known_answer_samples_for(ctx: CheckContext, n: int) -> list[Sample]:
    """``n`` known-answer images (different colours), deterministic by the run's seed."""
    return known_answer_samples(n, KIND, seed=ctx.seed) if n else []


def _text_of(response: httpx.Response, streamed: bool, path: str) -> str:
    if not streamed:
        content = json.loads(response.content)["choices"][0]["message"]["content"]
        return "" if content is None else str(content)
    from mmchaos.targets.openai_wire import EndpointError, sse_deltas

    try:
        return "".join(sse_deltas(response.text.splitlines(), path))
    except EndpointError as exc:
        raise _Cut(str(exc)) from None


class _Cut(ValueError):
    """A stream that ended before it said it was done."""


def probe_answers(ex: Experiment, label: str, samples: Sequence[Sample], max_tokens: int) -> AnswerProbe:
    """Ask every sample's question, non-streamed then streamed, one request at a time, within the
    experiment's budget (a load phase of its own, unguarded, journaled as a probe)."""
    from mmchaos.chaos.load import LoadRequest, PayloadMix

    path = good_path(ex.dep)
    items: list[tuple[str, Sample, bool]] = [
        (f"image {i + 1}{' (streamed)' if streamed else ''}", s, streamed)
        for streamed in (False, True)
        for i, s in enumerate(samples)
    ]
    probe = AnswerProbe(label, [k for k, _, _ in items])
    urls = [png_data_url(png_bytes(s.load_image())) for s in samples]
    headers = {"Content-Type": "application/json"}
    reasons: dict[str, str] = {}

    def request(n: int) -> LoadRequest:
        key, sample, streamed = items[n % len(items)]
        content = chat_image_content([urls[n % len(samples)]], str(sample.question))
        body = chat_body(ex.dep.model, content, max_tokens=max_tokens, temperature=0, stream=streamed)
        answers = tuple(sample.meta["answers"])

        def validate(response: httpx.Response) -> None:
            try:
                text = _text_of(response, streamed, path)
            except _Cut:
                reasons[key] = "cut stream"
                raise
            except (ValueError, KeyError, IndexError, TypeError):
                reasons[key] = "unreadable answer"
                raise
            probe.texts[key] = text
            if not is_right(text, KIND, answers):
                reasons[key] = "wrong"
                raise ValueError(f"not the known answer {answers[0]!r}: {text[:80]!r}")

        return LoadRequest(key, path, "POST", content=json.dumps(body).encode(), headers=headers, validate=validate)

    sent = [0]

    def factory(_: random.Random) -> LoadRequest:
        sent[0] += 1
        return request(sent[0] - 1)

    seconds = min(120.0, len(items) * ex.params.request_timeout_s + 1.0)
    ph = ex.phase(label, seconds=seconds, guarded=False, mix=PayloadMix([factory]), concurrency=1,
                  max_requests=len(items))  # fmt: skip
    for r in ph.result.records if ph.result is not None else []:
        if r.ok:
            probe.outcomes[r.kind] = "right"
        elif r.error == "bad_body":
            probe.outcomes[r.kind] = reasons.get(r.kind, "unreadable answer")
        else:
            probe.outcomes[r.kind] = f"HTTP {r.status}" if r.status else str(r.error)
    return probe


def answers_finding(
    check: AnyCheck,
    ctx: CheckContext,
    before: AnswerProbe,
    after: AnswerProbe | None,
    *,
    gated: bool,
    after_what: str,
) -> Finding:
    """Items answered right before the method must be answered right after it."""
    gate = f"every known-answer question answered right before {after_what} is answered right after"
    right = before.right
    evidence: dict[str, Any] = {
        "kind": KIND,
        "before": before.summary(),
        "after": None if after is None else after.summary(),
        "method": "known-answer images of the built-in data, each asked non-streamed and streamed",
    }
    if not right:
        why = (f"not judged: none of the {len(before.items)} known-answer questions was answered right before "
               f"{after_what} ({', '.join(sorted(set(before.outcomes.values())) or ['none answered'])})")  # fmt: skip
        return check.finding(ctx, Verdict.SKIPPED, f"known answers: {why}", message=why, gate=gate,
                             evidence=evidence)  # fmt: skip
    if after is None:
        why = f"not asked after {after_what}: the experiment stopped first"
        return check.finding(ctx, Verdict.SKIPPED, f"known answers: {why}", message=why, gate=gate,
                             evidence=evidence, metrics={"right_before": float(len(right))})  # fmt: skip
    lost = [k for k in right if after.outcomes.get(k) != "right"]
    metrics = {
        "asked": float(len(before.items)),
        "right_before": float(len(right)),
        "right_after": float(len(after.right)),
        "lost": float(len(lost)),
    }
    if not lost:
        return check.finding(
            ctx, Verdict.PASS,
            f"known answers: the {len(right)} of {len(before.items)} questions answered right before {after_what} "
            "are all answered right after",
            metrics=metrics, gate=gate, evidence=evidence,
        )  # fmt: skip
    shown = ", ".join(f"{k}: {after.outcomes.get(k, 'not sent')}" for k in lost[:4])
    message = f"{len(lost)} of the {len(right)} questions answered right before {after_what} are not after ({shown})"
    return check.finding(
        ctx,
        Verdict.FAIL if gated else Verdict.WARN,
        f"known answers: {message}",
        severity=Severity.HIGH if gated else Severity.LOW,
        metrics=metrics,
        gate=gate,
        message=message,
        suggestion=(
            "the service answers, but not correctly, after the faults: look for state a failed or cut request "
            "leaves behind (a cache entry, a request slot, an image buffer, a worker restarted without its model)"
        ),
        evidence=evidence,
    )
