"""Checks that look at a few samples draw them seeded and stratified by label, never "the first n".

A folder sorted by class puts one class first: a check that took the first n would test one class
only (issue 13). The target records the colour class of every image it is shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from mmchaos.checks import REGISTRY
from mmchaos.checks.base import CheckContext
from mmchaos.data.base import Dataset
from tests.fakes.colour import COLOURS, ColourTarget, colour_dataset


class RecordingColour(ColourTarget):
    """The robust colour classifier, remembering which colour classes it was shown."""

    def __init__(self) -> None:
        super().__init__(gain=0.0)
        self.seen: set[str] = set()

    def embed_images(self, images: Sequence[np.ndarray]) -> np.ndarray:
        for image in images:
            mean = np.asarray(image, np.float64).reshape(-1, 3).mean(axis=0)
            self.seen.add(min(COLOURS, key=lambda c: float(np.abs(np.subtract(COLOURS[c], mean)).sum())))
        return super().embed_images(images)


def _sorted_by_class() -> Dataset:
    data = colour_dataset(24)
    return Dataset(
        data.name, sorted(data.samples, key=lambda s: str(s.label)), list(data.classes), data.prompt_template
    )


@pytest.mark.parametrize(
    ("check", "params"),
    [
        ("thread_safety", {"samples": 6, "threads": 2, "calls_per_thread": 1}),
        ("determinism", {"samples": 6, "cross_process": False}),
        ("adversarial_whitebox", {"samples": 6, "eps": [2], "steps": 1, "masking_queries": 2}),
        ("adversarial_blackbox", {"samples": 6, "eps": [4], "queries_per_sample": 2, "max_queries": 20}),
    ],
)
def test_a_check_samples_every_class_of_a_sorted_dataset(check: str, params: dict[str, Any]) -> None:
    data = _sorted_by_class()
    assert {s.label for s in data.samples[:6]} == {"blue"}, "the first six are one class"
    target = RecordingColour()
    cls = REGISTRY.get(check)
    instance = cls(cls.Params.model_validate(params))
    list(instance.run(CheckContext(target=target, dataset=data, seed=0, check_id=check)))
    assert target.seen == set(COLOURS), f"{check} saw {sorted(target.seen)} of a sorted dataset"
