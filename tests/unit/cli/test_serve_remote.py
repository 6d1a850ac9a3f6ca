"""``mmchaos serve`` keeps to loopback unless ``--allow-remote``, the rule ``proxy`` and ``openai:`` follow."""

from __future__ import annotations

import pytest

from mmchaos.net import REMOTE_REFUSED


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.invalid"])
def test_serve_refuses_a_host_that_is_not_loopback(run_cli, host: str) -> None:  # type: ignore[no-untyped-def]
    """``--host 0.0.0.0`` bound every interface with no opt-in, no warning and no key."""
    code, out, err = run_cli("serve", "--target", "py:tests.fakes.targets:hash_embed", "--host", host, "--port", "0")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "--host" in lines[0] and "--allow-remote" in lines[0] and REMOTE_REFUSED in lines[0], err
    assert "mmchaos serve:" not in err  # refused before anything was served


def test_serve_refuses_the_remote_host_before_loading_the_target(run_cli) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli("serve", "--target", "py:no_such_module_here:f", "--host", "0.0.0.0")
    assert code == 2 and REMOTE_REFUSED in err and "no_such_module_here" not in err, err


def test_allow_remote_on_a_builtin_target_is_the_listen_opt_in_not_a_target_option(run_cli) -> None:  # type: ignore[no-untyped-def]
    """``--allow-remote`` is also a target flag (openai:); a target that does not take it still serves."""
    code, _, err = run_cli("serve", "--target", "builtin:no-such-model", "--allow-remote", "--host", "127.0.0.1")
    assert code == 2 and "does not apply" not in err, err
