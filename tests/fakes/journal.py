"""The executor journal protocol over a plain dict."""

from __future__ import annotations


class DictJournal:
    """The journal protocol over a dict (the SQLite one is exercised by the resume tests)."""

    def __init__(self) -> None:
        self.units: dict[str, str] = {}

    def keys(self) -> set[str]:
        return set(self.units)

    def get(self, key: str) -> str:
        return self.units[key]

    def commit(self, key: str, body: str) -> None:
        self.units[key] = body
