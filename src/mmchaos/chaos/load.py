"""A bounded HTTP load driver: open-loop (constant or Poisson arrivals) or closed-loop.

    config = LoadConfig(base_url="http://127.0.0.1:9000", mode="open", rate=50,
                        max_requests=500, max_duration=10, slo_latency_ms=300)
    result = await LoadDriver(config, embeddings_mix(dataset)).run()

Every run is bounded twice: it never sends more than ``max_requests`` requests and starts none
after ``max_duration`` seconds (requests still in flight at the deadline get ``drain_s`` more to
finish, then are cancelled and counted as ``cancelled``). It refuses any target that does not resolve to loopback unless
``allow_remote`` is set. Error kinds: ``http_4xx``, ``http_5xx`` (and ``http_3xx``), ``timeout``,
``connect_error``, ``reset``, ``protocol_error`` (the server closed early or sent broken HTTP,
e.g. a truncated body), ``bad_body`` (a 2xx whose body failed validation), ``client_shed``
(open loop only: the arrival found ``max_in_flight`` requests already waiting) and ``other``.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import io
import json
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mmchaos.errors import ConfigError, DataError
from mmchaos.net import CLIENT_KEEPALIVE_EXPIRY, REMOTE_REFUSED, non_loopback, resolve_async
from mmchaos.targets.openai_forms import ImageForm, embeddings_form, text_body

if TYPE_CHECKING:
    import httpx

    from mmchaos.data.base import Dataset
    from mmchaos.keepalive import WireTrace

__all__ = [
    "ERROR_KINDS",
    "LatencySummary",
    "LoadConfig",
    "LoadDriver",
    "LoadRequest",
    "LoadResult",
    "MixEntry",
    "PayloadMix",
    "RequestRecord",
    "embeddings_mix",
    "ensure_loopback",
    "run_load",
]

ERROR_KINDS = (
    "http_3xx",
    "http_4xx",
    "http_5xx",
    "timeout",
    "connect_error",
    "reset",
    "protocol_error",
    "bad_body",
    "client_shed",
    "other",
)


_CANCEL_FIRST_S = 1.0
"""How long past the end of its drain a request's own timeout falls (the drain's cancel comes first)."""


class LoadConfig(BaseModel):
    """How much load, of what shape, against what; both bounds are required."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    mode: Literal["open", "closed"] = "closed"
    arrival: Literal["constant", "poisson"] = "constant"
    rate: float | None = Field(default=None, gt=0, le=100_000, description="open loop: arrivals per second")
    concurrency: int | None = Field(default=None, ge=1, le=10_000, description="closed loop: requests in flight")
    max_requests: int = Field(ge=1, le=10_000_000)
    max_duration: float = Field(gt=0, le=86_400, description="seconds")
    request_timeout: float = Field(default=10.0, gt=0, description="seconds, per request")
    max_in_flight: int = Field(default=256, ge=1, le=100_000, description="open loop: arrivals beyond are shed")
    slo_latency_ms: float = Field(default=1000.0, gt=0, description="a good request succeeds within this")
    drain_s: float = Field(
        default=0.0,
        ge=0,
        le=86_400,
        description="closed loop: at the deadline, requests in flight get this long to finish before they are "
        "cancelled (an abort cancels them at once)",
    )
    allow_remote: bool = False
    seed: int = 0
    resend_stale: bool = Field(
        default=False,
        description="send a request again (up to 16 times) when the kept-alive connection it went out on had been "
        "closed before any answer (uvicorn closes after a 500): off where injected connection faults are the "
        "experiment",
    )

    @model_validator(mode="after")
    def _shape(self) -> LoadConfig:
        if self.mode == "open" and (self.rate is None or self.concurrency is not None):
            raise ValueError("open loop takes a rate (arrivals per second) and no concurrency")
        if self.mode == "closed" and (self.concurrency is None or self.rate is not None):
            raise ValueError("closed loop takes a concurrency and no rate")
        if urlsplit(self.base_url).scheme not in ("http", "https") or not urlsplit(self.base_url).hostname:
            raise ValueError(f"base_url must be an http(s) URL with a host, not {self.base_url!r}")
        return self

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> LoadConfig:
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}".removeprefix("config: ")
                for e in exc.errors()[:4]
            )
            raise ConfigError(f"load config: {errors}", code="config_invalid_load") from None


