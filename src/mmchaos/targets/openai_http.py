"""``openai:<base-url>``: a live OpenAI-compatible endpoint (vLLM, ``mmchaos serve``, ...) as a target.

Embeddings go to ``POST {base}/embeddings``: texts as ``input`` strings; images as ``data:`` URLs in
one of four forms (``image_input``): ``"messages"``, one per request in vLLM's chat-embeddings form
(``messages`` with one ``image_url`` part); ``"input"``, batched as ``input`` items
``{"type": "image_url", "image_url": {"url": ...}}`` (``mmchaos serve``); ``"data_url"``, batched as
``input`` strings that are data URLs (LiteLLM); ``"modality"``, the same with ``"modality": "image"``
in the body (infinity, which embeds a bare data-URL string as text). Without metadata from the
server, :meth:`OpenAITarget.connect` probes each form and keeps the first that embeds pixels, not
bytes: the same picture in two PNG encodings must give the same vector and a different picture a
different one, so a text-only server that embeds the data URL as a string is not taken for an image
model. Each form's bodies are built by :mod:`.openai_forms`, which the serving experiments use too,
so their traffic speaks the form found here. What the probe tried is in
``describe()["endpoint"]["probe"]``; a modality the endpoint half supports but that could not be
tested is in :meth:`OpenAITarget.untested_modalities`, which the
``modality_coverage`` check turns into a warning.

Generation goes to ``POST {base}/chat/completions`` with ``image_url`` parts (data URLs), ``n``,
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``user``, ``stop`` and ``logprobs``; ``stream: true``
is read as server-sent events. Reading text uses the same endpoint, one image per request; the
reply is the transcription.

Arrays are sent as lossless PNG, encoded bytes (``embed_encoded_images``) exactly as given, so the
server's own decoder is what the contract check exercises. Requests go only to loopback addresses
unless ``allow_remote`` (checked by resolving the host; for ``http`` the resolved address is then
used, so a later DNS answer cannot move the traffic elsewhere). 429 and 503 answers are retried with
jittered exponential backoff that honours Retry-After; a request that went out on a kept-alive
connection the server had already closed (uvicorn does after a 500) is sent again on another one
(counted in ``reconnects``); nothing else is retried.

How failures surface, mirroring an in-process target: a 4xx answer is the server refusing the
input, a typed :class:`~mmchaos.errors.TargetCallError` carrying the server's stable code; a 5xx,
a timeout, a reset connection or an unreadable body is :class:`EndpointError`, deliberately outside
the mmchaos error tree, as an exception escaping an in-process model would be (the contract check
counts it as a crash, not as a clean rejection).

The API key comes from an environment variable (``OPENAI_API_KEY`` unless ``api_key_env`` names
another); it lives only in the HTTP client's headers and is never in reprs, logs, reports or the
fingerprint.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from pydantic import Field

from mmchaos.errors import CapabilityError, TargetCallError, TargetLoadError
from mmchaos.net import CLIENT_KEEPALIVE_EXPIRY, REMOTE_REFUSED, non_loopback, resolve
from mmchaos.targets.base import Capability, Fingerprint, FloatArray, ImageArray, Target
from mmchaos.targets.generation import (
    GenerationParams,
    GenerationResult,
    Message,
    as_messages,
)
from mmchaos.targets.openai_forms import (
    IMAGE_FORMS,
    ImageForm,
    chat_body,
    chat_image_content,
    embeddings_form,
    text_body,
)
from mmchaos.targets.openai_wire import (
    EndpointError,
    chat_content,
    choices_of,
    completion_of,
    data_url,
    parse_retry_after,
    png_bytes,
    sse_deltas,
)
from mmchaos.targets.options import SchemeOptions, takes_options

__all__ = ["EndpointError", "OpenAIOptions", "OpenAITarget", "check_endpoint", "load_openai", "parse_retry_after"]

log = logging.getLogger(__name__)
_LOGPROB_FIELDS = frozenset({"logprobs", "top_logprobs"})
"""What a server that refuses logprobs is asked again without."""

HTTP_CAPABILITIES = frozenset(
    {Capability.EMBED_IMAGE, Capability.EMBED_TEXT, Capability.READ_TEXT, Capability.GENERATE}
)
ImageInput = ImageForm
"""The image forms of ``/embeddings`` (:mod:`.openai_forms` builds their bodies)."""
_RETRY_STATUSES = frozenset({429, 503})
Resolver = Callable[..., list[tuple[Any, ...]]]


def check_endpoint(
    base_url: str, *, allow_remote: bool = False, resolver: Resolver = socket.getaddrinfo
) -> tuple[str, str | None]:
    """Validate ``base_url``; returns (URL to connect to, Host header or None).

    Unless ``allow_remote``, every address the host resolves to must be loopback; for ``http`` the
    URL is pinned to the resolved address (the Host header keeps the name).
    """
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetLoadError(
            f"an openai target needs an http(s) base URL like openai:http://127.0.0.1:8000/v1, got {base_url!r}"
        )
    if parts.username or parts.password:
        raise TargetLoadError("put the API key in OPENAI_API_KEY, not in the URL (URLs end up in reports)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise TargetLoadError(f"bad port in {base_url!r}: {exc}") from exc
    url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), parts.query, ""))
    if allow_remote:
        return url, None
    host = parts.hostname
    try:
        addresses = resolve(host, port, resolver)
    except OSError as exc:
        raise TargetLoadError(f"cannot resolve {host!r}: {exc}") from exc
    remote = non_loopback(addresses)
    if not addresses or remote:
        what = host if addresses == [host] else f"{host} resolves to {', '.join(remote or ['nothing'])}, which is"
        raise TargetLoadError(
            f"{what} not a loopback address; mmchaos sends requests only to this machine unless you pass "
            "--allow-remote (allow_remote=True)",
            code=REMOTE_REFUSED,
        )
    try:
        ipaddress.ip_address(host)
        return url, None  # already an address
    except ValueError:
        pass
    if parts.scheme != "http":
        return url, None  # TLS needs the name for SNI and the certificate
    pinned = addresses[0]
    netloc = f"[{pinned}]:{port}" if ":" in pinned else f"{pinned}:{port}"
    return urlunsplit(("http", netloc, parts.path.rstrip("/"), parts.query, "")), parts.netloc


def _probe_images() -> tuple[ImageArray, ImageArray]:
    """Two clearly different small pictures (halves of red and blue; a green-yellow ramp)."""
    a = np.zeros((32, 32, 3), np.uint8)
    a[:, :16, 0] = 220
    a[:, 16:, 2] = 220
    b = np.zeros((32, 32, 3), np.uint8)
    b[..., 1] = 200
    b[..., 0] = np.linspace(0, 255, 32, dtype=np.uint8)[None, :]
    return a, b


def _same_vector(x: FloatArray, y: FloatArray) -> bool:
    """Cosine >= 0.9999: equal up to the noise of a server's batching."""
    if x.shape != y.shape:
        return False
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return nx == ny
    return float(np.dot(x.ravel(), y.ravel())) / (nx * ny) >= 0.9999


