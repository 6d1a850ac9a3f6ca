#!/usr/bin/env python
"""Train the built-in ``builtin:tiny-clip`` model from scratch, reproducibly, on CPU.

Everything is built here, nothing is downloaded:

* a byte-level BPE CLIP tokenizer: the 256 byte-level symbols (alone and with ``</w>``) so any
  unicode text tokenizes without unknown tokens, plus merges learned from the caption corpus of
  the ``shapes`` dataset, plus ``<|startoftext|>`` / ``<|endoftext|>``;
* a ``CLIPImageProcessor`` for 64x64 inputs with the standard CLIP mean/std;
* a genuine ``transformers.CLIPModel`` with tiny text and vision towers,

trained with a symmetric InfoNCE loss (learnable logit scale) on the ``train`` split of the
built-in ``shapes`` dataset. Because many texts in a batch describe several images equally well
(a class prompt "a photo of a red circle." fits every red circle), the targets are soft: text ``j``
is a positive for image ``i`` iff every attribute the text mentions matches the image.

The result is saved in Hugging Face format (safetensors + tokenizer + processor) with a
``training.json`` that records the seed, steps, wall time, held-out metrics and versions. The
held-out metrics are measured on a fresh load from disk (``AutoProcessor`` + ``CLIPModel``).

Usage::

    python scripts/train_tiny_clip.py        # seed 0, 4000 steps -> src/mmchaos/models/tiny-clip
    python scripts/train_tiny_clip.py --seed 1 --steps 300 --out /tmp/tiny-clip --eval-every 100
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import platform
import string
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# Spinning OpenMP workers slow training several-fold when the 2 cores are shared with anything
# else; passive waiting costs little when they are not. (Must be set before torch is imported.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
try:  # the package may not be installed yet: fall back to the repo's src/
    import mmchaos  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mmchaos.data import shapes as shapes_mod  # noqa: E402
from mmchaos.data.shapes import BACKGROUNDS, CLASSES, COLOURS, SHAPES, SIZES, make_shapes  # noqa: E402

DEFAULT_OUT = REPO / "src" / "mmchaos" / "models" / "tiny-clip"
IMAGE_SIZE = 64
MAX_LEN = 32
PROMPT = "a photo of a {}."
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
BOS, EOS = "<|startoftext|>", "<|endoftext|>"

# Attributes a caption may mention, in a fixed order; codes index these value lists.
ATTRS: dict[str, list[str]] = {
    "colour": list(COLOURS),
    "shape": list(SHAPES),
    "size": list(SIZES),
    "bg": list(BACKGROUNDS),
    "pos": [
        "top left",
        "top center",
        "top right",
        "middle left",
        "center",
        "middle right",
        "bottom left",
        "bottom center",
        "bottom right",
    ],
}
ATTR_NAMES = list(ATTRS)
META_KEY = {"colour": "colour", "shape": "shape", "size": "size", "bg": "background", "pos": "position"}

# Extra caption templates mixed in with the dataset's own (short forms and the class prompt).
EXTRA_TEMPLATES = (
    "a photo of a {colour} {shape}.",
    "a photo of a {colour} {shape}.",
    "a {colour} {shape}",
    "{colour} {shape}",
    "a photo of a {size} {colour} {shape}.",
    "a {colour} {shape} on {bg}",
    "a {shape}",
    "a photo of a {shape}.",
    "a {colour} object",
)


# --------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------


def bytes_to_unicode() -> list[str]:
    """GPT-2/CLIP's reversible byte -> printable unicode map, as a list indexed by byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]