@dataclass(frozen=True)
class LoadRequest:
    """One request to send. ``validate`` raises ValueError when a 2xx body is wrong."""

    kind: str
    path: str
    method: str = "POST"
    json_body: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    validate: Callable[[httpx.Response], None] | None = None

    def __post_init__(self) -> None:
        # Absolute URLs would bypass the base URL, and with it the loopback check.
        if not self.path.startswith("/"):
            raise ConfigError(f"request path must start with '/', not {self.path!r}", code="config_invalid_load")


RequestFactory = Callable[[random.Random], LoadRequest]


@dataclass(frozen=True)
class MixEntry:
    factory: RequestFactory
    weight: float = 1.0


class PayloadMix:
    """Weighted request factories; each request draws one from the run's seeded generator."""

    def __init__(self, entries: Sequence[MixEntry | RequestFactory]) -> None:
        self.entries = [e if isinstance(e, MixEntry) else MixEntry(e) for e in entries]
        if not self.entries:
            raise ConfigError("a payload mix needs at least one request factory", code="config_invalid_load")
        if any(not math.isfinite(e.weight) or e.weight < 0 for e in self.entries) or not any(
            e.weight > 0 for e in self.entries
        ):
            raise ConfigError("mix weights must be >= 0 with at least one > 0", code="config_invalid_load")
        self._cum: list[float] = []
        total = 0.0
        for e in self.entries:
            total += e.weight
            self._cum.append(total)

    def pick(self, rng: random.Random) -> LoadRequest:
        x = rng.random() * self._cum[-1]
        for entry, edge in zip(self.entries, self._cum, strict=True):
            if x < edge:
                return entry.factory(rng)
        return self.entries[-1].factory(rng)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request; times in seconds from the start of the run."""

    index: int
    kind: str
    start: float
    latency: float
    status: int | None
    error: str | None
    good: bool

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mean_ms: float | None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencySummary:
        if not seconds:
            return cls(0, None, None, None, None, None)
        ms = sorted(s * 1000.0 for s in seconds)

        def pct(q: float) -> float:
            # Linear interpolation between closest ranks (numpy's default).
            pos = (len(ms) - 1) * q
            lo = math.floor(pos)
            hi = min(lo + 1, len(ms) - 1)
            return round(ms[lo] + (ms[hi] - ms[lo]) * (pos - lo), 3)

        return cls(len(ms), pct(0.5), pct(0.95), pct(0.99), round(ms[-1], 3), round(sum(ms) / len(ms), 3))


@dataclass
class LoadResult:
    """The outcome of a run; ``to_dict`` is JSON-ready (records only on request)."""

    mode: str
    arrival: str | None
    target: str
    max_requests: int
    max_duration: float
    slo_latency_ms: float
    offered_rate: float | None
    concurrency: int | None
    duration_s: float
    sent: int
    completed: int
    ok: int
    good: int
    cancelled: int
    errors: dict[str, int]
    status_counts: dict[str, int]
    latency: LatencySummary
    ok_latency: LatencySummary
    by_kind: dict[str, dict[str, Any]]
    aborted: str | None = None
    records: list[RequestRecord] = field(default_factory=list, repr=False)
    resent: int = 0
    """Requests sent again after their kept-alive connection had been closed (``resend_stale``)."""

    @property
    def attempted(self) -> int:
        """Requests that got an outcome of their own: completed ones plus shed arrivals."""
        return self.completed + self.errors.get("client_shed", 0)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def error_rate(self) -> float:
        return self.error_count / self.attempted if self.attempted else 0.0

    @property
    def success_rate(self) -> float:
        return self.ok / self.attempted if self.attempted else 0.0

    @property
    def slo_attainment(self) -> float:
        """Share of attempted requests that succeeded within the SLO latency."""
        return self.good / self.attempted if self.attempted else 0.0

    @property
    def throughput_rps(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def goodput_rps(self) -> float:
        return self.good / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self, *, include_records: bool = False) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "records"}
        data.update(
            attempted=self.attempted,
            error_rate=round(self.error_rate, 6),
            success_rate=round(self.success_rate, 6),
            slo_attainment=round(self.slo_attainment, 6),
            throughput_rps=round(self.throughput_rps, 3),
            goodput_rps=round(self.goodput_rps, 3),
        )
        if include_records:
            data["records"] = [asdict(r) for r in self.records]
        return data


async def ensure_loopback(url: str, *, allow_remote: bool = False) -> None:
    """Refuse a URL whose host is, or resolves to, anything but loopback (unless allowed)."""
    if allow_remote:
        return
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise ConfigError(f"no host in {url!r}", code="config_invalid_load")
    try:
        addresses = await resolve_async(host, parts.port or 80)
    except OSError as exc:
        raise ConfigError(
            f"cannot resolve {host!r} ({exc}); the load driver targets loopback only unless allow_remote is set",
            code=REMOTE_REFUSED,
        ) from None
    remote = non_loopback(addresses)
    if not addresses or remote:
        raise ConfigError(
            f"refusing to send load to {host} ({', '.join(remote) or 'no address'}): not loopback; "
            "pass allow_remote=True (--allow-remote) to target another machine you own",
            code=REMOTE_REFUSED,
        )


def _is_reset(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionResetError | BrokenPipeError):
            return True
        if isinstance(cur, OSError) and cur.errno in (errno.ECONNRESET, errno.EPIPE):
            return True
        cur = cur.__cause__ or cur.__context__
    return "reset by peer" in str(exc).lower()


STALE_RESENDS = 16
"""Resends of one request whose kept-alive connection had been closed unanswered (``resend_stale``)."""


def classify(exc: BaseException) -> str:
    """The error kind of an exception raised by httpx."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "reset" if _is_reset(exc) else "connect_error"
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return "reset" if _is_reset(exc) else "protocol_error"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "reset" if _is_reset(exc) else "protocol_error"
    if isinstance(exc, httpx.DecodingError):
        return "bad_body"
    return "other"


