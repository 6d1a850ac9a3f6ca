"""Typed configuration of the fault proxy: toxics and proxies, in toxiproxy's names and JSON.

A toxic is ``{"name", "type", "stream", "toxicity", "attributes"}`` exactly as toxiproxy's REST
API spells it, so its users' scripts and habits carry over. Time attributes are milliseconds
(``slicer.delay`` is microseconds, as in toxiproxy), ``bandwidth.rate`` is KB/s (1 KB = 1000 bytes).
The TCP toxics' attributes are integers, as toxiproxy's are. Every number is finite and bounded
(times by :data:`MAX_MS`, sizes by :data:`MAX_BYTES`) and no string holds a control character,
so nothing a client sends can overflow a timer or inject a header.
The ``http_*`` types are mmchaos's own: faults toxiproxy cannot do because it does not read HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from mmchaos._yaml import describe_yaml_error
from mmchaos.errors import ConfigError, UnknownNameError
from mmchaos.registry import closest

__all__ = [
    "HTTP_TOXIC_TYPES",
    "MAX_BYTES",
    "MAX_MS",
    "TCP_TOXIC_TYPES",
    "TOXIC_TYPES",
    "BandwidthToxic",
    "DownToxic",
    "HttpCorruptToxic",
    "HttpDropHeaderToxic",
    "HttpStallToxic",
    "HttpStatusToxic",
    "HttpTruncateToxic",
    "LatencyToxic",
    "LimitDataToxic",
    "ProxyConfig",
    "ResetPeerToxic",
    "SlicerToxic",
    "SlowCloseToxic",
    "Stream",
    "TimeoutToxic",
    "Toxic",
    "ToxicsFile",
    "load_toxics_file",
    "merge_toxic",
    "parse_hostport",
    "parse_toxic",
]

Stream = Literal["upstream", "downstream"]
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$"
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_MEDIA_TYPE = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+/[!#$%&'*+.^_`|~0-9A-Za-z-]+( *; *[ -~]*)?$"  # printable ASCII
_NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"

MAX_MS = 86_400_000
"""The longest time attribute, ms (a day): longer is a typo or an attack, and would overflow timers."""
MAX_BYTES = 1 << 50
"""The largest byte-count attribute."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --- TCP toxics (toxiproxy's) ------------------------------------------------------------------


class LatencyAttributes(_Strict):
    latency: int = Field(ge=0, le=MAX_MS, description="delay added to every chunk, ms")
    jitter: int = Field(default=0, ge=0, le=MAX_MS, description="uniform +/- variation of the delay, ms")


class BandwidthAttributes(_Strict):
    rate: int = Field(
        ge=0, le=1_000_000_000, description="KB/s (1 KB = 1000 bytes); 0 means unlimited, as in toxiproxy"
    )


class SlowCloseAttributes(_Strict):
    delay: int = Field(ge=0, le=MAX_MS, description="ms the close is held back after the source closed")


class TimeoutAttributes(_Strict):
    timeout: int = Field(
        default=0, ge=0, le=MAX_MS, description="ms before the connection is closed; 0 holds it until removed"
    )


class ResetPeerAttributes(_Strict):
    timeout: int = Field(default=0, ge=0, le=MAX_MS, description="ms before the connection is reset (RST)")


class SlicerAttributes(_Strict):
    average_size: int = Field(ge=1, le=1 << 30, description="mean slice size, bytes")
    size_variation: int = Field(default=0, ge=0, le=1 << 30, description="uniform +/- variation of the slice size")
    delay: int = Field(default=0, ge=0, le=MAX_MS * 1000, description="pause between slices, microseconds")


class LimitDataAttributes(_Strict):
    bytes: int = Field(ge=0, le=MAX_BYTES, description="bytes let through before the connection is closed")


class DownAttributes(_Strict):
    pass


# --- HTTP toxics (mmchaos's) -------------------------------------------------------------------


class _HttpAttributes(_Strict):
    path_prefix: str | None = Field(
        default=None, max_length=2048, pattern=_NO_CONTROL, description="only requests whose target starts with this"
    )