class OpenAITarget(Target):
    """A target behind an OpenAI-compatible HTTP API; build it with :meth:`connect`."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        capabilities: Iterable[Capability | str],
        metadata: Mapping[str, Any] | None = None,
        image_input: ImageInput = "messages",
        max_items: int = 64,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff_base: float = 0.1,
        backoff_max: float = 5.0,
        max_retry_after: float = 30.0,
        max_concurrency: int = 4,
        encoding_format: Literal["float", "base64"] = "base64",
        allow_remote: bool = False,
        transport: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
    ) -> None:
        from mmchaos._lazy import require

        httpx = require("httpx")
        if max_concurrency < 1 or max_items < 1 or max_retries < 0 or timeout <= 0:
            raise TargetLoadError("max_concurrency, max_items and timeout must be positive, max_retries >= 0")
        url, host_header = check_endpoint(base_url, allow_remote=allow_remote)
        self.base_url = urlunsplit(urlsplit(base_url.strip())._replace(fragment="")).rstrip("/")
        self.uri = f"openai:{self.base_url}"
        self.model = model
        self.capabilities = frozenset(Capability(c) for c in capabilities) & HTTP_CAPABILITIES
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.image_input: ImageInput = image_input
        self.image_forms: tuple[ImageInput, ...] = IMAGE_FORMS
        """The image forms the probe tries (one, when the user declared it)."""
        self.probe: dict[str, Any] = {"source": "declared"}
        """What discovery tried and found (describe()'s evidence)."""
        self.gaps: dict[str, str] = {}
        """Modalities the endpoint handles in part that could not be tested, with the reason."""
        self.max_text_tokens: int | None = None
        """The text context limit the endpoint states (the ``mmchaos`` metadata's ``max_text_tokens``, or
        the card's ``max_model_len``, vLLM's); None behind a gateway that strips both."""
        self.limit_source = "unknown"
        self.context_tokens: int | None = None
        """A generative model's context limit, likewise (the metadata's ``context_tokens`` or ``max_model_len``)."""
        self.chat_logprobs = True
        """Whether to ask chat completions for logprobs (off once the server refuses them)."""
        self.logprobs_seen: Literal["not asked", "given", "ignored"] = "not asked"
        """Whether the first answer to ask for chat logprobs carried them (:attr:`logprobs`)."""
        self.max_items = max_items
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_after = max_retry_after
        self.max_concurrency = max_concurrency
        self.encoding_format = encoding_format
        self.allow_remote = allow_remote
        self.load_options = MappingProxyType({"model": model, "allow_remote": allow_remote})
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.retries = 0  # 429/503 answers retried so far
        self.reconnects = 0
        """Requests sent again because the kept-alive connection they went out on had been closed
        (:class:`~mmchaos.keepalive.WireTrace`)."""
        headers = {"Accept": "application/json", "User-Agent": "mmchaos-openai-target"}
        if host_header:
            headers["Host"] = host_header
        key = os.environ.get(api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.has_api_key = bool(key)
        self._client = httpx.Client(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=transport,
            limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY),
            follow_redirects=False,
            trust_env=False,  # no proxies from the environment: loopback means loopback
        )

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        base_url: str,
        *,
        model: str | None = None,
        capabilities: Iterable[Capability | str] | None = None,
        image_input: ImageInput | None = None,
        **kwargs: Any,
    ) -> OpenAITarget:
        """Reach the endpoint, pick the model and learn what it can do (or take ``capabilities``).

        Discovery: ``GET /models`` (an ``mmchaos`` block there gives capabilities, fingerprint and
        batching), else one tiny text and one tiny image embedding request. A given ``image_input``
        is the one image form used (and the only one probed). Failures are
        :class:`~mmchaos.errors.TargetLoadError`.
        """
        probe = cls(base_url, model=model or "", capabilities=(), image_input=image_input or "messages", **kwargs)
        if image_input is not None:
            probe.image_forms = (image_input,)
        try:
            cards = probe._list_models()
            chosen = probe._choose(model, cards)
            card = next((c for c in cards if c.get("id") == chosen), {})
            meta = card.get("mmchaos") if isinstance(card.get("mmchaos"), dict) else None
            probe.model = chosen
            if meta is not None and image_input is None:
                probe.image_input = "input" if "input" in (meta.get("image_input") or ()) else "messages"
                probe.max_items = int(meta.get("max_items") or probe.max_items)
            if capabilities is not None:
                caps = frozenset(Capability(c) for c in capabilities)
            elif meta is not None:
                caps = frozenset(Capability(c) for c in meta.get("capabilities", ()) if c in set(Capability))
                probe.probe = {"source": "mmchaos metadata in /models"}
            else:
                caps = probe._probe_capabilities()
            caps &= HTTP_CAPABILITIES
            if not caps:
                raise TargetLoadError(
                    f"{probe.base_url} model {chosen!r} answered neither embeddings nor chat completions; declare "
                    "its capabilities (OpenAITarget.connect(..., capabilities=[...]))"
                )
        except BaseException:
            probe.close()
            raise
        probe.capabilities = caps
        probe.metadata = {"card": {k: v for k, v in card.items() if k != "mmchaos"}, "mmchaos": meta}
        probe._stated_limit(card, meta)
        probe.load_options = MappingProxyType({"model": chosen, "allow_remote": probe.allow_remote})
        return probe

    def _stated_limit(self, card: Mapping[str, Any], meta: Mapping[str, Any] | None) -> None:
        """The context limits ``/models`` states: mmchaos's metadata, else vLLM's ``max_model_len``."""

        def first(*values: Any) -> int | None:
            return next((v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 2), None)

        meta = meta or {}
        self.max_text_tokens = first(meta.get("max_text_tokens"), card.get("max_model_len"))
        self.context_tokens = first(meta.get("context_tokens"), card.get("max_model_len"))
        if self.max_text_tokens is not None:
            self.limit_source = "metadata"

    def _list_models(self) -> list[dict[str, Any]]:
        try:
            resp = self._request("GET", "/models")
        except EndpointError as exc:
            raise TargetLoadError(f"cannot reach {self.base_url}: {exc}") from exc
        if resp.status_code in (401, 403):
            raise TargetLoadError(
                f"{self.base_url} refused the API key (HTTP {resp.status_code}); set {self.api_key_env}"
                + ("" if self.has_api_key else " (it is not set)")
            )
        if resp.status_code == 404:
            return []  # no model listing: the model must be named
        if resp.status_code >= 400:
            raise TargetLoadError(f"GET {self.base_url}/models answered HTTP {resp.status_code}")
        try:
            data = resp.json().get("data", [])
            return [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]
        except (ValueError, AttributeError) as exc:
            raise TargetLoadError(f"GET {self.base_url}/models did not answer an OpenAI model list") from exc

    def _choose(self, model: str | None, cards: list[dict[str, Any]]) -> str:
        ids = [c["id"] for c in cards]
        if model and ids and model not in ids and f"{model}:latest" in ids:
            return f"{model}:latest"  # Ollama lists llava:latest and takes "llava" for it
        if model:
            if ids and model not in ids:
                raise TargetLoadError(f"{self.base_url} does not serve model {model!r} (it serves: {', '.join(ids)})")
            return model
        if len(ids) == 1:
            return str(ids[0])
        if not ids:
            raise TargetLoadError(f"{self.base_url} lists no models; name one with --model")
        raise TargetLoadError(f"{self.base_url} serves several models ({', '.join(ids)}); choose one with --model")

    def _probe_capabilities(self) -> frozenset[Capability]:
        """Try text and image embeddings (every image form) and chat with and without an image."""
        caps: set[Capability] = set()
        evidence: dict[str, Any] = {"source": "probe"}
        text_ok, evidence["text"] = self._attempt(lambda: self.embed_texts(["a photo"]))
        if text_ok:
            caps.add(Capability.EMBED_TEXT)
        form, evidence["image"] = self._probe_image_forms()
        if form is not None:
            self.image_input = form
            caps.add(Capability.EMBED_IMAGE)
        elif text_ok:
            tried = "; ".join(f"{e['form']}: {e['outcome']}" for e in evidence["image"])
            self.gaps["image embeddings"] = f"the endpoint embeds texts but no image form worked ({tried})"
        chat_ok, evidence["chat"] = self._attempt(lambda: self._chat_probe(None))
        if chat_ok:
            caps.add(Capability.GENERATE)
            image_ok, outcome = self._attempt(lambda: self._chat_probe(_probe_images()[0]))
            evidence["chat_image"] = {"ok": image_ok, "outcome": outcome}
            if not image_ok:
                self.gaps["image chat"] = f"chat completions answer texts but refused an image part ({outcome})"
        self.probe = evidence
        return frozenset(caps)

    @staticmethod
    def _attempt(fn: Callable[[], Any]) -> tuple[bool, str]:
        try:
            fn()
            return True, "ok"
        except (TargetCallError, EndpointError) as exc:
            log.debug("probe failed: %s", exc)
            return False, " ".join(str(exc).split())[:300]

    def _probe_image_forms(self) -> tuple[ImageInput | None, list[dict[str, Any]]]:
        """The first form whose answers depend on the pixels, and what each tried form gave."""
        a, b = _probe_images()
        blobs = [png_bytes(a), png_bytes(a, variant=True), png_bytes(b)]
        evidence: list[dict[str, Any]] = []
        original = self.image_input
        for form in self.image_forms:
            self.image_input = form
            try:
                vectors = [self.embed_encoded_images([blob])[0] for blob in blobs]
            except (TargetCallError, EndpointError) as exc:
                evidence.append({"form": form, "ok": False, "outcome": " ".join(str(exc).split())[:300]})
                continue
            finally:
                self.image_input = original
            if not _same_vector(vectors[0], vectors[1]):
                outcome = ("answered, but the same picture in two PNG encodings gave different vectors "
                           "(the data URL was read as text?)")  # fmt: skip
                evidence.append({"form": form, "ok": False, "outcome": outcome})
            elif _same_vector(vectors[0], vectors[2]):
                outcome = "answered, but two different pictures gave the same vector (images ignored?)"
                evidence.append({"form": form, "ok": False, "outcome": outcome})
            else:
                evidence.append({"form": form, "ok": True, "outcome": "embeds pixels"})
                return form, evidence
        return None, evidence

    def _chat_probe(self, image: ImageArray | None) -> None:
        urls = [] if image is None else [data_url(png_bytes(image))]
        payload = chat_body(self.model, chat_image_content(urls, "Say OK."), max_tokens=1, temperature=0)
        asked = {**payload, "logprobs": True}  # learns whether logprobs come back
        body = self._post_chat(asked)
        self._note_logprobs(asked, body)
        if not isinstance(body.get("choices"), list) or not body["choices"]:
            raise EndpointError("POST /chat/completions: no choices in the answer", code="bad_response")

    # -- HTTP --------------------------------------------------------------------------------------

    def _backoff(self, attempt: int, retry_after: str | None) -> float | None:
        """Seconds to wait before retry ``attempt`` (0-based); None: do not retry."""
        cap = min(self.backoff_max, self.backoff_base * 2.0**attempt)
        with self._rng_lock:
            jittered = cap / 2 + self._rng.uniform(0.0, cap / 2)
        wanted = parse_retry_after(retry_after)
        if wanted is None:
            return jittered
        if wanted > self.max_retry_after:
            return None  # the server asks for longer than we wait: give up now
        return max(wanted, jittered)

    def _request(self, method: str, path: str, payload: Any = None) -> Any:
        import httpx

        from mmchaos.keepalive import WireTrace

        content = None if payload is None else json.dumps(payload, separators=(",", ":")).encode("ascii")
        headers = None if payload is None else {"Content-Type": "application/json"}
        attempt = reconnects = 0
        while True:
            wire = WireTrace()
            with self._slots:
                try:
                    resp = self._client.request(method, path, content=content, headers=headers,
                                                extensions={"trace": wire})  # fmt: skip
                except httpx.TimeoutException as exc:
                    raise EndpointError(
                        f"{method} {path}: no answer within {self.timeout:g}s ({type(exc).__name__})", code="timeout"
                    ) from None
                except httpx.HTTPError as exc:
                    if wire.stale(exc) and reconnects < self.max_concurrency:
                        log.debug("%s %s: the reused connection was closed (%s); sent again", method, path, exc)
                        reconnects += 1
                        with self._rng_lock:
                            self.reconnects += 1
                        continue
                    raise EndpointError(
                        f"{method} {path}: {type(exc).__name__}: {exc}", code="connection_failed"
                    ) from None
            if resp.status_code in _RETRY_STATUSES and attempt < self.max_retries:
                delay = self._backoff(attempt, resp.headers.get("retry-after"))
                if delay is not None:
                    log.debug("%s %s: HTTP %d, retry %d in %.2fs", method, path, resp.status_code, attempt + 1, delay)
                    self.retries += 1
                    self._sleep(delay)
                    attempt += 1
                    continue
            return resp

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        resp = self._request("POST", path, payload)
        status = resp.status_code
        self._raise_for_status(resp, path)
        try:
            body = resp.json()
        except ValueError as exc:
            raise EndpointError(
                f"POST {path}: the answer is not JSON ({exc})", code="bad_response", status=status
            ) from None
        if not isinstance(body, dict):
            raise EndpointError(f"POST {path}: the answer is not a JSON object", code="bad_response", status=status)
        return body

    @staticmethod
    def _raise_for_status(resp: Any, path: str) -> None:
        """4xx: the server refused the input (TargetCallError); 5xx, 408, 429: EndpointError."""
        status = resp.status_code
        if status >= 400:
            code, message = error_of(resp, f"http_{status}", resp.reason_phrase)
            text = f"POST {path}: HTTP {status}: {message[:500]}"
            if status >= 500 or status in (408, 429):
                raise EndpointError(text, code=code, status=status)
            raise TargetCallError(text, code=code)

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over ``items``, up to ``max_concurrency`` requests at a time."""
        if len(items) <= 1 or self.max_concurrency == 1:
            return [fn(x) for x in items]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="mmchaos-openai")
            pool = self._pool
        return list(pool.map(fn, items))

    def _vectors(self, body: dict[str, Any], n: int, path: str) -> FloatArray:
        try:
            data = sorted(body["data"], key=lambda d: int(d.get("index", 0)))
            rows = []
            for item in data:
                emb = item["embedding"]
                if isinstance(emb, str):
                    rows.append(np.frombuffer(base64.b64decode(emb, validate=True), dtype="<f4").astype(np.float32))
                else:
                    rows.append(np.asarray(emb, dtype=np.float32))
            out = np.stack(rows) if rows else np.zeros((0, 0), np.float32)
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
            raise EndpointError(f"POST {path}: malformed embeddings answer ({type(exc).__name__}: {exc})",
                                code="bad_response") from None  # fmt: skip
        if out.shape[0] != n:
            raise EndpointError(f"POST {path}: {out.shape[0]} embeddings for {n} inputs", code="bad_response")
        return out

    def _embed_texts(self, texts: list[str]) -> FloatArray:
        payload = text_body(self.model, texts, self.encoding_format)
        return self._vectors(self._post("/embeddings", payload), len(texts), "/embeddings")

    def _embed_urls(self, urls: list[str]) -> FloatArray:
        """One ``/embeddings`` request for ``urls`` in the endpoint's image form."""
        payload = embeddings_form(self.image_input).body(self.model, urls, self.encoding_format)
        return self._vectors(self._post("/embeddings", payload), len(urls), "/embeddings")

    def _chunks(self, items: Sequence[Any]) -> list[list[Any]]:
        return [list(items[i : i + self.max_items]) for i in range(0, len(items), self.max_items)]

    def _join(self, parts: list[FloatArray]) -> FloatArray:
        if not parts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(parts, axis=0), dtype=np.float32)

    # -- the Target interface --------------------------------------------------------------------

    def embed_texts(self, texts: Sequence[str]) -> FloatArray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TargetCallError(f"text {i} is {type(t).__name__}, not str", code="bad_text_type")
        return self._join(self._map(self._embed_texts, self._chunks(list(texts))))

    def embed_images(self, images: Sequence[ImageArray]) -> FloatArray:
        return self.embed_encoded_images([png_bytes(img, i) for i, img in enumerate(images)])

    def embed_encoded_images(self, blobs: Sequence[bytes]) -> FloatArray:
        if not blobs:
            return np.zeros((0, 0), dtype=np.float32)
        urls = []
        for i, blob in enumerate(blobs):
            if not isinstance(blob, bytes | bytearray | memoryview):
                raise TargetCallError(f"image {i} is {type(blob).__name__}, not bytes", code="image_not_bytes")
            urls.append(data_url(bytes(blob)))
        batches = self._chunks(urls) if embeddings_form(self.image_input).batched else [[u] for u in urls]
        return self._join(self._map(self._embed_urls, batches))

    def read_text(self, images: Sequence[ImageArray]) -> list[str]:
        return self.read_encoded_images([png_bytes(img, i) for i, img in enumerate(images)])

    def _require(self, capability: Capability, what: str) -> None:
        """Refuse, as every target does, a call the endpoint was not found (or declared) to serve."""
        if capability not in self.capabilities:
            raise CapabilityError(f"{self.uri} cannot {what} (capabilities: {sorted(self.capabilities)})")

    def read_encoded_images(self, blobs: Sequence[bytes]) -> list[str]:
        self._require(Capability.READ_TEXT, "read text")

        def one(blob: bytes) -> str:
            payload = chat_body(self.model, chat_image_content([data_url(blob)]), temperature=0)
            body = self._post("/chat/completions", payload)
            try:
                content = body["choices"][0]["message"]["content"]
            except (KeyError, IndexError, TypeError) as exc:
                raise EndpointError(
                    f"POST /chat/completions: malformed answer ({exc!r})", code="bad_response"
                ) from None
            return "" if content is None else str(content)

        for i, blob in enumerate(blobs):
            if not isinstance(blob, bytes | bytearray | memoryview):
                raise TargetCallError(f"image {i} is {type(blob).__name__}, not bytes", code="image_not_bytes")
        return [str(t) for t in self._map(one, [bytes(b) for b in blobs])]

    # -- generation --------------------------------------------------------------------------------

    def _chat_payload(
        self, prompt: str | Sequence[Message], images: Sequence[ImageArray], params: GenerationParams
    ) -> dict[str, Any]:
        messages = as_messages(prompt, images)
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": chat_content(m)} for m in messages],
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": params.n,
            "logprobs": params.logprobs,
        }
        if params.seed is not None:
            payload["seed"] = params.seed
        if params.user is not None:
            payload["user"] = params.user
        if params.stop:
            payload["stop"] = list(params.stop)
        if params.logprobs and params.top_logprobs:
            payload["top_logprobs"] = params.top_logprobs
        return payload

    def generate(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[ImageArray] = (),
        params: GenerationParams | None = None,
    ) -> GenerationResult:
        self._require(Capability.GENERATE, "generate")
        params = params or GenerationParams()
        payload = self._chat_payload(prompt, images, params)
        body = self._post_chat(payload)
        self._note_logprobs(payload, body)
        choices, prompt_tokens = choices_of(body)
        emulated = 0
        while len(choices) < params.n:
            # Servers that ignore n (Ollama-style) answer one choice: ask for the rest one at a time,
            # each with its own seed so seeded samples still differ and still replay.
            single = {**payload, "n": 1}
            if params.seed is not None:
                single["seed"] = params.seed + len(choices)
            more, _ = choices_of(self._post_chat(single))
            choices.extend(dict(c, index=len(choices)) for c in more[:1])
            emulated += 1
        raw = [c.get("finish_reason") for c in choices]
        extra: dict[str, object] = {"finish_reasons": raw, "id": body.get("id")}
        if emulated:
            extra["n_emulated_requests"] = emulated
        elif isinstance(body.get("usage"), dict) and isinstance(body["usage"].get("completion_tokens"), int):
            extra["completion_tokens"] = body["usage"]["completion_tokens"]  # all choices' tokens, as OpenAI counts
        return GenerationResult(
            completions=tuple(completion_of(c) for c in choices[: params.n]), prompt_tokens=prompt_tokens, extra=extra
        )

    def generate_encoded(
        self, prompt: str, blobs: Sequence[bytes], params: GenerationParams | None = None
    ) -> GenerationResult:
        """The image bytes go to the server as they are (data URLs): its decoder meets them, not ours."""
        self._require(Capability.GENERATE, "generate")
        params = params or GenerationParams()
        urls = []
        for i, blob in enumerate(blobs):
            if not isinstance(blob, bytes | bytearray | memoryview):
                raise TargetCallError(f"image {i} is {type(blob).__name__}, not bytes", code="image_not_bytes")
            urls.append(data_url(bytes(blob)))
        payload = self._chat_payload(prompt, (), params)
        payload["messages"] = [{"role": "user", "content": chat_image_content(urls, prompt)}]
        body = self._post_chat(payload)
        choices, prompt_tokens = choices_of(body)
        return GenerationResult(
            completions=tuple(completion_of(c) for c in choices[: params.n]), prompt_tokens=prompt_tokens,
            extra={"finish_reasons": [c.get("finish_reason") for c in choices], "id": body.get("id")},
        )  # fmt: skip

    def generate_batch(
        self, requests: Sequence[str | Sequence[Message]], params: GenerationParams | None = None
    ) -> list[GenerationResult]:
        """Concurrent requests (up to ``max_concurrency``): the server's own batching decides."""
        results: list[GenerationResult] = self._map(lambda r: self.generate(r, (), params), list(requests))
        return results

    def _post_chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST a chat request; a server that refuses ``logprobs`` is asked again without it, once,
        and remembered (logprobs are then None)."""
        if not self.chat_logprobs:
            payload = {k: v for k, v in payload.items() if k not in _LOGPROB_FIELDS}
        try:
            return self._post("/chat/completions", payload)
        except TargetCallError as exc:
            if not payload.get("logprobs") or "logprob" not in str(exc).lower():
                raise
            log.info("%s refuses logprobs; asking without them from now on", self.base_url)
            self.chat_logprobs = False
            return self._post("/chat/completions", {k: v for k, v in payload.items() if k not in _LOGPROB_FIELDS})

    def _note_logprobs(self, payload: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        """Record, the first time logprobs were asked for, whether the answer carried them."""
        if not payload.get("logprobs") or self.logprobs_seen != "not asked":
            return
        choices = body.get("choices")
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        found = first.get("logprobs")
        given = isinstance(found, dict) and isinstance(found.get("content"), list)
        self.logprobs_seen = "given" if given else "ignored"
        if not given and self.chat_logprobs:
            log.info("%s ignores logprobs: the answers carry none", self.base_url)

    @property
    def logprobs(self) -> Literal["not asked", "given", "ignored", "refused"]:
        """What the endpoint did the first time chat logprobs were asked for: gave them, answered
        without them (transformers serve, Ollama) or refused the request (asked again without)."""
        return "refused" if not self.chat_logprobs else self.logprobs_seen

    def generate_stream(
        self,
        prompt: str | Sequence[Message],
        images: Sequence[ImageArray] = (),
        params: GenerationParams | None = None,
    ) -> Iterator[str]:
        """The first completion's text deltas, read from ``stream: true`` server-sent events."""
        import httpx

        from mmchaos.keepalive import WireTrace

        self._require(Capability.GENERATE, "generate")
        params = params or GenerationParams()
        if params.n != 1:
            raise TargetCallError("streaming gives one completion; use n=1", code="bad_generation_params")
        payload = self._chat_payload(prompt, images, params)
        payload.pop("logprobs")  # a stream carries text deltas only
        payload.pop("top_logprobs", None)
        payload["stream"] = True
        content = json.dumps(payload, separators=(",", ":")).encode("ascii")
        path = "/chat/completions"
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        with self._slots:
            for attempt in range(self.max_concurrency + 1):
                wire = WireTrace()  # a stream lost before its answer on a closed kept-alive connection: again
                try:
                    with self._client.stream("POST", path, content=content, headers=headers,
                                             extensions={"trace": wire}) as resp:  # fmt: skip
                        if resp.status_code >= 400:
                            resp.read()
                            self._raise_for_status(resp, path)
                        yield from sse_deltas(resp.iter_lines(), path)
                    return
                except httpx.TimeoutException as exc:
                    raise EndpointError(f"POST {path}: stream stalled ({type(exc).__name__})", code="timeout") from None
                except httpx.HTTPError as exc:
                    if wire.stale(exc) and attempt < self.max_concurrency:
                        with self._rng_lock:
                            self.reconnects += 1
                        continue
                    raise EndpointError(f"POST {path}: {type(exc).__name__}: {exc}", code="connection_failed") from None

    def untested_modalities(self) -> dict[str, str]:
        return dict(self.gaps)

    def fingerprint(self) -> Fingerprint:
        """The served model's fingerprint (from ``/models`` metadata) plus the endpoint and model name."""
        meta = self.metadata.get("mmchaos") or {}
        fp = meta.get("fingerprint") if isinstance(meta, dict) else None
        where = {"endpoint": self.base_url, "model": self.model}
        if isinstance(fp, dict):
            versions = {str(k): str(v) for k, v in dict(fp.get("versions") or {}).items()}
            versions.update(where)
            if meta.get("version"):
                versions["mmchaos_server"] = str(meta["version"])
            return Fingerprint(
                weights=str(fp.get("weights", "")),
                tokenizer=str(fp.get("tokenizer", "")),
                processor=str(fp.get("processor", "")),
                config=str(fp.get("config", "")),
                versions=versions,
            )
        card = self.metadata.get("card") or {}
        stable = {k: card.get(k) for k in ("id", "root", "parent", "max_model_len", "owned_by") if k in card}
        digest = hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest() if stable else ""
        return Fingerprint(config=digest, versions=where)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["endpoint"] = {"base_url": self.base_url, "model": self.model, "image_input": self.image_input,
                           "api_key_env": self.api_key_env, "api_key_set": self.has_api_key, "probe": self.probe,
                           "untested_modalities": dict(self.gaps), "timeout": self.timeout,
                           "max_retries": self.max_retries, "max_concurrency": self.max_concurrency,
                           "reconnects": self.reconnects, "logprobs": self.logprobs}  # fmt: skip
        return out

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._client.close()

    def __repr__(self) -> str:
        key = "set" if self.has_api_key else "unset"
        return f"OpenAITarget({self.base_url!r}, model={self.model!r}, api_key={self.api_key_env}:{key})"


