"""Step 4: the text context limit of every stage, and texts at it: max-1, max, max+1, 2x max tokens.

First the stages as shipped: the tokenizer's limit, the processor's, the model's usable positions
(a target that exposes ``text_limits()``). They must agree: a tokenizer that truncates before the
model's limit drops words in every deployment that loads it; one that lets through more tokens
than the model has positions crashes it. Both fail, naming both numbers.

Then behaviour, at the model's limit: for each length, two texts that differ only in their last
word are embedded alone. Within the limit the last word must change the output; past it the target
may reject the text (a typed error), warn and truncate, or truncate silently. Silent truncation
exactly at the model's own limit is what every CLIP pipeline does: a warning, not a failure. A
target whose output stops changing *before* its limit truncates early (a failure). After
truncation the pooled position must still be the end-of-text token: the embedding of an over-long
text must equal that of its own truncation, and, when the target shows its token ids, the last
kept token must be EOS.

Token counts are measured by calling the same tokenizer with ``truncation=False`` per call; the
shipped tokenizer's settings are never changed.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.context_probe import LimitProbe, probe_limit
from mmchaos.errors import MMChaosError
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap

__all__ = ["ContextBoundary", "limit_of", "stage_limits"]

_OVERLONG_CODE = "text_exceeds_model_positions"
"""The code a target raises where its tokenizer let through more tokens than the model has."""

_FALLBACK_WORDS = ("a photo of the red circle on blue square at top left with green cross " * 2).split()[:15]


def limit_of(target: Target) -> int | None:
    """The target's text context limit in tokens (specials included), if it says."""
    limit = getattr(target, "max_text_tokens", None)
    if isinstance(limit, int) and limit > 2:
        return limit
    tok = getattr(target, "tokenizer", None)
    limit = getattr(tok, "model_max_length", None)
    if isinstance(limit, int) and 2 < limit < 1_000_000:
        return limit
    return None


_SOURCES = {
    "params": "given as params.max_tokens",
    "stages": "the model's positions, from the target's stage limits",
    "target": "stated by the target (its max_text_tokens or its tokenizer's model_max_length)",
    "metadata": "stated by the endpoint's /v1/models metadata",
    "probed": "probed: the largest length whose last word still changes the output",
    "unknown": "neither stated nor found by probing",
}
"""Where a context limit came from (``evidence["limit_source"]``)."""


def _declared_limit(target: Target, given: int | None, stages: dict[str, int | None] | None) -> tuple[int | None, str]:
    """The limit the run knows without probing, and where it came from (a key of ``_SOURCES``)."""
    if given:
        return given, "params"
    if stages and stages.get("model"):
        return stages["model"], "stages"
    limit = limit_of(target)
    if limit is None:
        return None, "unknown"
    return limit, str(getattr(target, "limit_source", "target"))


def stage_limits(target: Target) -> dict[str, int | None] | None:
    """The text limit of each stage (tokenizer, processor, model), when the target says."""
    fn = getattr(target, "text_limits", None)
    if not callable(fn):
        return None
    stages = fn()
    if not isinstance(stages, dict):
        return None
    return {str(k): (int(v) if isinstance(v, int) else None) for k, v in stages.items()}


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}"[:300])


@dataclass
class _Call:
    output: Any = None
    error: str = ""
    typed: bool = False
    code: str = ""
    warnings: list[str] = field(default_factory=list)


def _call(target: Target, text: str) -> _Call:
    handler = _Capture()
    loggers = [logging.getLogger(), logging.getLogger("transformers")]
    for lg in loggers:
        lg.addHandler(handler)
    out = _Call()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out.output = np.asarray(target.embed_texts([text]), dtype=np.float64)[0]
            except Exception as exc:
                out.error = f"{type(exc).__name__}: {exc}"[:500]
                out.typed = isinstance(exc, MMChaosError)
                out.code = str(getattr(exc, "code", ""))
        out.warnings = [str(w.message)[:300] for w in caught] + handler.records
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    return out


