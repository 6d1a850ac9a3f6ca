"""``mmchaos fuzz-replay``: run one saved fuzzing reproducer again and say whether it still fails.

Exit codes: 0 the input is handled cleanly now, 1 it still fails (with ``--expect``: with that
same signature; a different failure is also 1, and says so), 2 usage error. A ``.http.json``
file (the schema phase's saved request) is sent to the target's server again as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mmchaos.cli._common import out
from mmchaos.cli.target_flags import with_target_flags
from mmchaos.errors import DataError, UsageError
from mmchaos.targets.options import TargetOptions

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    if any(info.name == "fuzz-replay" for info in app.registered_commands):
        return
    app.command("fuzz-replay")(fuzz_replay_command)


def _options(pairs: list[str] | None) -> dict[str, str | bool]:
    options: dict[str, str | bool] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option takes key=value, got {pair!r}", code="config_invalid")
        options[key] = {"true": True, "false": False}.get(value.lower(), value)
    return options


def _fuzz_replay(
    file: Annotated[Path, typer.Argument(help="the saved reproducer (evidence/<check>-NN-min.<ext>)")],
    target: Annotated[str, typer.Option("--target", "-t", help="target URI the reproducer was found on")],
    kind: Annotated[str | None, typer.Option("--kind", help="image_bytes or text_bytes (default: by suffix)")] = None,
    expect: Annotated[str | None, typer.Option("--expect", help="the failure signature the finding recorded")] = None,
    option: Annotated[
        list[str] | None,
        typer.Option("--option", help="a target option key=value (repeatable; as the fuzz check's replay line writes)"),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds before the input counts as hung")] = 30.0,
    inprocess: Annotated[bool, typer.Option("--inprocess", help="run in this process (no worker isolation)")] = False,
    options: TargetOptions | None = None,
) -> int:
    """Replay a fuzzing reproducer against a target: exit 1 if it still fails, 0 if it is handled."""
    if not file.is_file():
        raise DataError(f"no such reproducer file: {file}", code="data_missing_file")
    data = file.read_bytes()
    if file.name.endswith(".http.json"):
        if options or option:
            raise UsageError(
                "a saved HTTP request is sent as it was: target options do not apply", code="config_invalid"
            )
        return _replay_http(target, data)
    from mmchaos.fuzz.replay import kind_of, replay_input
    from mmchaos.targets import resolve_target_options

    given = TargetOptions(_options(option)).merged(options or {})  # the flags win over --option pairs
    resolve_target_options(target, given)  # an option the scheme does not take: exit 2 now
    verdict = replay_input(
        target,
        data,
        kind_of(file, kind),
        options=given.to_dict(),
        timeout_s=timeout,
        isolation="inprocess" if inprocess else "subprocess",
    )
    out.print(f"outcome: {verdict.outcome}: {verdict.detail}", markup=False, highlight=False, soft_wrap=True)
    if verdict.signature:
        out.print(f"signature: {verdict.signature}", markup=False, highlight=False, soft_wrap=True)
    if not verdict.failed:
        out.print("not reproduced: the input is handled cleanly", markup=False)
        return 0
    if expect is not None and verdict.signature != expect:
        out.print(f"a different failure than expected ({expect})", markup=False, highlight=False, soft_wrap=True)
    else:
        out.print("reproduced", markup=False)
    return 1


fuzz_replay_command = with_target_flags(_fuzz_replay)
"""``mmchaos fuzz-replay`` with the shared target flags (:mod:`mmchaos.cli.target_flags`)."""


def _replay_http(target: str, data: bytes) -> int:
    from mmchaos.fuzz.openapi import replay_request

    if not target.startswith("openai:"):
        raise UsageError("a saved HTTP request replays against an openai: target", code="config_invalid")
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise DataError(f"not a saved request (JSON): {exc}", code="data_invalid") from exc
    status, detail = replay_request(target.removeprefix("openai:"), record)
    out.print(f"{record.get('method')} {record.get('path')} ({record.get('label', '')}): {detail}", markup=False)
    failed = status is None or status >= 500
    out.print("reproduced" if failed else "not reproduced: the server answers below 500", markup=False)
    return 1 if failed else 0