def learn_merges(word_counts: dict[str, int], max_merges: int) -> list[tuple[str, str]]:
    """Plain BPE merge learning (most frequent pair first, ties broken lexicographically).

    Words are byte-level strings; the last symbol of each word carries the ``</w>`` suffix,
    exactly as the ``tokenizers`` BPE model with ``end_of_word_suffix="</w>"`` splits them.
    """
    words = {w: [*w[:-1], w[-1] + "</w>"] for w in word_counts}
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges:
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for w, syms in words.items():
            for a, b in itertools.pairwise(syms):
                pairs[(a, b)] += word_counts[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        a, b = best
        for w, syms in words.items():
            i, out = 0, []
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[w] = out
    return merges


def build_tokenizer(corpus: list[str], max_merges: int = 400) -> Any:
    from transformers import CLIPTokenizer

    # Use CLIPTokenizer's own normalizer + pre-tokenizer so the learned merges match exactly.
    probe = CLIPTokenizer().backend_tokenizer
    counts: collections.Counter[str] = collections.Counter()
    for text in corpus:
        norm = probe.normalizer.normalize_str(text)
        counts.update(w for w, _ in probe.pre_tokenizer.pre_tokenize_str(norm))
    merges = learn_merges(dict(counts), max_merges)

    byte_syms = bytes_to_unicode()
    tokens = byte_syms + [s + "</w>" for s in byte_syms]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            tokens.append(a + b)
            seen.add(a + b)
    tokens += [BOS, EOS]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = CLIPTokenizer(
        vocab=vocab,
        merges=[(a, b) for a, b in merges],
        model_max_length=MAX_LEN,
    )
    tok.model_max_length = MAX_LEN
    return tok


def build_image_processor() -> Any:
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(
        do_resize=True,
        size={"shortest_edge": IMAGE_SIZE},
        resample=3,  # bicubic, as CLIP
        do_center_crop=True,
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(CLIP_MEAN),
        image_std=list(CLIP_STD),
        do_convert_rgb=True,
    )


def normalise_images(images: np.ndarray) -> torch.Tensor:
    """uint8 NxHxWx3 (already 64x64) -> float NCHW, identical to the CLIPImageProcessor output."""
    x = images.astype(np.float32) * np.float32(1 / 255)
    x = (x - np.asarray(CLIP_MEAN, np.float32)) / np.asarray(CLIP_STD, np.float32)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------


def build_model(tok: Any, args: argparse.Namespace) -> Any:
    from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, CLIPVisionConfig

    text = CLIPTextConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=256,
        projection_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_LEN,
        hidden_act="quick_gelu",
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,  # != 2, so CLIP pools at the first <|endoftext|>
        pad_token_id=tok.pad_token_id,
    )
    vision = CLIPVisionConfig(
        hidden_size=args.vision_hidden,
        intermediate_size=args.vision_mlp,
        projection_dim=64,
        num_hidden_layers=args.vision_layers,
        num_attention_heads=args.vision_heads,
        num_channels=3,
        image_size=IMAGE_SIZE,
        patch_size=args.patch_size,
        hidden_act="quick_gelu",
    )
    config = CLIPConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        projection_dim=64,
        logit_scale_init_value=math.log(1 / 0.07),
    )
    return CLIPModel(config)


def features(out: Any) -> torch.Tensor:
    """get_*_features returns a tensor in transformers 4, a BaseModelOutputWithPooling in 5."""
    if isinstance(out, torch.Tensor):
        return out
    return out.pooler_output


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------


def _template_fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


def _fill(template: str, vals: dict[str, str]) -> str:
    return template.format(**vals)


class CaptionSampler:
    """Draws a training text for a sample and the attribute codes that text pins down."""

    def __init__(self) -> None:
        own = tuple(shapes_mod._TEMPLATES)
        self.templates = own + EXTRA_TEMPLATES
        self.n_own = len(own)
        self.fields = [_template_fields(t) for t in self.templates]

    def codes_for(self, template_idx: int, attr_codes: np.ndarray) -> np.ndarray:
        mask = np.full(len(ATTR_NAMES), -1, dtype=np.int64)
        for f in self.fields[template_idx]:
            k = ATTR_NAMES.index(f)
            mask[k] = attr_codes[k]
        return mask

    def own_template(self, caption: str, vals: dict[str, str]) -> int:
        for i in range(self.n_own):
            if _fill(self.templates[i], vals) == caption:
                return i
        raise ValueError(f"caption not produced by any known template: {caption!r}")


def load_train(n: int, seed: int) -> dict[str, Any]:
    ds = make_shapes(n=n, seed=seed, split="train", image_size=IMAGE_SIZE)
    sampler = CaptionSampler()
    images = np.stack([s.image for s in ds.samples])
    codes = np.zeros((n, len(ATTR_NAMES)), dtype=np.int64)
    vals: list[dict[str, str]] = []
    own_idx = np.zeros(n, dtype=np.int64)
    for i, s in enumerate(ds.samples):
        v = {a: s.meta[META_KEY[a]] for a in ATTR_NAMES}
        vals.append(v)
        codes[i] = [ATTRS[a].index(v[a]) for a in ATTR_NAMES]
        own_idx[i] = sampler.own_template(s.caption or "", v)
    captions = [s.caption or "" for s in ds.samples]
    return {"images": images, "codes": codes, "vals": vals, "captions": captions, "own": own_idx}


