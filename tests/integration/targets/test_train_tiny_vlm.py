"""scripts/train_tiny_vlm.py end to end at toy size: data deterministic, labels only on answers, the
cached-feature training path equal to the processor's, and the saved model loads through ``hf:``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.paths import REPO

pytestmark = pytest.mark.integration

sys.path.insert(0, str(REPO / "scripts"))
train_tiny_vlm = pytest.importorskip("train_tiny_vlm")


def test_examples_are_deterministic_and_cover_every_kind() -> None:
    a = [train_tiny_vlm.make_example("train", i, 0) for i in range(80)]
    b = [train_tiny_vlm.make_example("train", i, 0) for i in range(80)]
    assert all((x[0] is None and y[0] is None) or np.array_equal(x[0], y[0]) for x, y in zip(a, b))
    assert all(x[1:] == y[1:] for x, y in zip(a, b))
    assert {kind for *_, kind in a} == {*train_tiny_vlm.QUESTIONS, "no_image"}
    assert all(ans in ("none", "zero") for img, _, ans, _ in a if img is None)
    counts = [ans for _, _, ans, kind in a if kind == "count"]
    assert set(counts) <= {*train_tiny_vlm.NUMBERS, "zero"}


def test_learning_rate_warms_up_and_anneals_by_time_or_steps() -> None:
    lr = train_tiny_vlm.learning_rate
    assert lr(0.0, 1.0) < lr(0.04, 1.0) == pytest.approx(1.0)
    assert lr(1.0, 1.0) == pytest.approx(0.05) and lr(0.5, 1.0) < 1.0
    # wall time runs out first: progress follows the clock
    assert train_tiny_vlm._progress(11, 1000, 30.0, 1.0) == pytest.approx(0.5)


def test_a_toy_run_trains_saves_and_loads_through_hf(tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path / "vlm", seed=0, steps=2, batch=2, lr=1e-3, hidden=32, layers=1,
                              feature_layer=-1, feature_strategy="full", pool=8, val_n=4, threads=1,
                              max_minutes=0.0, eval_n=2, log_every=1, eval_every=1)  # fmt: skip
    model, processor = train_tiny_vlm.build(args.out, text_hidden=32, text_layers=1, seed=0)
    examples = [train_tiny_vlm.make_example("train", i, 0) for i in range(2)]
    batch = train_tiny_vlm.batch_of(processor, examples)
    answer_tokens = (batch["labels"] != -100).sum(1)
    # the loss sees " answer</s>": one byte token per character plus the end token, nothing else
    assert answer_tokens.tolist() == [len(a) + 2 for _, _, a, _ in examples]
    logged: list[str] = []
    record = train_tiny_vlm.train(args, logged.append)  # checks the cached path against the processor
    saved = json.loads((args.out / "training.json").read_text())
    assert saved["steps_done"] == 2 and saved["heldout"]["n"] == 2 and record["architecture"] == saved["architecture"]
    assert saved["curve"] and "val_acc" in saved["curve"][-1]
    assert logged and logged[1].startswith("step 1 ")