class LoadDriver:
    """Runs one bounded load experiment; ``abort()`` stops it early (in-flight requests cancelled).

    Pass ``client`` (used as is, not closed) or ``transport`` (an ``httpx.AsyncBaseTransport``,
    e.g. ``httpx.MockTransport`` in tests); otherwise a client is made for the run, with
    ``trust_env=False`` so proxy environment variables cannot redirect the traffic.
    """

    def __init__(
        self,
        config: LoadConfig | Mapping[str, Any],
        mix: PayloadMix | Sequence[MixEntry | RequestFactory] | RequestFactory,
        *,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
    ) -> None:
        self.config = config if isinstance(config, LoadConfig) else LoadConfig.parse(config)
        if isinstance(mix, PayloadMix):
            self.mix = mix
        elif callable(mix):
            self.mix = PayloadMix([mix])
        else:
            self.mix = PayloadMix(mix)
        self._client = client
        self._transport = transport
        self._on_record = on_record
        self._abort_reason: str | None = None
        self._abort_event: asyncio.Event | None = None
        self._t0 = 0.0
        self._deadline = 0.0
        self._request_end = 0.0
        self._records: list[RequestRecord] = []
        self._cancelled = 0
        self._sent = 0
        self._resent = 0

    def abort(self, reason: str = "aborted") -> None:
        """Stop sending; requests in flight are cancelled. Safe to call from ``on_record``."""
        if self._abort_reason is None:
            self._abort_reason = reason
        if self._abort_event is not None:
            self._abort_event.set()

    def run_sync(self) -> LoadResult:
        return asyncio.run(self.run())

    async def run(self) -> LoadResult:
        import httpx

        cfg = self.config
        await ensure_loopback(cfg.base_url, allow_remote=cfg.allow_remote)
        if self._client is not None and str(self._client.base_url):
            await ensure_loopback(str(self._client.base_url), allow_remote=cfg.allow_remote)
        self._abort_event = asyncio.Event()
        if self._abort_reason is not None:
            self._abort_event.set()
        client = self._client
        owned = client is None
        if client is None:
            width = cfg.concurrency if cfg.mode == "closed" else cfg.max_in_flight
            client = httpx.AsyncClient(
                base_url=cfg.base_url,
                transport=self._transport,
                timeout=cfg.request_timeout,
                limits=httpx.Limits(max_connections=width, max_keepalive_connections=width,
                                    keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY),
                trust_env=False,
            )
        try:
            return await self._run(client)
        finally:
            if owned:
                await client.aclose()

    async def _run(self, client: httpx.AsyncClient) -> LoadResult:
        cfg = self.config
        loop = asyncio.get_running_loop()
        abort = self._abort_event
        assert abort is not None
        self._t0 = loop.time()
        self._deadline = self._t0 + cfg.max_duration
        # A request's own timeout is bounded by the run's end. With a drain, that end lies past the
        # drain's, so a request still in flight when the drain runs out is cancelled (unanswered), not
        # timed out in the same instant: one outcome for it however the race falls. (Bounded by the
        # deadline itself, a request in flight there timed out as an error before any drain.)
        self._request_end = self._deadline + (cfg.drain_s + _CANCEL_FIRST_S if cfg.drain_s else 0.0)
        self._records, self._cancelled, self._sent, self._resent = [], 0, 0, 0
        rng = random.Random(f"{cfg.seed}:payload")
        tasks: list[asyncio.Task[None]] = []
        if cfg.mode == "closed":
            assert cfg.concurrency is not None
            counter = iter(range(cfg.max_requests))  # shared: each index is taken by one worker
            for _ in range(min(cfg.concurrency, cfg.max_requests)):
                tasks.append(loop.create_task(self._worker(client, counter, rng, abort)))
        else:
            tasks.append(loop.create_task(self._arrivals(client, rng, abort)))
        abort_wait = loop.create_task(abort.wait())
        try:
            while not abort.is_set() and not all(t.done() for t in tasks):
                remaining = self._deadline - loop.time()
                if remaining <= 0:
                    break
                pending = [t for t in tasks if not t.done()]
                await asyncio.wait([*pending, abort_wait], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            await self._drain(tasks, abort, abort_wait, loop.time() + cfg.drain_s)
        finally:
            live = [t for t in tasks if not t.done()]
            for t in [abort_wait, *live]:
                t.cancel()  # the deadline or an abort: requests in flight are cancelled
            await asyncio.wait([abort_wait, *live], timeout=5.0)
        return self._result(loop.time() - self._t0)

    @staticmethod
    async def _drain(
        tasks: list[asyncio.Task[None]], abort: asyncio.Event, abort_wait: asyncio.Task[Any], until: float
    ) -> None:
        """Let the requests in flight at the deadline finish until ``until`` (the workers start no new
        one past the deadline). Cancelled at the deadline, a phase counted only the requests faster
        than what was left of it: the slowest were never seen, and on a machine that stalled for the
        last moments of a short phase nothing was (a correct service failed a 0.4 s fault phase)."""
        loop = asyncio.get_running_loop()
        while not abort.is_set() and (pending := [t for t in tasks if not t.done()]):
            remaining = until - loop.time()
            if remaining <= 0:
                return
            await asyncio.wait([*pending, abort_wait], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)

    async def _worker(
        self, client: httpx.AsyncClient, counter: Iterator[int], rng: random.Random, abort: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        for index in counter:
            if abort.is_set() or loop.time() >= self._deadline:
                return
            await self._one(client, index, self.mix.pick(rng))

    async def _arrivals(self, client: httpx.AsyncClient, rng: random.Random, abort: asyncio.Event) -> None:
        cfg = self.config
        assert cfg.rate is not None
        loop = asyncio.get_running_loop()
        gaps = random.Random(f"{cfg.seed}:arrivals")
        in_flight: set[asyncio.Task[None]] = set()
        at = self._t0
        try:
            for index in range(cfg.max_requests):
                if index:
                    at += gaps.expovariate(cfg.rate) if cfg.arrival == "poisson" else 1.0 / cfg.rate
                if at >= self._deadline or abort.is_set():
                    break
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if abort.is_set():
                    break
                request = self.mix.pick(rng)
                if len(in_flight) >= cfg.max_in_flight:
                    shed = RequestRecord(index, request.kind, loop.time() - self._t0, 0.0, None, "client_shed", False)
                    self._record(shed)
                    continue
                task = loop.create_task(self._one(client, index, request))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            if in_flight:
                await asyncio.wait(list(in_flight))
        finally:
            for task in list(in_flight):
                task.cancel()
            if in_flight:
                await asyncio.wait(list(in_flight), timeout=5.0)

    async def _one(self, client: httpx.AsyncClient, index: int, req: LoadRequest) -> None:
        import httpx

        from mmchaos.keepalive import WireTrace

        cfg = self.config
        loop = asyncio.get_running_loop()
        start = loop.time()
        timeout = min(cfg.request_timeout, max(0.001, self._request_end - start))
        status: int | None = None
        error: str | None = None
        self._sent += 1
        try:
            # Each stale connection is dropped when it fails, but a poison answered on another one in
            # between makes a new one: the count of them is not bounded by the pool's size, so a
            # request is sent again until it is answered, within STALE_RESENDS and its deadline.
            tries = 1 + (STALE_RESENDS if cfg.resend_stale else 0)
            for attempt in range(tries):
                wire = WireTrace()
                if attempt:
                    timeout = min(cfg.request_timeout, max(0.001, self._request_end - loop.time()))
                try:
                    response = await self._send(client, req, timeout, wire)
                    break
                except httpx.HTTPError as exc:
                    if attempt + 1 == tries or not wire.stale(exc):
                        raise
                    self._resent += 1  # the server had closed that connection after an earlier answer
            status = response.status_code
            if status >= 300:
                error = f"http_{status // 100}xx"
            elif req.validate is not None:
                try:
                    req.validate(response)
                except (ValueError, KeyError, TypeError, IndexError):
                    error = "bad_body"
        except asyncio.CancelledError:
            self._cancelled += 1
            raise
        except Exception as exc:
            error = classify(exc)
        latency = loop.time() - start
        good = error is None and latency * 1000.0 <= cfg.slo_latency_ms
        self._record(RequestRecord(index, req.kind, start - self._t0, latency, status, error, good))

    @staticmethod
    async def _send(client: httpx.AsyncClient, req: LoadRequest, timeout: float, wire: WireTrace) -> httpx.Response:
        return await client.request(
            req.method,
            req.path,
            json=req.json_body if req.content is None else None,
            content=req.content,
            headers=dict(req.headers),
            timeout=timeout,
            extensions={"trace": wire.event},
        )

    def _record(self, record: RequestRecord) -> None:
        self._records.append(record)
        if self._on_record is not None:
            self._on_record(record)

    def _result(self, duration: float) -> LoadResult:
        cfg = self.config
        records = sorted(self._records, key=lambda r: r.index)
        completed = [r for r in records if r.error != "client_shed"]
        errors: dict[str, int] = {}
        statuses: dict[str, int] = {}
        for r in records:
            if r.error is not None:
                errors[r.error] = errors.get(r.error, 0) + 1
            if r.status is not None:
                statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
        by_kind: dict[str, dict[str, Any]] = {}
        for kind in sorted({r.kind for r in records}):
            rs = [r for r in completed if r.kind == kind]
            lat = LatencySummary.of([r.latency for r in rs if r.ok])
            by_kind[kind] = {
                "count": len(rs),
                "ok": sum(r.ok for r in rs),
                "errors": sum(not r.ok for r in rs),
                "p50_ms": lat.p50_ms,
                "p99_ms": lat.p99_ms,
            }
        return LoadResult(
            mode=cfg.mode,
            arrival=cfg.arrival if cfg.mode == "open" else None,
            target=cfg.base_url,
            max_requests=cfg.max_requests,
            max_duration=cfg.max_duration,
            slo_latency_ms=cfg.slo_latency_ms,
            offered_rate=cfg.rate,
            concurrency=cfg.concurrency,
            duration_s=round(duration, 6),
            sent=self._sent,
            completed=len(completed),
            ok=sum(r.ok for r in records),
            good=sum(r.good for r in records),
            cancelled=self._cancelled,
            errors=dict(sorted(errors.items())),
            status_counts=dict(sorted(statuses.items())),
            latency=LatencySummary.of([r.latency for r in completed]),
            ok_latency=LatencySummary.of([r.latency for r in records if r.ok]),
            by_kind=by_kind,
            aborted=self._abort_reason,
            records=records,
            resent=self._resent,
        )


async def run_load(
    config: LoadConfig | Mapping[str, Any],
    mix: PayloadMix | Sequence[MixEntry | RequestFactory] | RequestFactory,
    **kwargs: Any,
) -> LoadResult:
    """``LoadDriver(config, mix, **kwargs).run()``."""
    return await LoadDriver(config, mix, **kwargs).run()


# --- multimodal payloads from a dataset --------------------------------------------------------


def _data_url(image: Any, side: int, fmt: str) -> str:
    from PIL import Image

    img = Image.fromarray(image).convert("RGB")
    img = img.resize((side, side), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    if fmt == "jpeg":
        img.save(buf, format="JPEG", quality=90)
    else:
        img.save(buf, format="PNG")
    return f"data:image/{fmt};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def _embeddings_validator(expected: int) -> Callable[[httpx.Response], None]:
    def validate(response: httpx.Response) -> None:
        body = json.loads(response.content)
        data = body["data"]
        if not isinstance(data, list) or len(data) != expected:
            raise ValueError(f"expected {expected} embeddings, got {len(data) if isinstance(data, list) else data!r}")
        for item in data:
            vec = item["embedding"]
            if not isinstance(vec, list) or not vec or not all(isinstance(v, int | float) for v in vec):
                raise ValueError("embedding is not a non-empty list of numbers")
            if not all(math.isfinite(v) for v in vec):
                raise ValueError("embedding has NaN or Inf")

    return validate


def embeddings_mix(
    dataset: Dataset,
    *,
    model: str = "default",
    path: str = "/v1/embeddings",
    samples: int = 8,
    small_side: int = 64,
    large_side: int = 1024,
    long_text_words: int = 600,
    weights: Mapping[str, float] | None = None,
    image_form: ImageForm = "messages",
) -> PayloadMix:
    """OpenAI-style ``/v1/embeddings`` requests from a dataset: small and large images, short and long texts.

    Texts go as ``{"model", "input": text}``; images one per request as ``data:`` URLs in
    ``image_form`` (:mod:`mmchaos.targets.openai_forms`: vLLM's ``messages`` by default, ``input``
    content parts, or data-URL strings in ``input``; pass the form the endpoint takes, as the
    ``openai:`` target found it in ``image_input``): small ones as ``small_side`` px PNGs, large
    ones as ``large_side`` px JPEGs. Bodies are encoded once, up front, from the first ``samples``
    samples, so the driver spends its time sending, not encoding. Kinds without data in the
    dataset are left out; ``weights`` (by kind) default to 1 each.
    """
    try:
        form = embeddings_form(image_form)
    except ValueError as exc:
        raise ConfigError(str(exc), code="config_invalid_load") from None
    chosen = list(dataset)[:samples]
    if not chosen:
        raise DataError(f"dataset {dataset.name} is empty", code="data_empty")
    bodies: dict[str, list[bytes]] = {}
    images = [s for s in chosen if s.has_image]
    if images:
        for kind, side, fmt in (("image_small", small_side, "png"), ("image_large", large_side, "jpeg")):
            bodies[kind] = [
                json.dumps(form.body(model, [_data_url(s.load_image(), side, fmt)])).encode() for s in images
            ]
    texts = [t for s in chosen for t in [s.caption or s.text or s.label] if t]
    if texts:
        bodies["text_short"] = [json.dumps(text_body(model, t)).encode() for t in texts]
        long_texts = []
        for t in texts:
            words = t.split() or ["text"]
            long_texts.append(" ".join(words[i % len(words)] for i in range(long_text_words)))
        bodies["text_long"] = [json.dumps(text_body(model, t)).encode() for t in long_texts]
    if not bodies:
        raise DataError(f"dataset {dataset.name} has neither images nor texts", code="data_empty")
    weights = dict(weights or {})
    unknown = set(weights) - {"image_small", "image_large", "text_short", "text_long"}
    if unknown:
        raise ConfigError(f"unknown payload kinds in weights: {', '.join(sorted(unknown))}", code="config_invalid_load")
    validator = _embeddings_validator(1)
    headers = {"Content-Type": "application/json"}

    def factory(kind: str, options: list[bytes]) -> RequestFactory:
        def make(rng: random.Random) -> LoadRequest:
            return LoadRequest(
                kind, path, "POST", content=options[rng.randrange(len(options))], headers=headers, validate=validator
            )

        return make

    return PayloadMix([MixEntry(factory(k, v), weights.get(k, 1.0)) for k, v in bodies.items()])