def tokenizer_corpus(data: dict[str, Any]) -> list[str]:
    corpus = list(data["captions"])
    corpus += [PROMPT.format(c) for c in CLASSES] * 50
    sampler = CaptionSampler()
    for t in sampler.templates[sampler.n_own :]:
        corpus += [_fill(t, v) for v in data["vals"][:2000]]
    return corpus


SAVED_FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "processor_config.json",
    "preprocessor_config.json",
    "vocab.json",
    "merges.txt",
    "training.json",
}


def check_out_dir(out_dir: Path) -> None:
    if out_dir.exists():
        foreign = [p.name for p in out_dir.iterdir() if p.name not in SAVED_FILES]
        if foreign:
            raise SystemExit(f"refusing to overwrite {out_dir}: unexpected entries {sorted(foreign)}")


def prepare_out_dir(out_dir: Path) -> Path:
    """Create ``out_dir`` or clear the files a previous run wrote there; refuse anything else."""
    check_out_dir(out_dir)
    if out_dir.exists():
        for p in out_dir.iterdir():
            p.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def save_compat_files(out_dir: Path, tok: Any, image_processor: Any) -> None:
    """Files older transformers (4.x) look for: preprocessor_config.json, vocab.json, merges.txt.

    transformers 5 keeps the image processor inside processor_config.json and the tokenizer in
    tokenizer.json only; the classic files make the directory loadable by 4.x as well.
    """
    image_processor.save_pretrained(out_dir)  # preprocessor_config.json
    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    (out_dir / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False) + "\n")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    for f in out_dir.iterdir():  # safetensors writes 0600 files; ship them world-readable
        f.chmod(0o644)


# --------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model_dir: Path, n_test: int = 1000, n_retrieval: int = 500) -> dict[str, Any]:
    """Fresh load from disk; zero-shot accuracy and caption retrieval on the held-out test split."""
    from transformers import AutoProcessor, CLIPModel

    processor = AutoProcessor.from_pretrained(model_dir)
    model, info = CLIPModel.from_pretrained(model_dir, use_safetensors=True, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k != "error_msgs" and v}
    if bad or info.get("error_msgs"):
        raise RuntimeError(f"saved model does not load cleanly: {info}")
    model.eval()
    ds = make_shapes(n=max(n_test, n_retrieval), seed=0, split="test", image_size=IMAGE_SIZE)
    samples = ds.samples

    def img_feats(imgs: list[np.ndarray]) -> torch.Tensor:
        chunks = []
        for i in range(0, len(imgs), 250):
            px = processor(images=imgs[i : i + 250], return_tensors="pt")["pixel_values"]
            chunks.append(features(model.get_image_features(pixel_values=px)))
        return F.normalize(torch.cat(chunks), dim=-1)

    def txt_feats(texts: list[str]) -> torch.Tensor:
        chunks = []
        for i in range(0, len(texts), 250):
            enc = processor(text=texts[i : i + 250], padding=True, truncation=True, return_tensors="pt")
            out = model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
            chunks.append(features(out))
        return F.normalize(torch.cat(chunks), dim=-1)

    classes = list(ds.classes)
    t = txt_feats([PROMPT.format(c) for c in classes])
    im = img_feats([s.image for s in samples[:n_test]])
    pred = (im @ t.T).argmax(-1).numpy()
    gold = np.array([classes.index(s.label) for s in samples[:n_test]])
    acc = float((pred == gold).mean())
    per_class = {c: float((pred[gold == k] == k).mean()) for k, c in enumerate(classes) if (gold == k).any()}

    rim = im[:n_retrieval] if n_retrieval <= n_test else img_feats([s.image for s in samples[:n_retrieval]])
    rtx = txt_feats([s.caption or "" for s in samples[:n_retrieval]])
    sim = rtx @ rim.T  # texts x images
    idx = torch.arange(n_retrieval)

    def recall(s: torch.Tensor, k: int) -> float:
        topk = s.topk(k, dim=-1).indices
        return round(float((topk == idx[:, None]).any(-1).float().mean()), 4)

    return {
        "zero_shot_accuracy": acc,
        "zero_shot_n": n_test,
        "zero_shot_min_class_accuracy": round(min(per_class.values()), 4),
        "retrieval_n": n_retrieval,
        "text_to_image_R@1": recall(sim, 1),
        "text_to_image_R@5": recall(sim, 5),
        "image_to_text_R@1": recall(sim.T, 1),
        "image_to_text_R@5": recall(sim.T, 5),
    }


