"""Deployments of the built-in tiny VLM with one generation setting shipped wrong, as a serving image,
an export or a hand-edited repository ships them: the same weights, one file changed.

Each builder copies ``builtin:tiny-vlm``'s directory to ``dst`` and changes only that file, so the
real loader, processor and ``generate`` meet the bug exactly as a user's deployment would:

- ``right_padding``: ``tokenizer_config.json`` saved with ``padding_side: right`` (transformers'
  default for many tokenizers; the LLaVA-NeXT padding-side bug class);
- ``wrong_eos``: ``generation_config.json`` names an EOS id the model never emits, so ``generate``
  runs on to ``max_new_tokens`` (``eos`` picks the id or list written);
- ``chat_template``: a served ``chat_template.jinja`` with other role tags (``Human:``/``Assistant:``);
- ``fp16``: the weights downcast to float16 and saved so (``config.json`` ``dtype: float16``): the
  served copy runs in half precision, as a server that defaults to fp16 runs an fp32 checkpoint.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from mmchaos.targets.builtin import TINY_VLM_DIR
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget

__all__ = ["WRONG_EOS", "Edit", "ShippedVLMs", "shipped_copy"]

Edit = Literal["none", "right_padding", "wrong_eos", "chat_template", "fp16"]

WRONG_EOS = 0
"""The EOS id ``wrong_eos`` writes: a byte token the trained tiny VLM never ends an answer with."""


def _edit_json(path: Path, **values: Any) -> None:
    data = json.loads(path.read_text())
    data.update(values)
    path.write_text(json.dumps(data, indent=2))


def shipped_copy(dst: Path, edit: Edit, *, eos: int | list[int] = WRONG_EOS) -> Path:
    """A copy of the built-in tiny VLM at ``dst`` with ``edit`` applied (``none``: an exact copy)."""
    shutil.copytree(TINY_VLM_DIR, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("training.json"))
    if edit == "right_padding":
        _edit_json(dst / "tokenizer_config.json", padding_side="right")
    elif edit == "wrong_eos":
        _edit_json(dst / "generation_config.json", eos_token_id=eos)
    elif edit == "chat_template":
        path = dst / "chat_template.jinja"
        path.write_text(path.read_text().replace('"USER: "', '"Human: "').replace('"ASSISTANT:"', '"Assistant:"'))
    elif edit == "fp16":
        import torch
        from safetensors.torch import load_file, save_file

        weights = load_file(str(dst / "model.safetensors"))
        save_file({k: v.to(torch.float16) for k, v in weights.items()}, str(dst / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
        _edit_json(dst / "config.json", dtype="float16")
    return dst


class ShippedVLMs:
    """Loads one ``hf:`` copy per edit on first use (for a module fixture), and closes them all."""

    def __init__(self, mktemp: Callable[[str], Path]) -> None:
        self._mktemp = mktemp
        self._loaded: dict[str, HFVisionLanguageTarget] = {}

    def __call__(self, edit: Edit) -> HFVisionLanguageTarget:
        if edit not in self._loaded:
            from mmchaos.targets import load_target

            target = load_target(f"hf:{shipped_copy(self._mktemp(edit), edit)}")
            assert isinstance(target, HFVisionLanguageTarget)
            self._loaded[edit] = target
        return self._loaded[edit]

    def close(self) -> None:
        for target in self._loaded.values():
            target.close()
