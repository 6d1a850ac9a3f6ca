"""scripts/train_tiny_vlm.py end to end at toy size: data deterministic, labels only on answers,
and the saved model loads through ``hf:`` and answers through the generative path."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
train_tiny_vlm = pytest.importorskip("train_tiny_vlm")


def test_examples_are_deterministic_and_cover_every_kind() -> None:
    a = [train_tiny_vlm.make_example("train", i, 0) for i in range(40)]
    b = [train_tiny_vlm.make_example("train", i, 0) for i in range(40)]
    assert all(np.array_equal(x[0], y[0]) and x[1:] == y[1:] for x, y in zip(a, b))
    assert {kind for *_, kind in a} == set(train_tiny_vlm.QUESTIONS)
    counts = [ans for _, _, ans, kind in a if kind == "count"]
    assert set(counts) <= set(train_tiny_vlm.NUMBERS)


def test_a_toy_run_trains_saves_and_loads_through_hf(tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path / "vlm", seed=0, steps=2, batch=2, lr=1e-3, hidden=32, layers=1,
                              threads=1, train_vision=False, max_minutes=0.0, eval_n=2, log_every=1)  # fmt: skip
    model, processor = train_tiny_vlm.build(args.out, text_hidden=32, text_layers=1, seed=0)
    batch = train_tiny_vlm.batch_of(processor, [train_tiny_vlm.make_example("train", i, 0) for i in range(2)])
    answer_tokens = (batch["labels"] != -100).sum(1)
    answers = [train_tiny_vlm.make_example("train", i, 0)[2] for i in range(2)]
    # the loss sees " answer</s>": one byte token per character plus the end token, nothing else
    assert answer_tokens.tolist() == [len(a) + 2 for a in answers]
    logged: list[str] = []
    record = train_tiny_vlm.train(args, logged.append)
    saved = json.loads((args.out / "training.json").read_text())
    assert saved["steps_done"] == 2 and saved["heldout"]["n"] == 2 and record["architecture"] == saved["architecture"]
    assert logged and logged[0].startswith("step 1/2")
