"""Broken twins of :class:`~mmchaos.targets.hf_steps.StepBatch`: what the step-by-step decoding
tests (the model half, tests/integration/targets/test_hf_steps.py, and the server's engine,
tests/integration/server/test_server_continuous.py) must catch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmchaos.targets.hf_steps import StepBatch

__all__ = ["ColumnPositions"]


class ColumnPositions(StepBatch):
    """BROKEN twin: positions by the padded batch's columns, so a left-padded row's rotary
    positions start at its padding (what a naive KV merge does)."""

    @staticmethod
    def positions(mask: Any) -> Any:
        import torch

        return torch.arange(mask.shape[1]).expand_as(mask)

    def step(self, tokens: Sequence[int]) -> Any:
        import torch

        self.next_pos = torch.full((len(self),), self.columns)
        return super().step(tokens)
