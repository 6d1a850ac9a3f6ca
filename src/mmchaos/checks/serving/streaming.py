"""``serving_streaming``: a chat endpoint's stream against its own non-streamed answers, its token
latencies under a small bounded load, and what a client leaving mid-stream leaves behind.

Three findings:

- **equivalence**: for greedy requests, the concatenated ``delta.content`` of the server-sent events
  must equal the non-streamed ``message.content``, and every stream must end with ``data: [DONE]``
  or, where the connection closes without it, with choice 0's ``finish_reason`` (transformers
  serve's shape, which the openai SDK accepts); a stream that drops its last delta, or is cut before
  it says it is done, fails;
- **latency**: TTFT, TPOT and inter-token latency percentiles and goodput (streams that met both
  the TTFT and TPOT objectives, per second and as a share) under ``load_requests`` streamed
  requests, ``concurrency`` at a time;
- **disconnect**: a client reads the first delta of a long stream and closes the connection; the
  server's ``vllm:num_requests_running`` must return to where it was within ``release_timeout_s``
  and the next request must be answered (a server that keeps generating for nobody holds a slot).
  A server without that gauge is probed from outside (:mod:`mmchaos.chaos.slot_probe`): every
  stream it admits at once is held and left (its capacity, up to ``max_probe_streams``, or
  ``capacity`` when given), then more than that many again one by one, then as many at once must be
  admitted and answered within the TTFT objective by ``release_timeout_s``. The finding names its
  method (``gauge`` or ``black-box probe``) and says "the slot was given back" only when one of them
  showed it.

An in-process target is served by the reference server for the check; an ``openai:`` target is
used as it is (loopback only unless allowed).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos.chaos.deployment import Deployment
from mmchaos.chaos.slot_probe import METHOD, leave_mid_stream, probe_slot_release
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.evidence import png_bytes
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.server.config import ServerConfig
from mmchaos.targets.base import Capability
from mmchaos.targets.openai_forms import chat_body, chat_image_content
from mmchaos.targets.openai_wire import data_url

__all__ = ["ServingStreaming", "StreamRecord", "parse_sse", "percentile"]


class ServingStreamingParams(Params):
    prompt: str = Field("Describe the image in a few words.", min_length=1)
    requests: int = Field(4, ge=1, le=256, description="greedy requests compared streamed vs not")
    max_tokens: int = Field(16, ge=1, le=4096)
    load_requests: int = Field(16, ge=0, le=10_000, description="streamed requests of the latency load")
    concurrency: int = Field(4, ge=1, le=256)
    max_duration_s: float = Field(60.0, gt=0.0, le=3600.0, description="no load request starts after this, s")
    request_timeout_s: float = Field(30.0, gt=0.0, le=600.0)
    disconnect: bool = Field(True, description="probe a client leaving mid-stream")
    disconnect_max_tokens: int = Field(512, ge=2, le=100_000, description="long enough to still run when left")
    release_timeout_s: float = Field(5.0, gt=0.0, le=600.0, description="the slot must be free again within, s")
    max_probe_streams: int = Field(
        16, ge=1, le=256, description="without a gauge: the most streams held at once to find the server's capacity"
    )
    capacity: int | None = Field(
        None, ge=1, le=256, description="without a gauge: streams the server holds at once, if known (else probed)"
    )
    loopback_only: bool = True
    server: ServerConfig = Field(
        default_factory=lambda: ServerConfig.model_validate({}),
        description="the reference server the check starts for an in-process target (ignored for openai:)",
    )


class ServingStreamingGate(Gate):
    streaming_equivalent: bool = Field(True, description="streamed text equals the non-streamed text (greedy)")
    ttft_slo_ms: float = Field(2000.0, gt=0.0, description="time to first token objective, per request")
    tpot_slo_ms: float = Field(500.0, gt=0.0, description="time per output token objective, per request")
    max_ttft_p95_ms: float | None = Field(None, gt=0.0, description="default: ttft_slo_ms")
    max_tpot_p95_ms: float | None = Field(None, gt=0.0, description="default: tpot_slo_ms")
    min_goodput_ratio: float = Field(0.9, ge=0.0, le=1.0, description="share of streams meeting both objectives")
    slot_released: bool = Field(True, description="a client leaving mid-stream gives its slot back")


@dataclass
class StreamRecord:
    """One streamed request as the client saw it (times in seconds from sending it)."""

    status: int = 0
    text: str = ""
    deltas: int = 0
    done: bool = False
    """Complete: ``data: [DONE]`` came, or the stream ended after choice 0's finish_reason."""
    done_marker: bool = False
    """``data: [DONE]`` itself came."""
    error: str | None = None
    ttft: float | None = None
    delta_times: list[float] = field(default_factory=list)
    e2e: float | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and self.error is None

    def itl(self) -> list[float]:
        t = self.delta_times
        return [b - a for a, b in itertools.pairwise(t)]

    def tpot(self) -> float | None:
        """(last delta - first delta) / (output tokens - 1): tokens from usage, else the deltas."""
        tokens = self.completion_tokens or self.deltas
        if len(self.delta_times) < 2 or tokens < 2:
            return None
        return (self.delta_times[-1] - self.delta_times[0]) / (tokens - 1)