class HttpStatusAttributes(_HttpAttributes):
    status: int = Field(default=503, ge=200, le=599)
    retry_after: int | None = Field(default=None, ge=0, le=MAX_MS // 1000, description="seconds, sent as Retry-After")
    body: str | None = Field(
        default=None, max_length=1 << 20, description="response body; an OpenAI-style JSON error by default"
    )
    content_type: str = Field(default="application/json", max_length=255, pattern=_MEDIA_TYPE)


class HttpCorruptAttributes(_HttpAttributes):
    flips: int = Field(default=8, ge=1, le=1_000_000, description="body bytes XOR-ed with 0xFF")


class HttpTruncateAttributes(_HttpAttributes):
    bytes: int | None = Field(
        default=None, ge=0, le=MAX_BYTES, description="body bytes sent before the close; wins over fraction"
    )
    fraction: float = Field(default=0.5, ge=0, lt=1, description="share of a Content-Length body sent before the close")


class HttpDropHeaderAttributes(_HttpAttributes):
    headers: list[str] = Field(default_factory=lambda: ["Content-Type"], min_length=1, max_length=64)

    @field_validator("headers", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("headers")
    @classmethod
    def _valid_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not a header name")
        return value


class HttpStallAttributes(_HttpAttributes):
    after_bytes: int = Field(default=0, ge=0, le=MAX_BYTES, description="body bytes forwarded before the stall")
    duration: float = Field(
        default=0, ge=0, le=MAX_MS, description="ms the rest is held; 0 holds it until the toxic is removed"
    )
    streaming_only: bool = Field(default=True, description="only chunked, read-until-close or SSE responses")


# --- Toxic models -----------------------------------------------------------------------------


class _ToxicBase(_Strict):
    name: str = Field(default="", pattern=_NAME)
    stream: Stream = "downstream"
    toxicity: float = Field(default=1.0, ge=0, le=1, description="probability the toxic applies")

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        # toxiproxy names an unnamed toxic "<type>_<stream>".
        if isinstance(data, Mapping) and not data.get("name"):
            data = {**data, "name": f"{data.get('type', '')}_{data.get('stream') or 'downstream'}"}
        return data


class _HttpToxicBase(_ToxicBase):
    @field_validator("stream")
    @classmethod
    def _downstream_only(cls, value: str) -> str:
        if value != "downstream":
            raise ValueError("HTTP toxics act on responses: stream must be 'downstream'")
        return value


class LatencyToxic(_ToxicBase):
    """Delay every chunk by latency +/- jitter ms."""

    type: Literal["latency"]
    attributes: LatencyAttributes


class BandwidthToxic(_ToxicBase):
    """Limit the rate to ``rate`` KB/s."""

    type: Literal["bandwidth"]
    attributes: BandwidthAttributes


class SlowCloseToxic(_ToxicBase):
    """Hold the close back for ``delay`` ms after the source closed."""

    type: Literal["slow_close"]
    attributes: SlowCloseAttributes


class TimeoutToxic(_ToxicBase):
    """Drop all data, and close the connection after ``timeout`` ms (0: never, until removed)."""

    type: Literal["timeout"]
    attributes: TimeoutAttributes = Field(default_factory=TimeoutAttributes)


class ResetPeerToxic(_ToxicBase):
    """Reset the connection (TCP RST) ``timeout`` ms after the toxic took hold of it."""

    type: Literal["reset_peer"]
    attributes: ResetPeerAttributes = Field(default_factory=ResetPeerAttributes)


class SlicerToxic(_ToxicBase):
    """Cut data into slices of average_size +/- size_variation bytes, ``delay`` us apart."""

    type: Literal["slicer"]
    attributes: SlicerAttributes


class LimitDataToxic(_ToxicBase):
    """Close the connection once ``bytes`` bytes went through."""

    type: Literal["limit_data"]
    attributes: LimitDataAttributes


class DownToxic(_ToxicBase):
    """The service is down: close connections as they arrive (and those it takes hold of)."""

    type: Literal["down"]
    attributes: DownAttributes = Field(default_factory=DownAttributes)


class HttpStatusToxic(_HttpToxicBase):
    """Answer requests with ``status`` from the proxy, never reaching the upstream."""

    type: Literal["http_status"]
    attributes: HttpStatusAttributes = Field(default_factory=HttpStatusAttributes)


class HttpCorruptToxic(_HttpToxicBase):
    """Flip ``flips`` bytes of response bodies; lengths, and so Content-Length, stay the same."""

    type: Literal["http_corrupt"]
    attributes: HttpCorruptAttributes = Field(default_factory=HttpCorruptAttributes)


class HttpTruncateToxic(_HttpToxicBase):
    """Send part of a response body, then close the connection."""

    type: Literal["http_truncate"]
    attributes: HttpTruncateAttributes = Field(default_factory=HttpTruncateAttributes)


class HttpDropHeaderToxic(_HttpToxicBase):
    """Remove headers (Content-Type by default) from responses."""

    type: Literal["http_drop_header"]
    attributes: HttpDropHeaderAttributes = Field(default_factory=HttpDropHeaderAttributes)


class HttpStallToxic(_HttpToxicBase):
    """Stop forwarding a streaming response after ``after_bytes`` body bytes, for ``duration`` ms."""

    type: Literal["http_stall"]
    attributes: HttpStallAttributes = Field(default_factory=HttpStallAttributes)


Toxic = Annotated[
    LatencyToxic
    | BandwidthToxic
    | SlowCloseToxic
    | TimeoutToxic
    | ResetPeerToxic
    | SlicerToxic
    | LimitDataToxic
    | DownToxic
    | HttpStatusToxic
    | HttpCorruptToxic
    | HttpTruncateToxic
    | HttpDropHeaderToxic
    | HttpStallToxic,
    Field(discriminator="type"),
]

TCP_TOXIC_TYPES: tuple[str, ...] = (
    "latency",
    "bandwidth",
    "slow_close",
    "timeout",
    "reset_peer",
    "slicer",
    "limit_data",
    "down",
)
HTTP_TOXIC_TYPES: tuple[str, ...] = ("http_status", "http_corrupt", "http_truncate", "http_drop_header", "http_stall")
TOXIC_TYPES = TCP_TOXIC_TYPES + HTTP_TOXIC_TYPES
_TOXIC_ADAPTER: TypeAdapter[Toxic] = TypeAdapter(Toxic)


def parse_hostport(value: str, *, what: str = "address", default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` to ``(host, port)``; a ConfigError otherwise."""
    text = value.strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.%a-zA-Z]+)\]:(\d+)|([^\s:\[\]]*):(\d+)", text)
    if m is None:
        raise ConfigError(f"{what} {value!r} is not host:port (IPv6 as [::1]:port)", code="config_bad_address")
    host = m.group(1) or m.group(3) or default_host
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what} {value!r}: port {port} is out of range", code="config_bad_address")
    if len(host) > 253 or any(len(label) > 63 for label in host.split(".")) or not host.isprintable():
        raise ConfigError(f"{what} {value[:80]!r}: {host[:40]!r} is not a host name", code="config_bad_address")
    return host, port


def _describe(exc: ValidationError, what: str) -> str:
    parts = []
    for err in exc.errors()[:4]:
        path = list(err["loc"])
        if path and path[0] in TOXIC_TYPES:  # the union's tag, not a field
            path = path[1:]
        loc = ".".join(map(str, path))
        parts.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    more = f" (+{exc.error_count() - 4} more)" if exc.error_count() > 4 else ""
    return f"{what}: " + "; ".join(parts) + more


def parse_toxic(data: Mapping[str, Any] | BaseModel) -> Toxic:
    """Validate one toxic (toxiproxy JSON); unknown types answer with the closest known ones."""
    if isinstance(data, _ToxicBase):
        return data  # type: ignore[return-value]
    if isinstance(data, BaseModel):
        data = data.model_dump()
    if not isinstance(data, Mapping):
        raise ConfigError(f"a toxic must be a mapping, not {type(data).__name__}", code="config_invalid")
    kind = data.get("type")
    if kind not in TOXIC_TYPES:
        hint = closest(str(kind), TOXIC_TYPES) or f" (known: {', '.join(TOXIC_TYPES)})"
        raise UnknownNameError(f"unknown toxic type {kind!r}{hint}", code="unknown_toxic")
    try:
        return _TOXIC_ADAPTER.validate_python(dict(data))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, f"toxic {data.get('name') or kind!r}"), code="config_invalid_toxic") from None


def merge_toxic(existing: Toxic, changes: Mapping[str, Any]) -> Toxic:
    """Apply a partial update (toxiproxy's ``POST /proxies/{p}/toxics/{t}``): attributes merge."""
    data = existing.model_dump()
    for key, value in changes.items():
        if key in ("name", "type") and value != data[key]:
            raise ConfigError(f"a toxic's {key} cannot change (delete it and add a new one)", code="config_invalid")
        if key == "attributes":
            if not isinstance(value, Mapping):
                raise ConfigError("attributes must be a mapping", code="config_invalid_toxic")
            data["attributes"] = {**data["attributes"], **value}
        else:
            data[key] = value
    return parse_toxic(data)


class ProxyConfig(_Strict):
    """One proxy, as toxiproxy's ``POST /proxies`` takes it (plus a seed)."""

    name: str = Field(default="mmchaos", pattern=_NAME)
    listen: str = "127.0.0.1:0"
    upstream: str
    enabled: bool = True
    toxics: list[Toxic] = Field(default_factory=list, max_length=1000)
    seed: int = Field(default=0, ge=-(2**63), lt=2**63)

    @field_validator("listen", "upstream")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            parse_hostport(value)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("toxics")
    @classmethod
    def _unique(cls, value: list[Toxic]) -> list[Toxic]:
        names = [t.name for t in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"toxic names must be unique: {', '.join(dupes)}")
        return value

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ProxyConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(f"a proxy must be a mapping, not {type(data).__name__}", code="config_invalid_proxy")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(_describe(exc, f"proxy {data.get('name', '')!r}"), code="config_invalid_proxy") from None


class ToxicsFile(_Strict):
    """A ``--toxics-file``: ``toxics:`` followed by a list of toxics (a bare list is accepted too)."""

    toxics: list[Toxic]


def load_toxics_file(path: Path) -> list[Toxic]:
    """Read toxics from YAML or JSON; every error is a one-line ConfigError."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"toxics file not found: {path}", code="config_missing_file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        why = describe_yaml_error(exc) if isinstance(exc, yaml.YAMLError) else str(exc) or type(exc).__name__
        raise ConfigError(f"{path}: cannot read toxics ({why})", code="config_invalid") from None
    if isinstance(raw, list):
        raw = {"toxics": raw}
    if not isinstance(raw, dict) or set(raw) != {"toxics"} or not isinstance(raw["toxics"], list):
        raise ConfigError(f"{path}: expected a list of toxics, or a mapping with only 'toxics:'", code="config_invalid")
    toxics = [parse_toxic(t) for t in raw["toxics"]]
    names = [t.name for t in toxics]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{path}: toxic names must be unique: {', '.join(dupes)}", code="config_invalid")
    return toxics
