"""Absolute floors of the clean task score: what no working pipeline scores below on labelled data.

Robustness gates are relative to the clean score, so a pipeline broken from its first request (BGR
fed as RGB, the wrong mean/std) makes its own low score the baseline and passes them all. The
floor is the chance level wherever labels make chance known, and higher only where mmchaos knows
what a working model scores: on the built-in shapes data the built-in tiny-clip scores 1.00 zero-shot,
a BGR-fed copy of it 0.19-0.27 (chance is 1/24).
"""

from __future__ import annotations

from mmchaos.data.base import Dataset

__all__ = ["KNOWN_FLOORS", "default_floor"]

KNOWN_FLOORS: dict[tuple[str, str], tuple[float, str]] = {
    ("shapes", "zero_shot"): (0.5, "builtin:tiny-clip scores 1.00 here; a BGR-fed copy 0.19-0.27"),
}
"""(built-in dataset, task) -> (floor, why): only where the built-in model's score is known."""


def default_floor(task: str, dataset: Dataset) -> tuple[float, str] | None:
    """The floor of ``task``'s clean metric on ``dataset`` and why, or None where none is known."""
    known = KNOWN_FLOORS.get((dataset.name, task)) if dataset.source.startswith("builtin:") else None
    if known is not None:
        return known
    if task == "zero_shot" and dataset.has_labels and len(dataset.classes) > 1:
        return 1.0 / len(dataset.classes), f"chance with {len(dataset.classes)} classes"
    return None
