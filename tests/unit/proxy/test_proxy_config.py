"""Typed proxy configuration: toxics in toxiproxy's JSON, files, the --toxic shorthand, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from mmchaos.cli.proxy_cmd import parse_toxic_spec, register
from mmchaos.errors import ConfigError, UnknownNameError, UsageError
from mmchaos.proxy.config import (
    TOXIC_TYPES,
    LatencyToxic,
    ProxyConfig,
    load_toxics_file,
    merge_toxic,
    parse_hostport,
    parse_toxic,
)


def test_toxiproxy_json_round_trips_with_default_names() -> None:
    toxic = parse_toxic({"type": "latency", "attributes": {"latency": 100, "jitter": 10}})
    assert isinstance(toxic, LatencyToxic)
    assert toxic.model_dump() == {
        "name": "latency_downstream",
        "stream": "downstream",
        "toxicity": 1.0,
        "type": "latency",
        "attributes": {"latency": 100, "jitter": 10},
    }
    assert parse_toxic(toxic.model_dump()) == toxic
    assert parse_toxic({"type": "timeout", "stream": "upstream"}).name == "timeout_upstream"
    for kind, attrs in {
        "bandwidth": {"rate": 10},
        "slow_close": {"delay": 5},
        "timeout": {"timeout": 0},
        "reset_peer": {"timeout": 0},
        "slicer": {"average_size": 10, "size_variation": 2, "delay": 100},
        "limit_data": {"bytes": 10},
        "down": {},
        "http_status": {"status": 429, "retry_after": 1},
        "http_corrupt": {"flips": 2},
        "http_truncate": {"fraction": 0.25},
        "http_drop_header": {"headers": ["Content-Type"]},
        "http_stall": {"after_bytes": 3, "duration": 100},
    }.items():
        assert parse_toxic({"type": kind, "attributes": attrs}).type == kind
    assert set(TOXIC_TYPES) >= {"latency", "bandwidth", "slow_close", "timeout", "reset_peer", "slicer", "limit_data"}


@pytest.mark.parametrize(
    ("data", "error", "needle"),
    [
        ({"type": "latncy"}, UnknownNameError, "did you mean latency"),
        ({"type": "latency", "attributes": {"ms": 200}}, ConfigError, "attributes.ms: Extra inputs"),
        ({"type": "latency", "attributes": {"latency": -5}}, ConfigError, "attributes.latency"),
        ({"type": "latency"}, ConfigError, "attributes: Field required"),
        ({"type": "latency", "attributes": {"latency": 1}, "toxicity": 1.5}, ConfigError, "toxicity"),
        ({"type": "latency", "attributes": {"latency": 1}, "stream": "sideways"}, ConfigError, "stream"),
        ({"type": "latency", "attributes": {"latency": 1}, "extra": 1}, ConfigError, "extra"),
        ({"type": "http_status", "stream": "upstream"}, ConfigError, "must be 'downstream'"),
        ({"type": "http_status", "attributes": {"status": 99}}, ConfigError, "attributes.status"),
        ({"type": "http_drop_header", "attributes": {"headers": ["bad header"]}}, ConfigError, "header name"),
        ({"type": "latency", "name": "has space", "attributes": {"latency": 1}}, ConfigError, "name"),
    ],
)
def test_bad_toxics_get_one_line_errors(data: dict[str, object], error: type[Exception], needle: str) -> None:
    with pytest.raises(error) as info:
        parse_toxic(data)
    assert isinstance(info.value, UsageError) and isinstance(info.value, ValueError)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_merge_toxic_updates_attributes_only_where_given() -> None:
    toxic = parse_toxic({"type": "latency", "attributes": {"latency": 100, "jitter": 10}})
    merged = merge_toxic(toxic, {"attributes": {"latency": 5}, "toxicity": 0.5})
    assert merged.attributes.model_dump() == {"latency": 5, "jitter": 10} and merged.toxicity == 0.5
    with pytest.raises(ConfigError, match="cannot change"):
        merge_toxic(toxic, {"type": "bandwidth"})


def test_addresses_and_proxy_config() -> None:
    assert parse_hostport("127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_hostport("[::1]:9000") == ("::1", 9000)
    assert parse_hostport(":9000") == ("127.0.0.1", 9000)
    for bad in ("nohost", "1.2.3.4:99999", "a:b", ""):
        with pytest.raises(ConfigError):
            parse_hostport(bad)
    cfg = ProxyConfig.parse({"upstream": "127.0.0.1:8000", "toxics": [{"type": "down"}]})
    assert cfg.listen == "127.0.0.1:0" and cfg.toxics[0].type == "down"
    with pytest.raises(ConfigError, match="upstream"):
        ProxyConfig.parse({"upstream": "nowhere"})
    with pytest.raises(ConfigError, match="unique"):
        ProxyConfig.parse({"upstream": "127.0.0.1:1", "toxics": [{"type": "down"}, {"type": "down"}]})


def test_toxics_file_yaml_and_json(tmp_path: Path) -> None:
    f = tmp_path / "toxics.yaml"
    f.write_text(
        "toxics:\n"
        "  - type: latency\n    attributes: {latency: 200, jitter: 50}\n    toxicity: 0.5\n"
        "  - {type: http_status, attributes: {status: 503, retry_after: 2}}\n"
    )
    toxics = load_toxics_file(f)
    assert [t.name for t in toxics] == ["latency_downstream", "http_status_downstream"]
    j = tmp_path / "toxics.json"
    j.write_text(json.dumps([t.model_dump() for t in toxics]))
    assert load_toxics_file(j) == toxics
    for text, needle in [
        ("toxics: {type: latency}\n", "expected a list"),
        ("other: []\n", "only 'toxics:'"),
        ("toxics:\n  - {type: warp}\n", "unknown toxic type"),
        ("toxics: [\n", "cannot read"),
        ("- {type: down}\n- {type: down}\n", "unique"),
    ]:
        f.write_text(text)
        with pytest.raises(UsageError, match=needle):
            load_toxics_file(f)
    with pytest.raises(ConfigError, match="not found"):
        load_toxics_file(tmp_path / "missing.yaml")


def test_toxic_flag_is_a_thin_layer_over_the_models() -> None:
    toxic = parse_toxic_spec("latency:latency=200,jitter=50,stream=upstream,toxicity=0.5")
    assert toxic == parse_toxic(
        {"type": "latency", "stream": "upstream", "toxicity": 0.5, "attributes": {"latency": 200, "jitter": 50}}
    )
    assert parse_toxic_spec("down").type == "down"
    assert parse_toxic_spec("http_drop_header:headers=Content-Type|Retry-After,name=nohdr").model_dump()["attributes"][
        "headers"
    ] == ["Content-Type", "Retry-After"]
    assert parse_toxic_spec("http_stall:streaming_only=false").attributes.streaming_only is False  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="key=value"):
        parse_toxic_spec("latency:200")
    with pytest.raises(ConfigError, match="attributes.ms"):
        parse_toxic_spec("latency:ms=200")
    with pytest.raises(UnknownNameError):
        parse_toxic_spec("latenzy:latency=1")


def test_cli_errors_are_mmchaos_usage_errors(tmp_path: Path) -> None:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        pass

    register(app)
    runner = CliRunner()
    cases = [
        (["proxy", "--upstream", "127.0.0.1:1", "--toxic", "latency:ms=1"], ConfigError),
        (["proxy", "--upstream", "nope"], ConfigError),
        (["proxy", "--upstream", "127.0.0.1:1", "--control", "bad"], ConfigError),
        (["proxy", "--upstream", "127.0.0.1:1", "--toxics-file", str(tmp_path / "none.yaml")], ConfigError),
        (["proxy", "--upstream", "127.0.0.1:1", "--toxic", "down", "--toxic", "down"], ConfigError),
        (["proxy", "--upstream", "127.0.0.1:1", "--loop", "tokio"], ConfigError),
    ]
    for argv, error in cases:
        result = runner.invoke(app, argv)
        assert isinstance(result.exception, error), (argv, result.exception, result.output)
    assert runner.invoke(app, ["proxy"]).exit_code == 2  # --upstream missing: click's usage error
