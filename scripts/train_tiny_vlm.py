#!/usr/bin/env python
"""Train ``builtin:tiny-vlm`` from scratch on CPU: a genuine LLaVA-architecture VLM that answers
questions about the built-in ``vqa`` data (colour, shape, position, count; abstains on empty images).

Everything is built here, nothing is downloaded:

* the vision tower is the trained ``builtin:tiny-clip`` vision transformer (64x64 inputs, 16x16
  patches: 16 image tokens after dropping CLS), frozen;
* a tiny Llama language model and a 2-layer projector, initialised at random;
* a byte-level tokenizer with ``<image>``, ``<s>``, ``</s>``, ``<pad>``
  (:func:`mmchaos.targets.tiny_vlms.byte_tokenizer`), a LLaVA-style chat template, and
  tiny-clip's own ``CLIPImageProcessor``, wrapped in a real ``LlavaProcessor``, so the image
  placeholder expansion and the chat template are transformers' code paths at inference.

Why it is fast on two cores: the tower is frozen, so its features are computed once for a pool of
training images (through the processor's own image preprocessing) and the training steps run only
the projector and the language model, with the loss on the answer tokens. The prompt token ids are
the processor's own (checked against ``LlavaProcessor`` at start). A share of the examples are
questions with no image at all, answered ``none``/``zero``, as are the empty images of the data:
the model learns to abstain rather than describe what is not there.

Held-out accuracy is measured after a fresh load from disk through ``load_target("hf:...")`` with
greedy decoding and the ``vqa`` task (per question kind), and recorded with the seed, steps, wall
time, the teacher-forced accuracy curve and versions in ``training.json``.

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

from mmchaos.data.vqa import KINDS, NONE_ANSWERS, NUMBERS, QUESTIONS, make_vqa, make_vqa_sample  # noqa: E402
from mmchaos.targets.builtin import TINY_CLIP_DIR  # noqa: E402
from mmchaos.targets.tiny_vlms import byte_tokenizer, chat_template, pad_left  # noqa: E402

__all__ = ["NUMBERS", "QUESTIONS", "batch_of", "build", "evaluate", "make_example", "prepare", "train"]

TEMPLATE = chat_template({"system": "", "user": "USER: ", "assistant": "ASSISTANT: "}, "<image>\n", "</s>",
                         "ASSISTANT:")  # fmt: skip
NO_IMAGE_SHARE = 0.05
Example = tuple[np.ndarray | None, str, str, str]


def make_example(split: str, index: int, seed: int) -> Example:
    """(image or None, question, answer, kind) number ``index`` of ``split``: deterministic by seed.

    Mostly the ``vqa`` sample of the same index; a few are the question alone (kind ``no_image``),
    whose answer is the none-class answer of its kind.
    """
    rng = np.random.default_rng([seed, 11, {"train": 0, "test": 1, "val": 2}[split], index])
    if rng.random() < NO_IMAGE_SHARE:
        kind = KINDS[int(rng.integers(len(KINDS)))]
        return None, QUESTIONS[kind][int(rng.integers(len(QUESTIONS[kind])))], NONE_ANSWERS[kind], "no_image"
    s = make_vqa_sample(seed, split, index)
    return s.load_image(), s.question or "", s.answer or "", str(s.meta["kind"])


def build(
    out: Path, *, text_hidden: int, text_layers: int, seed: int, feature_layer: int = -2, strategy: str = "default"
) -> tuple[Any, Any]:
    """The untrained model and processor (the vision tower copied from tiny-clip). ``strategy`` is
    LLaVA's feature selection: ``default`` drops the tower's CLS token, ``full`` keeps it."""
    torch.manual_seed(seed)
    tok = byte_tokenizer(["<image>"], bos="<s>", eos="</s>", pad="<pad>")
    ids = tok.convert_tokens_to_ids
    clip = transformers.CLIPModel.from_pretrained(str(TINY_CLIP_DIR))
    text = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=text_hidden, intermediate_size=4 * text_hidden,
        num_hidden_layers=text_layers, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        bos_token_id=ids("<s>"), eos_token_id=ids("</s>"), pad_token_id=ids("<pad>"), tie_word_embeddings=True,
    )  # fmt: skip
    config = transformers.LlavaConfig(
        vision_config=clip.config.vision_config, text_config=text, image_token_index=ids("<image>"),
        vision_feature_layer=feature_layer, vision_feature_select_strategy=strategy, projector_hidden_act="gelu",
    )  # fmt: skip
    config.pad_token_id = ids("<pad>")
    model = transformers.LlavaForConditionalGeneration(config)
    missing = model.model.vision_tower.load_state_dict(clip.vision_model.state_dict())
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    image_processor = transformers.AutoImageProcessor.from_pretrained(str(TINY_CLIP_DIR))
    processor = transformers.LlavaProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=clip.config.vision_config.patch_size,
        vision_feature_select_strategy=strategy, num_additional_image_tokens=1, chat_template=TEMPLATE,
    )  # fmt: skip
    return model, processor


def prompt_of(processor: Any, question: str, with_image: bool) -> str:
    content = [{"type": "image"}] if with_image else []
    chat = [{"role": "user", "content": [*content, {"type": "text", "text": question}]}]
    return str(processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))


def batch_of(processor: Any, examples: list[Example]) -> dict[str, Any]:
    """Teacher-forcing inputs through the processor (images expanded to their tokens); labels are
    -100 except on the answer and its end token. Used to check :func:`prepare` against."""
    prompts = [prompt_of(processor, q, img is not None) for img, q, _, _ in examples]
    fulls = [p + " " + a + "</s>" for p, (_, _, a, _) in zip(prompts, examples, strict=True)]
    images = [img for img, _, _, _ in examples if img is not None]
    # Teacher forcing pads on the right (labels line up with the prompt); the saved tokenizer keeps
    # the left padding generation needs, so only this call pads right.
    kwargs: dict[str, Any] = {"return_tensors": "pt", "padding": True, "padding_side": "right"}
    if images:
        kwargs["images"] = images
    enc = processor(text=fulls, **kwargs)
    prompt_lens = processor(text=prompts, **kwargs)["attention_mask"].sum(1)
    labels = enc["input_ids"].clone()
    labels[enc["attention_mask"] == 0] = -100
    for row, n in enumerate(prompt_lens.tolist()):
        labels[row, :n] = -100
    enc["labels"] = labels
    return dict(enc)


class Pool:
    """Training examples as the model sees them: token ids (image placeholders expanded), the
    number of prompt tokens, and the frozen tower's features of each image (computed once)."""

    def __init__(self, ids: list[list[int]], prompt_lens: list[int], feats: torch.Tensor, feat_row: list[int],
                 kinds: list[str]) -> None:  # fmt: skip
        self.ids, self.prompt_lens, self.feats, self.feat_row, self.kinds = ids, prompt_lens, feats, feat_row, kinds

    def __len__(self) -> int:
        return len(self.ids)


