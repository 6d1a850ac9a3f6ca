#!/usr/bin/env python
"""Train ``builtin:tiny-vlm`` from scratch on CPU: a genuine LLaVA-architecture VLM that answers
questions about the built-in ``shapes`` data (colour, shape, position, count).

Everything is built here, nothing is downloaded:

* the vision tower is the trained ``builtin:tiny-clip`` vision transformer (64x64 inputs, 16x16
  patches: 16 image tokens after dropping CLS), frozen by default;
* a tiny Llama language model and a 2-layer projector, initialised at random;
* a byte-level tokenizer with ``<image>``, ``<s>``, ``</s>``, ``<pad>``
  (:func:`mmchaos.targets.tiny_vlms.byte_tokenizer`), a LLaVA-style chat template, and
  tiny-clip's own ``CLIPImageProcessor``, wrapped in a real ``LlavaProcessor``, so the image
  placeholder expansion and the chat template are transformers' code paths;

trained with teacher forcing (loss on the answer tokens only) on the ``train`` split plus composed
multi-shape images for counting. Held-out accuracy is measured after a fresh load from disk
through ``load_target("hf:...")`` with greedy decoding, per question kind, and recorded with the
seed, steps, wall time and versions in ``training.json``.

Usage::

    python scripts/train_tiny_vlm.py --out /tmp/tiny-vlm                 # full run (defaults)
    nice -n 19 python scripts/train_tiny_vlm.py --out /tmp/tiny-vlm --max-minutes 3 --eval-n 48
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared cores: no spinning OpenMP workers

REPO = Path(__file__).resolve().parents[1]
try:  # the package may not be installed yet: fall back to the repo's src/
    import mmchaos  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402
import transformers  # noqa: E402

from mmchaos.data.shapes import BACKGROUNDS, COLOURS, SHAPES, make_sample, render_shape  # noqa: E402
from mmchaos.targets.builtin import TINY_CLIP_DIR  # noqa: E402
from mmchaos.targets.tiny_vlms import byte_tokenizer, chat_template  # noqa: E402

QUESTIONS: dict[str, tuple[str, ...]] = {
    "colour": ("What colour is the shape?", "Which colour is it?", "What is the colour of the object?"),
    "shape": ("What shape is it?", "Which shape is shown?", "What is the object?"),
    "position": ("Where is the shape?", "Where in the image is the object?"),
    "count": ("How many shapes are there?", "How many objects do you see?"),
}
NUMBERS = ("one", "two", "three", "four")
TEMPLATE = chat_template({"system": "", "user": "USER: ", "assistant": "ASSISTANT: "}, "<image>\n", "</s>",
                         "ASSISTANT:")  # fmt: skip


def counting_sample(rng: np.random.Generator, size: int = 64) -> tuple[np.ndarray, str]:
    """1-4 shapes, one per quadrant of a shared background; the answer is the count as a word."""
    bg = BACKGROUNDS[list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]]
    image = np.empty((size, size, 3), np.uint8)
    image[:] = bg
    n = int(rng.integers(1, 5))
    half = size // 2
    for q in rng.choice(4, size=n, replace=False):
        colour = COLOURS[list(COLOURS)[int(rng.integers(len(COLOURS)))]]
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        tile = render_shape(shape, colour, bg, float(rng.uniform(0.55, 0.75)), (0.5, 0.5), half, 0.0, rng)
        r, c = divmod(int(q), 2)
        image[r * half : (r + 1) * half, c * half : (c + 1) * half] = tile
    return image, NUMBERS[n - 1]


def make_example(split: str, index: int, seed: int) -> tuple[np.ndarray, str, str, str]:
    """(image, question, answer, kind) number ``index`` of ``split``: deterministic by seed."""
    rng = np.random.default_rng([seed, 7, {"train": 0, "test": 1}[split], index])
    kind = list(QUESTIONS)[int(rng.integers(len(QUESTIONS)))]
    question = QUESTIONS[kind][int(rng.integers(len(QUESTIONS[kind])))]
    if kind == "count":
        image, answer = counting_sample(rng)
    else:
        sample = make_sample(seed, split, index)
        image, answer = sample.load_image(), str(sample.meta[kind])
    return image, question, answer, kind


def build(out: Path, *, text_hidden: int, text_layers: int, seed: int) -> tuple[Any, Any]:
    """The untrained model and processor (the vision tower copied from tiny-clip)."""
    torch.manual_seed(seed)
    tok = byte_tokenizer(["<image>"], bos="<s>", eos="</s>", pad="<pad>")
    ids = tok.convert_tokens_to_ids
    clip = transformers.CLIPModel.from_pretrained(str(TINY_CLIP_DIR))
    text = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=text_hidden, intermediate_size=4 * text_hidden,
        num_hidden_layers=text_layers, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        bos_token_id=ids("<s>"), eos_token_id=ids("</s>"), pad_token_id=ids("<pad>"), tie_word_embeddings=True,
    )  # fmt: skip
    config = transformers.LlavaConfig(
        vision_config=clip.config.vision_config, text_config=text, image_token_index=ids("<image>"),
        vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
    )  # fmt: skip
    config.pad_token_id = ids("<pad>")
    model = transformers.LlavaForConditionalGeneration(config)
    missing = model.model.vision_tower.load_state_dict(clip.vision_model.state_dict())
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    image_processor = transformers.AutoImageProcessor.from_pretrained(str(TINY_CLIP_DIR))
    processor = transformers.LlavaProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=clip.config.vision_config.patch_size,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, chat_template=TEMPLATE,
    )  # fmt: skip
    return model, processor


def prompt_of(processor: Any, question: str) -> str:
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return str(processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))


def batch_of(processor: Any, examples: list[tuple[np.ndarray, str, str, str]]) -> dict[str, Any]:
    """Teacher-forcing inputs; labels are -100 except on the answer and its end token."""
    prompts = [prompt_of(processor, q) for _, q, _, _ in examples]
    fulls = [p + " " + a + "</s>" for p, (_, _, a, _) in zip(prompts, examples, strict=True)]
    images = [[img] for img, _, _, _ in examples]
    processor.tokenizer.padding_side = "right"
    enc = processor(text=fulls, images=images, return_tensors="pt", padding=True)
    prompt_lens = processor(text=prompts, images=images, return_tensors="pt", padding=True)["attention_mask"].sum(1)
    labels = enc["input_ids"].clone()
    labels[enc["attention_mask"] == 0] = -100
    for row, n in enumerate(prompt_lens.tolist()):
        labels[row, :n] = -100
    enc["labels"] = labels
    return dict(enc)


def evaluate(model_dir: Path, n: int, seed: int) -> dict[str, Any]:
    """Greedy exact-match accuracy per question kind on held-out examples, loaded fresh from disk."""
    from mmchaos.targets import load_target
    from mmchaos.targets.generation import GenerationParams

    target = load_target(f"hf:{model_dir}")
    hits: dict[str, list[bool]] = {k: [] for k in QUESTIONS}
    params = GenerationParams(max_new_tokens=16, logprobs=False)
    for i in range(n):
        image, question, answer, kind = make_example("test", i, seed)
        got = target.generate(question, [image], params).text.strip().lower()
        hits[kind].append(got == answer)
    per_kind = {k: float(np.mean(v)) if v else None for k, v in hits.items()}
    overall = float(np.mean([h for v in hits.values() for h in v]))
    return {"vqa_accuracy": overall, "per_kind": per_kind, "n": n}


def train(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model, processor = build(args.out, text_hidden=args.hidden, text_layers=args.layers, seed=args.seed)
    if not args.train_vision:
        model.model.vision_tower.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    start = time.monotonic()
    model.train()
    losses: list[float] = []
    step = 0
    for step in range(1, args.steps + 1):
        examples = [make_example("train", (step - 1) * args.batch + j, args.seed) for j in range(args.batch)]
        loss = model(**batch_of(processor, examples)).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optim.step()
        sched.step()
        losses.append(loss.item())
        if step % args.log_every == 0 or step == 1:
            log(f"step {step}/{args.steps} loss {np.mean(losses[-args.log_every:]):.4f} "
                f"{time.monotonic() - start:.0f}s")  # fmt: skip
        if args.max_minutes and time.monotonic() - start > 60 * args.max_minutes:
            log(f"stopping at step {step}: --max-minutes {args.max_minutes} reached")
            break
    wall = time.monotonic() - start
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    processor.save_pretrained(args.out)
    metrics = evaluate(args.out, args.eval_n, args.seed)
    record = {
        "model": "builtin:tiny-vlm",
        "architecture": "LlavaForConditionalGeneration",
        "vision_tower": "builtin:tiny-clip vision_model" + ("" if args.train_vision else " (frozen)"),
        "data": "builtin:shapes train split (colour, shape, position) + composed 1-4 shape images (count)",
        "seed": args.seed,
        "steps_planned": args.steps,
        "steps_done": step,
        "batch": args.batch,
        "lr": args.lr,
        "text": {"hidden": args.hidden, "layers": args.layers},
        "train_wall_s": round(wall, 1),
        "final_loss": float(np.mean(losses[-50:])),
        "heldout": metrics,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "command": " ".join(sys.argv),
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-vision", action="store_true", help="fine-tune the tiny-clip tower too")
    parser.add_argument("--max-minutes", type=float, default=0.0, help="stop training after this long (0: never)")
    parser.add_argument("--eval-n", type=int, default=400)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args(argv)
    record = train(args, lambda line: print(line, flush=True))
    print(json.dumps({k: record[k] for k in ("steps_done", "train_wall_s", "final_loss", "heldout")}, indent=2))


if __name__ == "__main__":
    main()
