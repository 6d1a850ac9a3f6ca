"""Where things are, for tests at any depth of the tier folders."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SRC = REPO / "src"
DOCS = REPO / "docs"
TEST_DATA = TESTS / "data"
