"""One line for a YAML parse error: where it is and what is wrong.

PyYAML's messages run over four or five lines (context, a quoted snippet, a caret line), which
breaks the one-line rule for bad input to mmchaos; their first line alone ("while parsing a flow
node") says neither where nor what. Every loader of a user's YAML file words its error with this.
"""

from __future__ import annotations

from typing import Any

__all__ = ["describe_yaml_error"]


def describe_yaml_error(exc: Exception) -> str:
    """``"line 2, column 1: expected the node content, but found '<stream end>'"`` for a YAML error."""
    mark: Any = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