def parse_sse(lines: Iterator[str], record: StreamRecord, start: float) -> None:
    """Fill ``record`` from server-sent event lines (OpenAI's chat.completion.chunk events)."""
    cut = False
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        now = time.perf_counter() - start
        if data == "[DONE]":
            record.done = record.done_marker = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            record.error = f"malformed event: {data[:120]}"
            cut = True
            break
        if "error" in chunk:
            record.error = f"error event: {str(chunk['error'])[:200]}"
            continue
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            record.completion_tokens = usage["completion_tokens"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or int(choice.get("index", 0)) != 0:
                continue
            if choice.get("finish_reason"):
                record.finish_reason = str(choice["finish_reason"])
            content = (choice.get("delta") or {}).get("content")
            if content:
                record.text += str(content)
                record.deltas += 1
                record.delta_times.append(now)
                if record.ttft is None:
                    record.ttft = now
    if not cut and record.finish_reason is not None:
        record.done = True  # the connection closed after the finish_reason: a complete stream
    record.e2e = time.perf_counter() - start


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _ms(x: float) -> float:
    return round(x * 1000.0, 3)


def _measured_ms(**values: float | None) -> dict[str, float]:
    """Milliseconds of what was measured; what was not is left out, never a placeholder."""
    return {k: _ms(v) for k, v in values.items() if v is not None}


class _Client:
    """The check's own HTTP client for one deployment (httpx, bounded timeouts)."""

    def __init__(self, dep: Deployment, timeout: float) -> None:
        import httpx

        self.dep = dep
        self.base = dep.root + dep.prefix
        self.http = httpx.Client(timeout=timeout, headers=dict(dep.auth), trust_env=False)

    def body(self, content: Any, max_tokens: int, stream: bool) -> dict[str, Any]:
        out = chat_body(self.dep.model, content, max_tokens=max_tokens, temperature=0, stream=stream)
        if stream:
            out["stream_options"] = {"include_usage": True}
        return out

    def complete(self, content: Any, max_tokens: int) -> tuple[int, str | None, str]:
        """(status, text or None, error)."""
        try:
            resp = self.http.post(f"{self.base}/chat/completions", json=self.body(content, max_tokens, False))
        except Exception as exc:  # the transport failed: recorded, never raised
            return 0, None, f"{type(exc).__name__}: {exc}"
        if resp.status_code != 200:
            return resp.status_code, None, resp.text[:200]
        try:
            text = resp.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return resp.status_code, None, f"malformed answer: {exc!r}"
        return 200, "" if text is None else str(text), ""

    def stream(self, content: Any, max_tokens: int) -> StreamRecord:
        record = StreamRecord()
        start = time.perf_counter()
        try:
            with self.http.stream("POST", f"{self.base}/chat/completions",
                                  json=self.body(content, max_tokens, True)) as resp:  # fmt: skip
                record.status = resp.status_code
                if resp.status_code != 200:
                    resp.read()
                    record.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    return record
                parse_sse(resp.iter_lines(), record, start)
        except Exception as exc:  # a reset or timeout mid-stream: recorded, never raised
            record.error = f"{type(exc).__name__}: {exc}"
        if record.e2e is None:
            record.e2e = time.perf_counter() - start
        return record

    def running(self) -> float | None:
        """``vllm:num_requests_running`` from the server's /metrics (summed), or None when absent."""
        try:
            resp = self.http.get(f"{self.dep.root}/metrics")
        except Exception:
            return None
        if resp.status_code != 200:
            return None
        values = [float(line.split()[-1]) for line in resp.text.splitlines()
                  if line.startswith("vllm:num_requests_running")]  # fmt: skip
        return sum(values) if values else None

    def close(self) -> None:
        self.http.close()


class ServingStreaming(Check[ServingStreamingParams, ServingStreamingGate]):
    """Streamed chat equals non-streamed (greedy); TTFT/TPOT/ITL and goodput under load; disconnect frees the slot."""

    name = "serving_streaming"
    step = Step.SERVING
    requires = (frozenset({Capability.GENERATE}),)

    def _contents(self, ctx: CheckContext, count: int) -> list[Any]:
        """Request contents: the dataset's images (a PNG data URL each) with the prompt; text only without."""
        p = self.params
        images = [s for s in ctx.dataset if s.has_image][: max(1, count)]
        if not images:
            return [f"{p.prompt} ({i})" for i in range(count)]
        out = []
        for i in range(count):
            url = data_url(png_bytes(images[i % len(images)].load_image()))
            out.append(chat_image_content([url], p.prompt))
        return out

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        dep = Deployment(ctx.target, p.server, proxy=False, seed=ctx.seed, loopback_only=p.loopback_only)
        bar = ctx.progress.task(f"{ctx.check_id}: streams", total=p.requests + p.load_requests + 1)
        try:
            dep.start()
            client = _Client(dep, p.request_timeout_s)
            try:
                yield self._equivalence(ctx, client, bar)
                if p.load_requests:
                    yield self._latency(ctx, client, bar)
                if p.disconnect:
                    yield self._disconnect(ctx, dep, client)
                bar.advance()
            finally:
                client.close()
        finally:
            bar.close()
            dep.close()

    # -- equivalence -----------------------------------------------------------------------------

    def _equivalence(self, ctx: CheckContext, client: _Client, bar: Any) -> Finding:
        p, g = self.params, self.gate
        rows: list[dict[str, Any]] = []
        problems: list[str] = []
        for i, content in enumerate(self._contents(ctx, p.requests)):
            status, text, err = client.complete(content, p.max_tokens)
            rec = client.stream(content, p.max_tokens)
            bar.advance()
            row: dict[str, Any] = {"request": i, "non_streamed_status": status, "stream_status": rec.status,
                                   "done": rec.done, "deltas": rec.deltas}  # fmt: skip
            if text is None:
                problems.append(f"request {i}: the non-streamed answer failed ({status}: {err})")
            elif not rec.ok:
                row["stream_failed"] = True
                why = rec.error or "cut before its finish_reason or [DONE]"
                problems.append(f"request {i}: the stream failed ({why})")
            elif rec.text != text:
                at = next((k for k, (a, b) in enumerate(zip(rec.text, text, strict=False)) if a != b),
                          min(len(rec.text), len(text)))  # fmt: skip
                row.update(first_difference=at, streamed=rec.text[max(0, at - 20) : at + 40],
                           non_streamed=text[max(0, at - 20) : at + 40],
                           streamed_chars=len(rec.text), non_streamed_chars=len(text))  # fmt: skip
                problems.append(
                    f"request {i}: the streamed text differs from the non-streamed one at character {at} "
                    f"({len(rec.text)} vs {len(text)} characters)"
                )
            rows.append(row)
        mismatches = sum(1 for r in rows if "first_difference" in r)
        failures = len(problems) - mismatches
        equal = len(rows) - len(problems)
        failed = bool(problems) and g.streaming_equivalent
        title = (
            f"streaming equivalence: {equal}/{len(rows)} greedy streams complete and equal their non-streamed answer"
        )
        if failures:
            title += f" ({failures} could not be compared: the request or its stream failed)"
        return self.finding(
            ctx,
            Verdict.FAIL if failed else Verdict.PASS,
            title,
            severity=Severity.HIGH if failed else Severity.INFO,
            metrics={"requests": float(len(rows)), "mismatches": float(mismatches), "failures": float(failures)},
            gate="concatenated SSE deltas == non-streamed text for every greedy request; every stream ends with "
            "data: [DONE] or its finish_reason",
            message="; ".join(problems[:3]),
            suggestion=(
                "the stream loses or reorders text: flush the detokenizer's held-back text at the end of the "
                "stream, send every delta before [DONE], and stream from the same decoding as the full answer"
                if failed
                else ""
            ),
            evidence={"requests": rows, "max_tokens": p.max_tokens},
        )

    # -- latency -----------------------------------------------------------------------------------

    def _latency(self, ctx: CheckContext, client: _Client, bar: Any) -> Finding:
        p, g = self.params, self.gate
        contents = self._contents(ctx, p.load_requests)
        deadline = time.monotonic() + p.max_duration_s
        records: list[StreamRecord] = []

        def one(content: Any) -> StreamRecord | None:
            if time.monotonic() > deadline:
                return None  # the load's time bound: requests not started are not sent
            return client.stream(content, p.max_tokens)

        started = time.perf_counter()
        with ThreadPoolExecutor(p.concurrency, thread_name_prefix="mmchaos-stream-load") as pool:
            for rec in pool.map(one, contents):
                bar.advance()
                if rec is not None:
                    records.append(rec)
        wall = time.perf_counter() - started
        ok = [r for r in records if r.ok]
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        tpots = [t for t in (r.tpot() for r in ok) if t is not None]
        itls = [x for r in ok for x in r.itl()]
        e2es = [r.e2e for r in ok if r.e2e is not None]
        ttft_slo, tpot_slo = g.ttft_slo_ms / 1000.0, g.tpot_slo_ms / 1000.0
        good = [r for r in ok if r.ttft is not None and r.ttft <= ttft_slo and (r.tpot() or 0.0) <= tpot_slo]
        ratio = len(good) / len(records) if records else None
        metrics: dict[str, float] = {
            "requests": float(len(records)),
            "errors": float(len(records) - len(ok)),
            **_measured_ms(
                ttft_p50_ms=percentile(ttfts, 50), ttft_p95_ms=percentile(ttfts, 95), ttft_p99_ms=percentile(ttfts, 99),
                tpot_p50_ms=percentile(tpots, 50), tpot_p95_ms=percentile(tpots, 95),
                itl_p50_ms=percentile(itls, 50), itl_p95_ms=percentile(itls, 95), itl_p99_ms=percentile(itls, 99),
                e2e_p50_ms=percentile(e2es, 50), e2e_p95_ms=percentile(e2es, 95),
            ),
        }  # fmt: skip
        if records and wall > 0:
            metrics.update(throughput_rps=len(ok) / wall, goodput_rps=len(good) / wall)
        if ratio is not None:
            metrics["goodput_ratio"] = ratio
        max_ttft = g.max_ttft_p95_ms or g.ttft_slo_ms
        max_tpot = g.max_tpot_p95_ms or g.tpot_slo_ms
        problems = []
        errors = sorted({r.error or f"HTTP {r.status}" for r in records if not r.ok})
        if not records:
            problems.append("no request was sent within max_duration_s: latency not measured")
        elif not ok:
            problems.append(f"none of the {len(records)} streams completed ({'; '.join(errors[:2])}): TTFT and TPOT "
                            "not measured")  # fmt: skip
        if "ttft_p95_ms" in metrics and metrics["ttft_p95_ms"] > max_ttft:
            problems.append(f"TTFT p95 {metrics['ttft_p95_ms']:.0f} ms > {max_ttft:g} ms")
        if "tpot_p95_ms" in metrics and metrics["tpot_p95_ms"] > max_tpot:
            problems.append(f"TPOT p95 {metrics['tpot_p95_ms']:.1f} ms > {max_tpot:g} ms")
        if ok and ratio is not None and ratio < g.min_goodput_ratio:
            problems.append(f"goodput {ratio:.0%} of streams met TTFT <= {g.ttft_slo_ms:g} ms and TPOT <= "
                            f"{g.tpot_slo_ms:g} ms (< {g.min_goodput_ratio:.0%})")  # fmt: skip
        ttft_text = f"{metrics['ttft_p95_ms']:.0f} ms" if "ttft_p95_ms" in metrics else "not measured"
        tpot_text = f"{metrics['tpot_p95_ms']:.1f} ms" if "tpot_p95_ms" in metrics else "not measured"
        goodput_text = f"{ratio:.0%}" if ok and ratio is not None else "not measured"
        return self.finding(
            ctx,
            Verdict.FAIL if problems else Verdict.PASS,
            f"stream latency under load ({len(records)} streams, concurrency {p.concurrency}): TTFT p95 "
            f"{ttft_text}, TPOT p95 {tpot_text}, goodput {goodput_text}",
            severity=Severity.MEDIUM if problems else Severity.INFO,
            metrics=metrics,
            gate=f"TTFT p95 <= {max_ttft:g} ms, TPOT p95 <= {max_tpot:g} ms, >= {g.min_goodput_ratio:.0%} of streams "
            f"within TTFT {g.ttft_slo_ms:g} ms and TPOT {g.tpot_slo_ms:g} ms",
            message="; ".join(problems),
            suggestion="profile prefill (TTFT) and decode (TPOT) at this concurrency; batch, add capacity or lower "
            "max_tokens"
            if problems
            else "",
            evidence={
                "errors": errors[:10],
                "concurrency": p.concurrency,
                "max_tokens": p.max_tokens,
                "wall_s": round(wall, 3),
            },
        )

    # -- disconnect --------------------------------------------------------------------------------

    def _disconnect(self, ctx: CheckContext, dep: Deployment, client: _Client) -> Finding:
        p, g = self.params, self.gate
        contents = self._contents(ctx, 1)
        before = client.running()
        if before is None:  # no gauge: the black-box probe
            return self._probe_slots(ctx, dep, client, contents[0])
        max_tokens = p.disconnect_max_tokens
        while True:
            outcome, detail = leave_mid_stream(dep, client.body(contents[0], max_tokens, True), p.request_timeout_s)
            if outcome != "refused" or not _too_long(detail) or max_tokens <= 8:
                break
            max_tokens //= 2
        evidence: dict[str, Any] = {
            "method": "gauge",
            "outcome": outcome,
            "detail": detail,
            "running_before": before,
            "max_tokens": max_tokens,
        }
        gate = (f"after a client leaves mid-stream, vllm:num_requests_running is back to its value before within "
                f"{p.release_timeout_s:g} s and the next request is answered")  # fmt: skip
        if outcome != "left":
            return self.finding(
                ctx, Verdict.WARN, f"disconnect mid-stream: not tested ({detail})", severity=Severity.LOW,
                gate=gate, message=detail, evidence=evidence,
                suggestion="raise disconnect_max_tokens so the stream is still running when the client leaves"
                if outcome == "ended" else "",
            )  # fmt: skip
        released_after: float | None = None
        running: float | None = None
        t0 = time.perf_counter()
        deadline = t0 + p.release_timeout_s
        while True:
            running = client.running()
            if running is not None and running <= before:
                released_after = time.perf_counter() - t0
                break
            if time.perf_counter() >= deadline:
                break
            time.sleep(0.05)
        status, _, err = client.complete(contents[0], 1)
        evidence.update(running_after=running, released_after_s=released_after, next_request_status=status)
        problems = []
        if released_after is None:
            problems.append(
                f"vllm:num_requests_running stayed at {running} (was {before}) {p.release_timeout_s:g} s after the "
                "client left: the server goes on generating for nobody and holds the slot"
            )
        if status != 200:
            problems.append(f"the next request was not answered ({status}: {err[:120]})")
        if problems and g.slot_released:
            verdict, severity = Verdict.FAIL, Severity.HIGH
        elif problems:
            verdict, severity = Verdict.WARN, Severity.LOW  # not gated: reported, not failed
        else:
            verdict, severity = Verdict.PASS, Severity.INFO
        title = ("disconnect mid-stream: the slot was given back"
                 + (f" in {released_after * 1000:.0f} ms" if released_after is not None else "") + " (gauge)"
                 if not problems else "disconnect mid-stream: the slot was not given back")  # fmt: skip
        return self.finding(
            ctx, verdict, title, severity=severity,
            metrics={"released": 1.0 if released_after is not None else 0.0,
                     **_measured_ms(release_ms=released_after), "next_request_ok": 1.0 if status == 200 else 0.0},
            gate=gate, message="; ".join(problems), evidence=evidence,
            suggestion="watch the connection while streaming and abort the request when the client goes "
            "(vLLM aborts on disconnect); stop generating at the next token" if verdict == Verdict.FAIL else "",
        )  # fmt: skip

    def _probe_slots(self, ctx: CheckContext, dep: Deployment, client: _Client, content: Any) -> Finding:
        """No gauge: hold what the server admits at once, leave it all and more, then ask as many again."""
        p, g = self.params, self.gate
        limit = p.capacity + 1 if p.capacity else p.max_probe_streams
        admit_s = min(g.ttft_slo_ms / 1000.0, p.request_timeout_s)
        max_tokens = p.disconnect_max_tokens
        while True:
            probe = probe_slot_release(
                dep, client.body(content, max_tokens, True), client.body(content, p.max_tokens, True),
                limit=limit, admit_s=admit_s, release_s=p.release_timeout_s, answer_s=p.request_timeout_s,
            )  # fmt: skip
            if probe.tested or not _too_long(probe.detail) or max_tokens <= 8:
                break
            max_tokens //= 2
        evidence: dict[str, Any] = {"method": METHOD, "max_tokens": max_tokens, "limit": limit, **probe.evidence()}
        gate = (f"after more clients left mid-stream than the server holds at once, as many new streams are admitted "
                f"with a first token within {admit_s * 1000:g} ms, within {p.release_timeout_s:g} s")  # fmt: skip
        metrics = {"released": 1.0 if probe.released and probe.capacity_found else 0.0,
                   **_measured_ms(release_ms=probe.released_after_s), "capacity": float(probe.capacity),
                   "disconnected": float(probe.disconnected), "admitted_after": float(probe.admitted_after),
                   "answered_after": float(probe.answered_after),
                   "next_request_ok": 1.0 if probe.answered_after else 0.0}  # fmt: skip
        if not probe.tested:
            return self.finding(
                ctx, Verdict.WARN, f"disconnect mid-stream: not tested ({probe.detail})", severity=Severity.LOW,
                gate=gate, message=probe.detail, metrics=metrics, evidence=evidence,
                suggestion="raise disconnect_max_tokens so the stream is still running when the client leaves"
                if "finished" in probe.detail else "",
            )  # fmt: skip
        if not probe.released:
            failed = g.slot_released
            return self.finding(
                ctx, Verdict.FAIL if failed else Verdict.WARN, "disconnect mid-stream: the slot was not given back",
                severity=Severity.HIGH if failed else Severity.LOW, gate=gate, metrics=metrics, evidence=evidence,
                message=f"after {probe.disconnected} streams were left mid-stream (the server held {probe.capacity} "
                f"at once), {probe.admitted_after} of {probe.asked_after} new streams were admitted and "
                f"{probe.answered_after} answered within {p.release_timeout_s:g} s"
                + (f"; {probe.detail}" if probe.detail else "") + " (black-box probe): the server goes on "
                "generating for clients that left and holds their slots",
                suggestion="watch the connection while streaming and abort the request when the client goes "
                "(vLLM aborts on disconnect); stop generating at the next token",
            )  # fmt: skip
        if not probe.capacity_found:
            return self.finding(
                ctx, Verdict.WARN,
                f"disconnect mid-stream: release not shown (black-box probe: the server held all {probe.capacity} "
                "probe streams at once, so leaked slots would not run out)",
                severity=Severity.LOW, gate=gate, metrics=metrics, evidence=evidence,
                message="the server exports no vllm:num_requests_running and holds more streams than the probe "
                "opens",
                suggestion="export vllm:num_requests_running, or set capacity (or raise max_probe_streams) to the "
                "server's concurrent-request limit",
            )  # fmt: skip
        return self.finding(
            ctx, Verdict.PASS,
            f"disconnect mid-stream: the slot was given back (black-box probe: {probe.disconnected} streams left "
            f"mid-stream, more than the {probe.capacity} the server holds at once; {probe.capacity} new streams then "
            "admitted and answered within the TTFT objective)",
            metrics=metrics, gate=gate, evidence=evidence,
        )  # fmt: skip


def _too_long(detail: str) -> bool:
    """A 4xx (not 429) for a long request: the server refusing max_tokens past its context (as vLLM does
    past max_model_len). Ask for fewer tokens, still many more than a probe needs."""
    status = detail.split(" ")
    return len(status) > 1 and status[1].startswith("4") and status[1] != "429"
