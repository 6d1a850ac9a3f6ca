"""What tests of forked workers share: refusing any worker started as a fresh interpreter."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest


def no_worker_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawned worker would be a new interpreter loading the target again: make it an error."""
    real = subprocess.Popen

    def refuse(argv: Any, *args: Any, **kwargs: Any) -> Any:
        if "child_entry" in " ".join(map(str, argv)):
            raise AssertionError(f"a worker interpreter was started: {argv}")
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", refuse)
