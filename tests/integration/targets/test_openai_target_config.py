"""``--target-config`` for ``openai:`` targets: the options the CLI has no flag for (timeouts,
retries, concurrency, the API key variable, the image form) reach the target, checked by its
scheme's options model. Against the FAKE OpenAI-compatible server on loopback
(tests/fakes/openai_server.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mmchaos.targets import load_target
from tests.fakes.openai_server import FakeConfig, fake_openai_server

pytestmark = pytest.mark.integration  # a real HTTP server on a loopback port

SUITE = """
name: openai-options
seed: 3
checks:
  - check: batch_invariance
    params: {samples: 4, batch_sizes: [1, 3]}
"""


def test_validate_sets_timeouts_retries_and_the_image_form_from_a_target_config(run_cli: Any, tmp_path: Path) -> None:
    fake = FakeConfig(image_forms=("messages", "data_url"), chat=False)
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    config = tmp_path / "t.yaml"
    config.write_text(
        "timeout: 7.5\nmax_retries: 1\nmax_concurrency: 2\nimage_input: data_url\napi_key_env: MMCHAOS_TEST_KEY\n"
    )
    with fake_openai_server(fake) as url:
        probed = load_target(f"openai:{url}")
        assert probed.describe()["endpoint"]["image_input"] == "messages"  # what the probe picks by itself
        probed.close()
        fake.requests.clear()
        code, out, err = run_cli(
            "validate", "--target", f"openai:{url}", "--target-config", str(config), "--suite", str(suite),
            "--data", "builtin:shapes?n=6", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "runs.db"),
        )  # fmt: skip
    assert code in (0, 1), err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    endpoint = results["target"]["endpoint"]
    assert endpoint["image_input"] == "data_url" and endpoint["timeout"] == 7.5
    assert endpoint["max_retries"] == 1 and endpoint["max_concurrency"] == 2
    assert endpoint["api_key_env"] == "MMCHAOS_TEST_KEY"
    assert [p["form"] for p in endpoint["probe"]["image"]] == ["data_url"]  # the declared form, only
    embeds = [r["body"] for r in fake.requests if r["path"].endswith("/embeddings")]
    assert embeds and not any("messages" in body for body in embeds)  # no image went in the messages form


def test_a_target_config_option_the_scheme_does_not_take_exits_2_naming_its_options(
    run_cli: Any, tmp_path: Path
) -> None:
    config = tmp_path / "t.yaml"
    config.write_text("timeout: 5\nretries: 2\n")
    with fake_openai_server(FakeConfig()) as url:
        code, out, err = run_cli(
            "validate", "--target", f"openai:{url}", "--target-config", str(config), "--store", str(tmp_path / "r.db")
        )
    assert code == 2 and "Traceback" not in out + err
    line = " ".join(err.split())
    assert "'retries' does not apply to openai: targets; did you mean max_retries" in line
    assert "timeout" in line and "image_input" in line