def _features(model: Any, processor: Any, images: list[np.ndarray], chunk: int = 256) -> torch.Tensor:
    """The tower's selected hidden states for each image, as LLaVA selects them."""
    layer = model.config.vision_feature_layer
    first = 1 if model.config.vision_feature_select_strategy == "default" else 0
    out = []
    with torch.inference_mode():
        for i in range(0, len(images), chunk):
            pixels = processor.image_processor(images=images[i : i + chunk], return_tensors="pt")["pixel_values"]
            hidden = model.model.vision_tower(pixels, output_hidden_states=True).hidden_states
            out.append(hidden[layer][:, first:].clone())
    return torch.cat(out) if out else torch.zeros(0)


def prepare(model: Any, processor: Any, examples: list[Example]) -> Pool:
    """Tokenise (cached per question) and compute the frozen features of every image once."""
    tok = processor.tokenizer
    image_token = processor.image_token
    side = model.config.vision_config.image_size // model.config.vision_config.patch_size
    per_image = side * side + (model.config.vision_feature_select_strategy == "full")
    prompt_cache: dict[tuple[str, bool], list[int]] = {}
    ids, prompt_lens, feat_row, kinds, images = [], [], [], [], []
    for img, question, answer, kind in examples:
        key = (question, img is not None)
        if key not in prompt_cache:
            text = prompt_of(processor, question, img is not None).replace(image_token, image_token * per_image)
            prompt_cache[key] = tok(text, add_special_tokens=False)["input_ids"]
        prompt = prompt_cache[key]
        ids.append(prompt + tok(" " + answer + "</s>", add_special_tokens=False)["input_ids"])
        prompt_lens.append(len(prompt))
        feat_row.append(len(images) if img is not None else -1)
        kinds.append(kind)
        if img is not None:
            images.append(img)
    return Pool(ids, prompt_lens, _features(model, processor, images), feat_row, kinds)


