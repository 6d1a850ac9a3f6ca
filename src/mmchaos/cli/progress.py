"""Rich progress: a bar over the run's checks, and one per long loop inside a check.

On a terminal the checks show as one live bar (``[3/12] batch_invariance``); in a log (CI, a
pipe) there is no live display, so each finished check prints one ``done`` line instead.

The display must cost nothing next to the model: Rich's default redraws the whole table ten times
a second from a thread of its own, whose samples showed up in profiles of a validate run. Here it
redraws twice a second (the elapsed column counts whole seconds) and on each check event, and off a
terminal it never starts: there is nothing to draw to.
"""

from __future__ import annotations

from typing import Any, Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from mmchaos.cli._common import verdict_counts

__all__ = ["REFRESH_PER_SECOND", "CheckProgress", "RichProgress"]

REFRESH_PER_SECOND = 2.0
"""Redraws of the live display per second (Rich's default is 10)."""


class _RichTask:
    def __init__(self, progress: Progress, task_id: TaskID) -> None:
        self._progress = progress
        self._id = task_id

    def advance(self, n: int = 1) -> None:
        self._progress.advance(self._id, n)

    def close(self) -> None:
        self._progress.update(self._id, visible=False)


class RichProgress:
    """One live Progress display; each long loop of a check gets its own bar."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold blue]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            refresh_per_second=REFRESH_PER_SECOND,
        )
        self._live = False

    def __enter__(self) -> Self:
        if self.console.is_terminal:  # off a terminal: no live display, so no refresh thread
            self.progress.start()
            self._live = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self.progress.stop()
            self._live = False

    def task(self, description: str, total: int) -> _RichTask:
        return _RichTask(self.progress, self.progress.add_task(description, total=total))


class CheckProgress(RichProgress):
    """The run's checks as one bar (a :class:`mmchaos.runner.RunObserver`), above the checks' own bars."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self._checks: TaskID | None = None

    def planned(self, check_ids: list[str], done: set[str]) -> None:
        if self.console.is_terminal:
            self._checks = self.progress.add_task("checks", total=len(check_ids), completed=len(done))
            self.progress.refresh()

    def started(self, check_id: str) -> None:
        if self._checks is not None:
            self.progress.update(self._checks, description=f"checks · {check_id}")
            self.progress.refresh()

    def finished(self, check_id: str, findings: list[Any]) -> None:
        if self._checks is not None:
            self.progress.advance(self._checks)
            self.progress.refresh()
        else:
            counts = verdict_counts([f.verdict.value for f in findings])
            self.console.print(f"  [bold]{check_id}[/] done: {counts}", highlight=False)