class OpenAIOptions(SchemeOptions):
    """``openai:`` options: which model, where requests may go, how they are sent, timed and retried.

    ``--model`` and ``--allow-remote`` set the first two; a ``--target-config`` YAML file the rest."""

    model: str | None = None
    """The served model name (None: the one the endpoint lists)."""
    allow_remote: bool = False
    """Allow hosts that are not loopback addresses."""
    image_input: ImageInput | None = None
    """How images go to ``/embeddings`` (``messages``, ``input``, ``data_url``, ``modality``); None: from
    the server's metadata, else the first form the probe finds embedding pixels."""
    capabilities: list[Capability] | None = None
    """Declare the capabilities instead of discovering them (e.g. ``[generate]``)."""
    api_key_env: str = Field("OPENAI_API_KEY", min_length=1)
    """The environment variable that holds the API key (the key itself is never an option)."""
    timeout: float = Field(60.0, gt=0)
    """Seconds per request."""
    max_retries: int = Field(3, ge=0)
    """Retries of a 429 or 503 answer (jittered exponential backoff, Retry-After honoured)."""
    backoff_base: float = Field(0.1, ge=0)
    backoff_max: float = Field(5.0, ge=0)
    max_retry_after: float = Field(30.0, ge=0)
    """A Retry-After longer than this many seconds ends the retries."""
    max_concurrency: int = Field(4, ge=1)
    """Requests in flight at once."""
    max_items: int = Field(64, ge=1)
    """Inputs per embeddings request (the server's own limit, when it states one, wins)."""
    encoding_format: Literal["float", "base64"] = "base64"
    seed: int | None = None
    """Seed of the backoff jitter."""