def _distance(a: Any, b: Any) -> float:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    denom = float(np.linalg.norm(x) * np.linalg.norm(y))
    if denom == 0 or not np.isfinite(denom):
        return 0.0 if np.array_equal(x, y) else 1.0
    return float(1.0 - x @ y / denom)


class _Texts:
    """Texts of an exact token count, each a prefix of one long word sequence."""

    def __init__(self, target: Target, words: list[str]) -> None:
        self.tok = getattr(target, "tokenizer", None)
        self.exact = self.tok is not None and callable(self.tok)
        if self.exact:
            try:
                self._content_tokens("a")
            except TypeError:  # not a transformers tokenizer: count words instead
                self.exact = False
        singles = self._singles(words)
        if len(singles) < 2:
            singles = self._singles(list("abcdefghijklmnop"))
        if len(singles) < 2:
            raise ValueError("the tokenizer has no two single-token words (of distinct ids) to build texts from")
        self.words = singles
        self.specials = self.count("") if self.exact else 2

    def _singles(self, words: list[str]) -> list[str]:
        """Words that are one token each, of distinct ids, none the unknown token: swapping the
        last word must change the ids, or a small vocabulary would look like truncation."""
        if not self.exact:
            return list(dict.fromkeys(words))
        assert self.tok is not None
        unk = getattr(self.tok, "unk_token_id", None)
        by_id: dict[int, str] = {}
        for w in dict.fromkeys(words):
            ids = self.tok(w, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
            if len(ids) == 1 and ids[0] != unk:
                by_id.setdefault(int(ids[0]), w)
        return list(by_id.values())

    def _content_tokens(self, text: str) -> int:
        if not self.exact:
            return len(text.split())
        assert self.tok is not None
        return len(self.tok(text, add_special_tokens=False, truncation=False, verbose=False)["input_ids"])

    def count(self, text: str) -> int:
        if not self.exact:
            return len(text.split()) + 2
        assert self.tok is not None
        return len(self.tok(text, truncation=False, verbose=False)["input_ids"])

    def text(self, n_tokens: int) -> str:
        k = max(1, n_tokens - self.specials)
        return " ".join(self.words[i % len(self.words)] for i in range(k))

    def variant(self, text: str) -> str:
        """The same text with another last word (same token count)."""
        head, _, last = text.rpartition(" ")
        other = next(w for w in self.words if w != last)
        return f"{head} {other}".strip()


class ContextBoundaryParams(Params):
    max_tokens: int | None = Field(default=None, ge=3, description="override the limit the target declares")
    probe_requests: int = Field(
        default=12, ge=2, le=64, description="requests the limit probe may send when the target states no limit"
    )
    probe_max_tokens: int = Field(
        default=16384, ge=16, le=1_000_000, description="the longest text the limit probe sends (tokens)"
    )


class ContextBoundaryGate(Gate):
    allow_silent_truncation: bool = Field(
        default=False, description="pass texts past the limit that are truncated without an error or a warning"
    )
    min_change: float = Field(
        default=1e-10,
        gt=0.0,
        description="1 - cosine above which two outputs differ (a truncated pair is bit-identical; a weak "
        "or untrained model still moves by 1e-8)",
    )


class ContextBoundary(Check[ContextBoundaryParams, ContextBoundaryGate]):
    """Texts of max-1, max, max+1, 2x max tokens: silent or early truncation, EOS pooling after it."""

    name = "context_boundary"
    step = Step.ENGINE
    requires = (frozenset({Capability.EMBED_TEXT}),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        g = self.gate
        inner = unwrap(ctx.target)
        stages = stage_limits(inner)
        if stages is not None:
            yield self._stages(ctx, stages)
        limit, source = _declared_limit(inner, p.max_tokens, stages)
        words = [w for s in ctx.dataset.head(64) for w in (s.caption or s.text or "").split()] + _FALLBACK_WORDS
        try:
            texts = _Texts(inner, words)
        except ValueError as exc:
            yield self.finding(
                ctx,
                Verdict.SKIPPED,
                f"texts of exact token counts cannot be built: {exc}",
                message="every word of the data and the fallback list is several tokens or the unknown token",
                evidence={"part": "within", "stages": stages, "limit_source": source},
            )
            return
        probe: dict[str, Any] | None = None
        if limit is None:
            found = self._probe(ctx, texts)
            probe = found.to_dict()
            if found.limit is None:
                yield self._unknown_limit(ctx, found, texts)
                return
            limit, source = found.limit, "probed"
        rows: dict[int, dict[str, Any]] = {}
        for n in (limit - 1, limit, limit + 1, 2 * limit):
            a = texts.text(n)
            b = texts.variant(a)
            ca, cb = _call(ctx.target, a), _call(ctx.target, b)
            row: dict[str, Any] = {"tokens": texts.count(a), "text": a, "variant_last_word": b.rsplit(" ", 1)[-1]}
            if ca.error or cb.error:
                first = ca if ca.error else cb
                row.update(outcome="error", error=first.error, typed=first.typed, code=first.code)
            else:
                d = _distance(ca.output, cb.output)
                row.update(outcome="changes" if d > g.min_change else "ignored", distance=d)
            row["warnings"] = ca.warnings + cb.warnings
            rows[n] = row
        evidence: dict[str, Any] = {
            "limit": limit,
            "limit_source": source,
            "limit_probe": probe,
            "stages": stages,
            "exact_token_counts": texts.exact,
            "token_counts": "the same tokenizer called with truncation=False (a per-call setting; the shipped "
            "tokenizer is unchanged)",
            "lengths": {str(n): {k: v for k, v in r.items() if k != "text"} for n, r in rows.items()},
            "seed": ctx.seed,
        }
        artifacts = [
            Artifact(f"{ctx.check_id}-texts.txt", "\n".join(r["text"] for r in rows.values()).encode(), "text/plain")
        ]
        evidence["input_artifact"] = artifacts[0].name
        within = self._within(ctx, limit, rows, texts, g, {**evidence, "part": "within"}, artifacts)
        yield within
        yield self._beyond(ctx, limit, rows, g, {**evidence, "part": "beyond"}, within.verdict == Verdict.PASS, source)
        eos = self._eos(ctx, inner, limit, rows, texts, g, source)
        if eos is not None:
            yield eos

    def _probe(self, ctx: CheckContext, texts: _Texts) -> LimitProbe:
        """The largest length whose last word changes the output, within the request budget (each
        probe is one request with the text and its variant)."""
        g = self.gate

        def fits(n: int) -> tuple[bool, str]:
            a = texts.text(n)
            try:
                out = np.asarray(ctx.target.embed_texts([a, texts.variant(a)]), dtype=np.float64)
            except Exception as exc:  # refused (typed) or broken: either way the text was not read in full
                return False, f"error: {type(exc).__name__}: {exc}"[:300]
            d = _distance(out[0], out[1])
            return d > g.min_change, ("changes" if d > g.min_change else "ignored") + f" (1 - cos = {d:.3g})"

        p = self.params
        return probe_limit(fits, floor=texts.specials + 1, ceiling=p.probe_max_tokens, max_requests=p.probe_requests)

    def _unknown_limit(self, ctx: CheckContext, found: LimitProbe, texts: _Texts) -> Finding:
        """No limit stated and none found: what the probe saw, as a finding that does not pass quietly."""
        p = self.params
        evidence = {"part": "within", "limit": None, "limit_source": "unknown", "limit_probe": found.to_dict(),
                    "exact_token_counts": texts.exact}  # fmt: skip
        if found.outcome == "no_limit":
            return self.finding(
                ctx, Verdict.PASS,
                f"no context limit found: texts of up to {found.fits} tokens are read in full (probed in "
                f"{found.requests} requests; the target states no limit)",
                metrics={"read_in_full_tokens": float(found.fits or 0), "probe_requests": float(found.requests)},
                gate="within the limit every token changes the output", evidence=evidence,
            )  # fmt: skip
        if found.outcome == "never_fits":
            title = (
                f"the context limit is unknown: not even a {found.cut}-token text's last word changes the output "
                "(the target states no limit)"
            )
        else:
            where = (
                f"between {found.fits} and {found.cut} tokens when its {found.requests} probe requests ran out"
                if found.cut is not None
                else f"texts of {found.fits} tokens are read in full, and its {found.requests} probe requests ran "
                "out before a longer one was cut"
            )
            title = (
                f"the context limit is unknown: {where} (the target states no limit); texts at the boundary went "
                "untested"
            )
        return self.finding(
            ctx, Verdict.WARN, title, severity=Severity.LOW,
            metrics={"probe_requests": float(found.requests)},
            gate="a known context limit (stated by the target, or found by probing)",
            message="behind a gateway that strips /v1/models metadata the limit must be probed; this probe did "
            "not find it (gates only under --strict)",
            suggestion=f"give params.max_tokens, or raise params.probe_requests (now {p.probe_requests})",
            evidence=evidence,
        )  # fmt: skip

    def _stages(self, ctx: CheckContext, stages: dict[str, int | None]) -> Finding:
        """Do the tokenizer's, the processor's and the model's limits agree?"""
        model = stages.get("model")
        name = "processor" if stages.get("processor") is not None else "tokenizer"
        pipeline = stages.get(name)
        shown = ", ".join(f"{k} {'no limit' if v is None else v}" for k, v in stages.items())
        evidence: dict[str, Any] = {"part": "stages", "stages": stages, "effective": {"pipeline": pipeline}}
        metrics = {f"{k}_limit": float(v) for k, v in stages.items() if v is not None}
        gate = "the tokenizer/processor limit equals the model's usable positions"
        if model is None:
            return self.finding(
                ctx, Verdict.PASS, f"stage limits: {shown} (the model declares no position limit)",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        if pipeline is not None and pipeline == model:
            return self.finding(
                ctx, Verdict.PASS, f"the stages agree at {model} tokens ({shown})",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
        if pipeline is not None and pipeline < model:
            title = (
                f"early truncation: the {name} truncates at {pipeline} tokens, the model has {model} positions "
                f"(every token after the {pipeline}th is dropped by a deployment that loads this {name})"
            )
            suggestion = f"set the {name}'s max length (model_max_length in tokenizer_config.json) to {model}"
        else:
            lets = f"lets through {pipeline} tokens" if pipeline is not None else "sets no limit"
            title = f"the {name} {lets}, the model has {model} positions: longer texts reach the model and crash it"
            suggestion = (
                f"set model_max_length to {model} in tokenizer_config.json and truncate (or reject) longer texts"
            )
        return self.finding(
            ctx, Verdict.FAIL, title, severity=Severity.HIGH, metrics=metrics, gate=gate,
            message=f"stage limits: {shown}", suggestion=suggestion, evidence=evidence,
        )  # fmt: skip

    def _within(
        self,
        ctx: CheckContext,
        limit: int,
        rows: dict[int, dict[str, Any]],
        texts: _Texts,
        g: ContextBoundaryGate,
        evidence: dict[str, Any],
        artifacts: list[Artifact],
    ) -> Finding:
        bad = [n for n in (limit - 1, limit) if rows[n]["outcome"] != "changes"]
        if not bad:
            return self.finding(
                ctx,
                Verdict.PASS,
                f"texts of {limit - 1} and {limit} tokens: the last token still counts",
                metrics={"limit": float(limit)},
                gate="within the limit every token changes the output",
                evidence=evidence,
            )
        n = bad[0]
        metrics = {"limit": float(limit)}
        if rows[n]["outcome"] == "error":
            title = f"a text of {n} tokens (limit {limit}) is refused: {rows[n]['error']}"
            message = f"the {n}-token text {rows[n]['text'][-60:]!r} is refused within the limit"
            found: dict[str, Any] = {"effective_limit": None, "effective_limit_reason": "refused within the limit"}
        else:
            effective = self._effective_limit(ctx.target, texts, limit, g)
            title = (
                f"silently truncates early: output stops changing after {effective} tokens, "
                f"{limit - effective} before the model's limit of {limit}"
            )
            message = f"the last word of the {n}-token text {rows[n]['text'][-60:]!r} does not change the output"
            metrics["effective_limit"] = float(effective)
            found = {"effective_limit": effective}
        return self.finding(
            ctx,
            Verdict.FAIL,
            title,
            severity=Severity.HIGH,
            metrics=metrics,
            gate="within the limit every token changes the output",
            message=message,
            suggestion="make the serving tokenizer's max_length equal the model's max_position_embeddings",
            evidence={**evidence, **found},
            artifacts=artifacts,
        )

    @staticmethod
    def _effective_limit(target: Target, texts: _Texts, limit: int, g: ContextBoundaryGate) -> int:
        """The largest token count whose last token still changes the output (binary search)."""
        lo, hi = texts.specials, limit  # lo: known to change (or the floor); hi: known not to
        while hi - lo > 1:
            mid = (lo + hi) // 2
            a = texts.text(mid)
            ca, cb = _call(target, a), _call(target, texts.variant(a))
            changes = not (ca.error or cb.error) and _distance(ca.output, cb.output) > g.min_change
            lo, hi = (mid, hi) if changes else (lo, mid)
        return lo

    def _beyond(
        self,
        ctx: CheckContext,
        limit: int,
        rows: dict[int, dict[str, Any]],
        g: ContextBoundaryGate,
        evidence: dict[str, Any],
        within_ok: bool,
        source: str = "target",
    ) -> Finding:
        outcomes = {n: rows[n] for n in (limit + 1, 2 * limit)}
        gate = "past the limit: a typed error, or truncation with a warning" + (
            " (silent truncation allowed)" if g.allow_silent_truncation else ""
        )
        crashed = {
            n: r
            for n, r in outcomes.items()
            if r["outcome"] == "error" and (not r["typed"] or r.get("code") == _OVERLONG_CODE)
        }
        if crashed:
            n, r = next(iter(crashed.items()))
            how = "crashes the model as shipped" if r.get("code") == _OVERLONG_CODE else "raises an untyped error"
            return self.finding(
                ctx,
                Verdict.FAIL,
                f"a text of {n} tokens (limit {limit}) {how}: {r['error'][:160]}",
                severity=Severity.HIGH,
                metrics={"limit": float(limit)},
                gate=gate,
                suggestion="truncate explicitly, or reject over-long texts with a typed error before the model",
                evidence=evidence,
            )
        silent = [n for n, r in outcomes.items() if r["outcome"] == "ignored" and not r["warnings"]]
        if silent and not g.allow_silent_truncation and within_ok:
            probed = source == "probed"
            at = f"the endpoint's probed limit of {limit}" if probed else f"the model's own limit of {limit}"
            why = (
                "the endpoint states no limit, so it was probed (the largest length whose last word changes the "
                "output): words past it do not change the output and the caller is not told"
                if probed
                else "standard CLIP-pipeline behaviour: words past the limit do not change the output and the "
                "caller is not told"
            )
            return self.finding(
                ctx,
                Verdict.WARN,
                f"texts of {', '.join(map(str, silent))} tokens are truncated at {at} tokens, with no error and "
                "no warning",
                severity=Severity.LOW,
                metrics={"limit": float(limit), "silently_truncated_lengths": float(len(silent))},
                gate=gate,
                message=why + " (gates only under --strict)",
                suggestion="reject texts over the limit with a typed error (Preflight max_text_tokens), or return/"
                "log a truncation flag; chunk long texts if they matter",
                evidence=evidence,
            )
        if silent and not g.allow_silent_truncation:
            return self.finding(
                ctx,
                Verdict.FAIL,
                f"silent truncation: texts of {', '.join(map(str, silent))} tokens (limit {limit}) are truncated "
                "with no error and no warning",
                severity=Severity.MEDIUM,
                metrics={"limit": float(limit), "silently_truncated_lengths": float(len(silent))},
                gate=gate,
                message="words past the limit do not change the output and the caller is not told",
                suggestion="reject texts over the limit with a typed error (Preflight max_text_tokens), or return/"
                "log a truncation flag; chunk long texts if they matter",
                evidence=evidence,
            )

        def describe(r: dict[str, Any]) -> str:
            if r["outcome"] == "error":
                return "rejected with a typed error"
            if r["outcome"] == "changes":
                return "read in full"
            return "truncated with a warning" if r["warnings"] else "silently truncated (allowed by the gate)"

        described = {n: describe(r) for n, r in outcomes.items()}
        return self.finding(
            ctx,
            Verdict.PASS,
            "past the limit: " + ", ".join(f"{n} tokens {h}" for n, h in described.items()),
            metrics={"limit": float(limit)},
            gate=gate,
            evidence=evidence,
        )

    def _eos(
        self,
        ctx: CheckContext,
        inner: Target,
        limit: int,
        rows: dict[int, dict[str, Any]],
        texts: _Texts,
        g: ContextBoundaryGate,
        source: str = "target",
    ) -> Finding | None:
        long_row = rows[2 * limit]
        if long_row["outcome"] == "error":
            return None  # rejected, nothing was truncated
        long_text = long_row["text"]
        cut_text = texts.text(limit)
        cl, cc = _call(ctx.target, long_text), _call(ctx.target, cut_text)
        if cl.error or cc.error:
            return None
        distance = _distance(cl.output, cc.output)
        evidence: dict[str, Any] = {
            "part": "eos",
            "limit": limit,
            "limit_source": source,
            "long_tokens": texts.count(long_text),
            "distance": distance,
        }
        detail = ""
        tokenize = getattr(inner, "tokenize", None)
        tok = getattr(inner, "tokenizer", None)
        eos_id = getattr(tok, "eos_token_id", None)
        if callable(tokenize) and eos_id is not None:
            enc = tokenize([long_text])
            ids = np.asarray(enc["input_ids"])[0]
            mask = np.asarray(enc.get("attention_mask", np.ones_like(ids)))[0]
            kept = ids[mask.astype(bool)]
            last = int(kept[-1]) if len(kept) else -1
            evidence.update(kept_tokens=len(kept), last_token_id=last, eos_token_id=int(eos_id))
            if last != int(eos_id):
                convert = getattr(tok, "convert_ids_to_tokens", None)
                name = convert(last) if callable(convert) else str(last)
                detail = f"the last kept token is {name!r} (id {last}), not EOS (id {eos_id})"
        if distance <= g.min_change and not detail:
            return self.finding(
                ctx,
                Verdict.PASS,
                f"after truncation the output equals the truncated text's (EOS kept at position {limit - 1})",
                metrics={"distance": distance},
                gate="an over-long text embeds exactly like its own truncation",
                evidence=evidence,
            )
        title = "after truncation the pooled position is wrong: " + (
            detail or f"a {2 * limit}-token text does not embed like its truncation (1 - cos = {distance:.3g})"
        )
        return self.finding(
            ctx,
            Verdict.FAIL,
            title,
            severity=Severity.HIGH,
            metrics={"distance": distance},
            gate="an over-long text embeds exactly like its own truncation",
            message=f"long text: {long_text[:80]}...",
            suggestion="truncate inside the tokenizer (truncation=True, max_length) so EOS is re-appended; never slice "
            "token ids after EOS was added",
            evidence=evidence,
        )