def _tensors(pool: Pool, rows: list[int], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    width = max(len(pool.ids[r]) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        seq = pool.ids[r]
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, pool.prompt_lens[r] : len(seq)] = torch.tensor(seq[pool.prompt_lens[r] :])
    return ids, mask, labels, [pool.feat_row[r] for r in rows if pool.feat_row[r] >= 0]


def forward(model: Any, pool: Pool, rows: list[int], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-row answer fully right) with teacher forcing: the projector and language model
    run on the cached tower features, exactly as LLaVA's forward places them."""
    ids, mask, labels, feat_rows = _tensors(pool, rows, pad)
    embeds = model.get_input_embeddings()(ids)
    if feat_rows:
        image_features = model.model.multi_modal_projector(pool.feats[feat_rows])
        placeholder = (ids == model.config.image_token_id).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(placeholder, image_features.to(embeds.dtype))
    hidden = model.model.language_model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    target = labels[:, 1:]
    chosen = target != -100
    logits = model.lm_head(hidden[:, :-1][chosen])
    loss = torch.nn.functional.cross_entropy(logits, target[chosen])
    hit = torch.ones_like(target, dtype=torch.bool)
    hit[chosen] = logits.argmax(-1) == target[chosen]
    return loss, hit.all(dim=1)


def evaluate(model_dir: Path, n: int, seed: int) -> dict[str, Any]:
    """Greedy held-out accuracy per question kind through ``hf:`` and the vqa task, plus how often
    the model abstains when there is no image at all."""
    from mmchaos.targets import load_target
    from mmchaos.targets.generation import GenerationParams
    from mmchaos.tasks.answers import is_abstention
    from mmchaos.tasks.generative import VQAAccuracy, ask

    target = load_target(f"hf:{model_dir}")
    result = VQAAccuracy(batch_size=50).evaluate(target, make_vqa(n, seed=seed, split="test"))
    questions = [q for qs in QUESTIONS.values() for q in qs]
    no_image = ask(target, questions, [None] * len(questions), GenerationParams(max_new_tokens=16), 16)
    per_kind = {k.removeprefix("accuracy_"): v for k, v in result.extra.items() if k.startswith("accuracy_")}
    return {
        "vqa_accuracy": result.metric,
        "exact_match": result.extra["exact_match"],
        "per_kind": per_kind,
        "n": n,
        "no_image_abstention": float(np.mean([is_abstention(a) for a in no_image])),
        "task": "vqa (normalised match), builtin:vqa split=test",
    }


def train(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    begin = time.monotonic()
    model, processor = build(args.out, text_hidden=args.hidden, text_layers=args.layers, seed=args.seed,
                             feature_layer=args.feature_layer, strategy=args.feature_strategy)  # fmt: skip
    model.model.vision_tower.requires_grad_(False)
    pad = processor.tokenizer.pad_token_id
    pool = prepare(model, processor, [make_example("train", i, args.seed) for i in range(args.pool)])
    held = prepare(model, processor, [make_example("val", i, args.seed) for i in range(args.val_n)])
    _check_against_processor(model, processor, args.seed, pool, pad)
    log(f"prepared {len(pool)} training and {len(held)} validation examples in {time.monotonic() - begin:.0f}s")
    trainable = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)
    rng = np.random.default_rng(args.seed)
    order: list[int] = []
    start = time.monotonic()
    losses: list[float] = []
    curve: list[dict[str, float]] = []
    step = 0
    for step in range(1, args.steps + 1):
        model.train()
        if len(order) < args.batch:
            order += rng.permutation(len(pool)).tolist()
        rows, order = order[: args.batch], order[args.batch :]
        progress = _progress(step, args.steps, time.monotonic() - start, args.max_minutes)
        for group in optim.param_groups:
            group["lr"] = learning_rate(progress, args.lr)
        loss, _ = forward(model, pool, rows, pad)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optim.step()
        losses.append(loss.item())
        last = _progress(step + 1, args.steps, time.monotonic() - start, args.max_minutes) >= 1.0
        if step % args.log_every == 0 or step == 1 or last:
            point = {"step": step, "seconds": round(time.monotonic() - start, 1),
                     "loss": float(np.mean(losses[-args.log_every :]))}  # fmt: skip
            if step % args.eval_every == 0 or last:
                point.update(_teacher_forced(model, held, pad))
            curve.append(point)
            log(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in point.items()))
        if last and step < args.steps:
            log(f"schedule ended at step {step}: --max-minutes {args.max_minutes} reached")
        if last:
            break
    wall = time.monotonic() - start
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    processor.save_pretrained(args.out)
    pad_left(args.out)  # generation batches pad left; the teacher-forcing call above pads right itself
    metrics = evaluate(args.out, args.eval_n, args.seed)
    total = time.monotonic() - begin
    record = {
        "model": "builtin:tiny-vlm",
        "architecture": "LlavaForConditionalGeneration",
        "vision_tower": f"builtin:tiny-clip vision_model (frozen), features of layer {args.feature_layer}, "
        f"select strategy {args.feature_strategy} ({'CLS kept' if args.feature_strategy == 'full' else 'CLS dropped'})",
        "data": f"builtin:vqa split=train seed={args.seed}: {args.pool} examples ({NO_IMAGE_SHARE:.0%} "
        "questions without an image, answered none/zero)",
        "seed": args.seed,
        "steps_planned": args.steps,
        "steps_done": step,
        "batch": args.batch,
        "lr": args.lr,
        "schedule": "linear warm-up 4%, cosine to 5% of lr, over max(step/steps, wall/max_minutes)",
        "text": {"hidden": args.hidden, "layers": args.layers},
        "threads": args.threads,
        "machine": {"cpu_count": os.cpu_count(), "niceness": os.nice(0), "platform": platform.platform()},
        "prepare_wall_s": round(start - begin, 1),
        "train_wall_s": round(wall, 1),
        "total_wall_s": round(total, 1),
        "final_loss": float(np.mean(losses[-50:])),
        "curve": curve,
        "heldout": metrics,
        "textline_reading": "not trained (no textline questions in the data)",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "command": " ".join(["scripts/train_tiny_vlm.py", *sys.argv[1:]]),
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _progress(step: int, steps: int, elapsed_s: float, max_minutes: float) -> float:
    """How far through training: by steps, or by wall time when that runs out first."""
    by_time = elapsed_s / (60 * max_minutes) if max_minutes else 0.0
    return max((step - 1) / max(1, steps), by_time)


def learning_rate(progress: float, peak: float, warmup: float = 0.04) -> float:
    """Linear warm-up then cosine decay to 5% of ``peak``, over progress in [0, 1]. Driven by
    :func:`_progress`, the schedule anneals by the time budget even on a slow, shared machine."""
    if progress < warmup:
        return peak * (0.1 + 0.9 * progress / warmup)
    t = min(1.0, (progress - warmup) / (1 - warmup))
    return peak * (0.05 + 0.95 * 0.5 * (1 + float(np.cos(np.pi * t))))


def _teacher_forced(model: Any, pool: Pool, pad: int, batch: int = 128) -> dict[str, float]:
    """Share of validation answers whose every token is the argmax (cheap proxy of greedy accuracy)."""
    model.eval()
    hits: list[bool] = []
    with torch.inference_mode():
        for i in range(0, len(pool), batch):
            hits += forward(model, pool, list(range(i, min(len(pool), i + batch))), pad)[1].tolist()
    out = {"val_acc": float(np.mean(hits))}
    for kind in sorted(set(pool.kinds)):
        out[f"val_{kind}"] = float(np.mean([h for h, k in zip(hits, pool.kinds, strict=True) if k == kind]))
    return out


def _check_against_processor(model: Any, processor: Any, seed: int, pool: Pool, pad: int) -> None:
    """The cached path must be the processor's and the model's own: same ids, same features."""
    examples = [make_example("train", i, seed) for i in range(6)]
    enc = batch_of(processor, examples)
    for row in range(len(examples)):
        n = int(enc["attention_mask"][row].sum())
        assert enc["input_ids"][row, :n].tolist() == pool.ids[row], f"token ids differ from the processor's (row {row})"
    if "pixel_values" in enc:
        with torch.inference_mode():
            want = model.model.get_image_features(
                enc["pixel_values"], vision_feature_layer=model.config.vision_feature_layer,
                vision_feature_select_strategy=model.config.vision_feature_select_strategy,
            ).pooler_output  # fmt: skip
            rows = [pool.feat_row[r] for r in range(len(examples)) if pool.feat_row[r] >= 0]
            got = model.model.multi_modal_projector(pool.feats[rows])
        assert torch.allclose(torch.stack(list(want)), got, atol=1e-5), "cached features differ from LLaVA's"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--feature-layer", type=int, default=-1, help="tower layer LLaVA takes features from")
    parser.add_argument("--feature-strategy", choices=("default", "full"), default="full",
                        help="LLaVA's vision_feature_select_strategy: default drops CLS, full keeps it")  # fmt: skip
    parser.add_argument("--pool", type=int, default=16000, help="training examples (features cached once)")
    parser.add_argument("--val-n", type=int, default=512, help="validation examples for the teacher-forced curve")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: no OpenMP barriers on shared cores)")
    parser.add_argument("--max-minutes", type=float, default=16.0, help="training time budget (0: steps only)")
    parser.add_argument("--eval-n", type=int, default=400)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=250)
    args = parser.parse_args(argv)
    record = train(args, lambda line: print(line, flush=True))
    print(json.dumps({k: record[k] for k in ("steps_done", "train_wall_s", "final_loss", "heldout")}, indent=2))


if __name__ == "__main__":
    main()