@takes_options(OpenAIOptions)
def load_openai(rest: str, options: OpenAIOptions) -> OpenAITarget:
    """The ``openai:`` scheme: ``openai:http://127.0.0.1:8000/v1`` (options: :class:`OpenAIOptions`)."""
    settings = options.model_dump(exclude={"model", "capabilities"})
    return OpenAITarget.connect(rest, model=options.model or None, capabilities=options.capabilities, **settings)


def error_of(resp: Any, code: str, message: str) -> tuple[str, str]:
    """The code and message of an error answer, in the shapes servers send them: OpenAI's and
    vLLM's ``{"error": {"message", "code"}}`` (LiteLLM's code is the status as a string, Ollama's
    null), SGLang's and older vLLM's ``{"object": "error", "message", "code": 400}`` at the top
    level, TGI's ``{"error": "...", "error_type": "validation"}``, FastAPI's ``{"detail": "..."}``
    (transformers serve >= 5.25 refuses an undecodable image so) and its 422
    ``{"detail": [{"loc", "msg"}, ...]}``. A numeric code is no code: the caller's ``http_<status>``
    stays."""
    try:
        body = resp.json()
    except ValueError:
        return code, message
    if not isinstance(body, dict):
        return code, message
    err, detail = body.get("error"), body.get("detail")
    if isinstance(err, dict):
        found, text = err.get("code"), err.get("message")
    elif isinstance(err, str):
        found, text = body.get("error_type"), err
    elif err is None and isinstance(detail, str | list):
        found, text = None, _fastapi_detail(detail)
    else:
        found, text = body.get("code"), body.get("message")
    if isinstance(found, str) and found and not found.isdigit():
        code = found
    if isinstance(text, str) and text:
        message = text
    return code, message


def _fastapi_detail(detail: str | list[Any]) -> str:
    """FastAPI's ``detail``: a string, or its validation errors as ``loc: msg``, joined by ``; ``."""
    if isinstance(detail, str):
        return detail
    parts = []
    for item in detail[:8]:
        if isinstance(item, dict) and isinstance(item.get("msg"), str):
            loc = item.get("loc")
            where = ".".join(str(x) for x in loc) if isinstance(loc, list | tuple) else ""
            parts.append(f"{where}: {item['msg']}" if where else item["msg"])
    return "; ".join(parts)