@torch.no_grad()
def quick_zero_shot(model: Any, tok: Any, ds: Any) -> float:
    """In-training progress check (not used for the recorded metrics)."""
    model.eval()
    enc = tok([PROMPT.format(c) for c in ds.classes], padding=True, return_tensors="pt")
    t = F.normalize(features(model.get_text_features(**enc)), dim=-1)
    im = F.normalize(
        features(model.get_image_features(pixel_values=normalise_images(np.stack([s.image for s in ds.samples])))),
        dim=-1,
    )
    gold = np.array([list(ds.classes).index(s.label) for s in ds.samples])
    return float(((im @ t.T).argmax(-1).numpy() == gold).mean())


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------


def train(args: argparse.Namespace) -> None:
    import tokenizers
    import transformers
    from transformers import CLIPProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # e.g. "torchvision not installed, using the PIL processor"
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    check_out_dir(Path(args.out))  # fail before training, not after
    t0 = time.perf_counter()

    print(f"[data] generating {args.n_train} train samples (seed {args.seed})", flush=True)
    data = load_train(args.n_train, args.seed)
    tok = build_tokenizer(tokenizer_corpus(data))
    print(f"[tokenizer] vocab {len(tok)}; data ready in {time.perf_counter() - t0:.1f}s", flush=True)
    model = build_model(tok, args)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[model] {n_params / 1e6:.3f}M parameters", flush=True)

    sampler = CaptionSampler()
    rng = np.random.default_rng([args.seed, 1])
    images = data["images"]  # N x 64 x 64 x 3 uint8, normalised per batch
    codes = data["codes"]
    n = len(codes)

    decay = [p for nm, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in nm]
    no_decay = [p for nm, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in nm)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-6,
    )
    warmup = max(1, int(0.05 * args.steps))

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        prog = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * 0.5 * (1 + math.cos(math.pi * prog))

    token_cache: dict[str, list[int]] = {}

    def encode(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [t for t in set(texts) if t not in token_cache]
        if missing:
            for t, ids in zip(missing, tok(missing, truncation=True)["input_ids"], strict=True):
                token_cache[t] = ids
        seqs = [token_cache[t] for t in texts]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        return ids, mask

    # progress checks use the val split; the test split is only touched by the final evaluation
    probe_set = make_shapes(n=300, seed=0, split="val", image_size=IMAGE_SIZE) if args.eval_every else None
    order = rng.permutation(n)
    pos = 0
    model.train()
    t_train = time.perf_counter()
    for step in range(args.steps):
        if pos + args.batch_size > n:
            order, pos = rng.permutation(n), 0
        batch = order[pos : pos + args.batch_size]
        pos += args.batch_size

        # texts: the dataset's own caption, or another template filled with the same attributes
        choice = rng.random(len(batch))
        extra = rng.integers(len(sampler.templates), size=len(batch))
        texts, tcodes = [], []
        for j, i in enumerate(batch):
            if choice[j] < args.p_own:
                ti = int(data["own"][i])
                texts.append(data["captions"][i])
            else:
                ti = int(extra[j])
                texts.append(_fill(sampler.templates[ti], data["vals"][i]))
            tcodes.append(sampler.codes_for(ti, codes[i]))
        ids, mask = encode(texts)
        tc = torch.from_numpy(np.stack(tcodes))  # B x A, -1 = not mentioned
        ic = torch.from_numpy(codes[batch])  # B x A
        # positives[i, j]: text j is true of image i
        pos_mat = ((tc[None, :, :] == -1) | (tc[None, :, :] == ic[:, None, :])).all(-1).float()

        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        out = model(input_ids=ids, attention_mask=mask, pixel_values=normalise_images(images[batch]))
        logits = out.logits_per_image  # images x texts, already scaled
        target_i2t = pos_mat / pos_mat.sum(1, keepdim=True)
        target_t2i = pos_mat.T / pos_mat.T.sum(1, keepdim=True)
        loss = 0.5 * (
            torch.sum(-target_i2t * F.log_softmax(logits, dim=1), dim=1).mean()
            + torch.sum(-target_t2i * F.log_softmax(logits.T, dim=1), dim=1).mean()
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        done = step + 1
        if done % args.log_every == 0 or done in (1, args.steps):
            el = time.perf_counter() - t_train
            msg = (
                f"[train] step {done}/{args.steps} loss {loss.item():.4f} "
                f"scale {model.logit_scale.exp().item():.1f} lr {lr_at(step):.2e} {el:.0f}s"
            )
            if args.eval_every and done % args.eval_every == 0:
                msg += f" zero-shot(val,n=300) {quick_zero_shot(model, tok, probe_set):.3f}"
                model.train()
            print(msg, flush=True)
    train_s = time.perf_counter() - t_train

    out_dir = prepare_out_dir(Path(args.out))
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    image_processor = build_image_processor()
    processor = CLIPProcessor(image_processor=image_processor, tokenizer=tok)
    processor.save_pretrained(out_dir)
    save_compat_files(out_dir, tok, image_processor)
    wall_s = time.perf_counter() - t0

    print("[eval] fresh load from disk ...", flush=True)
    metrics = evaluate(out_dir)
    print("[eval] " + json.dumps(metrics), flush=True)
    cfg = model.config
    record = {
        "model": "builtin:tiny-clip",
        "command": " ".join(["python scripts/train_tiny_clip.py", *sys.argv[1:]]),
        "seed": args.seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "n_train": args.n_train,
        "train_data": f"builtin:shapes?split=train&seed={args.seed}&n={args.n_train}",
        "p_own_caption": args.p_own,
        "threads": args.threads,
        "reproducibility": "weights are bitwise identical for the same seed, steps, thread count "
        "and library versions (torch.use_deterministic_algorithms)",
        "train_seconds": round(train_s, 1),
        "wall_seconds": round(wall_s, 1),
        "parameters": n_params,
        "vocab_size": len(tok),
        "text": {
            "layers": cfg.text_config.num_hidden_layers,
            "hidden": cfg.text_config.hidden_size,
            "heads": cfg.text_config.num_attention_heads,
            "intermediate": cfg.text_config.intermediate_size,
            "max_position_embeddings": cfg.text_config.max_position_embeddings,
        },
        "vision": {
            "layers": cfg.vision_config.num_hidden_layers,
            "hidden": cfg.vision_config.hidden_size,
            "heads": cfg.vision_config.num_attention_heads,
            "intermediate": cfg.vision_config.intermediate_size,
            "patch_size": cfg.vision_config.patch_size,
            "image_size": cfg.vision_config.image_size,
        },
        "projection_dim": cfg.projection_dim,
        "final_loss": round(float(loss.item()), 4),
        "logit_scale": round(float(model.logit_scale.exp().item()), 3),
        "eval": {
            "split": "test",
            "seed": 0,
            "prompt": PROMPT,
            "loaded_from_disk": "AutoProcessor + CLIPModel.from_pretrained(use_safetensors=True), eval()",
            **metrics,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "numpy": np.__version__,
        },
    }
    (out_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file())
    print(f"[done] {out_dir} ({size / 1e6:.2f} MB), train {train_s:.0f}s, total {wall_s:.0f}s", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--n-train", type=int, default=32768)
    ap.add_argument("--p-own", type=float, default=0.5, help="share of texts that are the sample's own caption")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--patch-size", type=int, default=16)
    ap.add_argument("--vision-hidden", type=int, default=96)
    ap.add_argument("--vision-mlp", type=int, default=384)
    ap.add_argument("--vision-layers", type=int, default=3)
    ap.add_argument("--vision-heads", type=int, default=4)
    ap.add_argument("--log-every", type=int, default=250)
    ap.add_argument("--eval-every", type=int, default=0, help="report val-split zero-shot accuracy (0: off)")
    train(ap.parse_args(argv))


if __name__ == "__main__":
    main()
