"""Rich progress bars behind the library's ProgressSink protocol."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["RichProgress"]


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
        self.progress = Progress(
            TextColumn("[bold blue]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def task(self, description: str, total: int) -> _RichTask:
        return _RichTask(self.progress, self.progress.add_task(description, total=total))
