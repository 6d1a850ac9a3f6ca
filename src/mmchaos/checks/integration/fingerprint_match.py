"""Step 5: the tokenizer, image processor and config must belong with the weights.

A mismatch is judged from evidence that does not need a good model, each line naming the component
at fault:

* recorded hashes -- the component hashes recorded when the artefact was made (an ``onnx:``
  export's manifest, or a ``lock`` file: a fingerprint from a run you validated) against the
  current ones;
* static consistency -- what the weights imply (embedding rows, special token ids, position
  count, image size) against what the tokenizer and processor produce, including the token ids
  the tokenizer actually emits for the run's texts;
* the load -- weights missing from the checkpoint and initialised at random (an ``hf:`` target
  loaded with ``allow_missing_weights``);
* a recorded accuracy -- zero-shot accuracy on the data a record (``training.json``, or
  ``params.reference_accuracy``) was measured on must not fall below it;
* a generative VLM's chat template and processor against the model directory's
  (``params.model_dir``, by default the ``hf:`` target's own): the processor facts that decide how a
  request becomes tokens (image token, image size, patch size, image-token count settings, the
  template's hash) where the target exposes its processor, and on any backend the prompt tokens it
  reports for a text request and a one-image request against what the directory's own template and
  processor make of them (a served ``--chat-template`` or ``preprocessor_config.json`` that differs);
* a generative model's shipped generation settings (:mod:`._generation_settings`): the EOS, pad and
  BOS ids of ``generation_config`` (what ``generate`` stops on) against the tokenizer and config,
  EOS ids it bans, greedy answers that run past the tokenizer's EOS, and a decoder-only tokenizer
  saved with right padding; each with its fix.

Zero-shot accuracy against chance is reported but not gated by default: an untrained or
off-domain model that is packaged correctly is near chance too (``min_accuracy_over_chance``
opts in, for a model known to be good on the data).

The gate says whether a mismatch is refused (a failing finding) or only warned about.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.checks.engine.generation_inputs import probe_requests
from mmchaos.checks.integration._generation_settings import directory_settings, generation_settings
from mmchaos.errors import ConfigError, MMChaosError
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Fingerprint, Target
from mmchaos.targets.generation import GenerationParams, Message
from mmchaos.targets.wrappers import unwrap
from mmchaos.tasks.base import l2_normalise

__all__ = ["FingerprintMatch", "static_problems"]

_COMPONENTS = ("weights", "tokenizer", "processor", "config")
_EITHER = "the tokenizer or the processor"
_TEMPLATE = "chat template"
_VLM_QUESTION = "What colour is the shape?"
_SHIP_AS_ONE = (
    "ship tokenizer, processor, config and weights as one versioned artefact and refuse to load pairs whose "
    "fingerprints were not validated together"
)


def _model_config(target: Target) -> dict[str, Any]:
    if target.has(Capability.TORCH_MODULE):
        cfg = getattr(target.torch_module(), "config", None)
        if cfg is not None and hasattr(cfg, "to_dict"):
            return dict(cfg.to_dict())
    path = getattr(target, "path", None)
    if isinstance(path, Path) and (path / "config.json").is_file():
        try:
            data = json.loads((path / "config.json").read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}
    return {}


def _embedding_rows(target: Target) -> int | None:
    if not target.has(Capability.TORCH_MODULE):
        return None
    model = target.torch_module()
    emb = getattr(model, "get_input_embeddings", None)
    try:
        layer = emb() if callable(emb) else None
    except (NotImplementedError, AttributeError):
        layer = None
    if layer is None:
        text = getattr(model, "text_model", None)
        layer = getattr(getattr(text, "embeddings", None), "token_embedding", None)
    weight = getattr(layer, "weight", None)
    return int(weight.shape[0]) if weight is not None else None


def _max_token_id(target: Target, texts: list[str]) -> int | None:
    """The largest token id the target's own tokenization emits for ``texts`` (specials included)."""
    tokenize = getattr(target, "tokenize", None)
    if not callable(tokenize) or not texts:
        return None
    try:
        ids = np.asarray(tokenize(texts[:64])["input_ids"])
    except Exception:  # a tokenizer that cannot run on plain captions is found by the other checks
        return None
    return int(ids.max()) if ids.size else None


def static_problems(target: Target, texts: list[str] | None = None) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """(component, problem) pairs found by comparing the weights' config with the preprocessing."""
    config = _model_config(target)
    text_cfg = config.get("text_config") or config
    vision_cfg = config.get("vision_config") or {}
    tok = getattr(target, "tokenizer", None)
    problems: list[tuple[str, str]] = []
    facts: dict[str, Any] = {}
    report = getattr(target, "load_report", None)
    if isinstance(report, dict):
        facts["load_report"] = report
        fresh = int(report.get("missing_keys", 0) or 0) + int(report.get("mismatched_keys", 0) or 0)
        if fresh:
            saved = ", ".join(report.get("saved_as") or []) or "another architecture"
            problems.append(("weights", f"{fresh} weights of {report.get('loaded_as')} were not in the checkpoint "
                                        f"(saved as {saved}) and were initialised at random at load"))  # fmt: skip
    if tok is not None and text_cfg:
        rows = _embedding_rows(target) or text_cfg.get("vocab_size")
        n_tok = len(tok) if hasattr(tok, "__len__") else None
        facts.update(tokenizer_size=n_tok, embedding_rows=rows)
        if rows and n_tok:
            if n_tok > rows:
                problems.append(("tokenizer", f"the tokenizer has {n_tok} tokens but the embedding table {rows} rows: "
                                              f"ids >= {rows} index out of range"))  # fmt: skip
            elif n_tok < rows - 128:
                problems.append(("tokenizer", f"the tokenizer has {n_tok} tokens, the embedding table {rows} rows: "
                                              "a different vocabulary"))  # fmt: skip
        for name in ("eos", "bos", "pad"):
            want = text_cfg.get(f"{name}_token_id")
            have = getattr(tok, f"{name}_token_id", None)
            facts[f"{name}_token_id"] = {"config": want, "tokenizer": have}
            if name == "eos" and want == 2 and config.get("model_type") == "clip":
                continue  # legacy CLIP configs: transformers pools at argmax(input_ids) instead
            if want is not None and have is not None and int(want) != int(have):
                problems.append(("tokenizer", f"{name.upper()} is id {have} in the tokenizer but {want} in the model "
                                              "config: a different vocabulary"))  # fmt: skip
        emitted = _max_token_id(target, texts or [])
        if emitted is not None:
            facts["max_token_id_emitted"] = emitted
            if rows and emitted >= rows:
                problems.append(("tokenizer", f"the tokenizer emits id {emitted} for the run's texts, the embedding "
                                              f"table has {rows} rows: ids >= {rows} index out of range"))  # fmt: skip
        positions = text_cfg.get("max_position_embeddings")
        tok_max = getattr(tok, "model_max_length", None)
        facts["max_positions"] = {"config": positions, "tokenizer": tok_max}
        if positions and isinstance(tok_max, int) and positions < tok_max < 1_000_000:
            problems.append(
                ("tokenizer", f"the tokenizer allows {tok_max} tokens, the model has {positions} positions")
            )
    size = vision_cfg.get("image_size")
    if size and callable(getattr(target, "preprocess_images", None)):
        probe = np.full((97, 131, 3), 127, np.uint8)
        try:
            shape = tuple(int(d) for d in np.asarray(target.preprocess_images([probe])).shape)  # type: ignore[attr-defined]
        except Exception as exc:  # a processor that cannot even run is itself the finding
            problems.append(("processor", f"the image processor fails on a plain picture: {type(exc).__name__}: {exc}"))
            shape = ()
        facts["processor_output_shape"] = list(shape)
        facts["model_image_size"] = size
        if len(shape) == 4 and tuple(shape[2:]) != (size, size):
            problems.append(("processor", f"the image processor outputs {shape[2]}x{shape[3]} pixels, the vision "
                                          f"tower was built for {size}x{size}"))  # fmt: skip
        channels = vision_cfg.get("num_channels")
        if len(shape) == 4 and channels and shape[1] != channels:
            problems.append(
                ("processor", f"the image processor outputs {shape[1]} channels, the model takes {channels}")
            )
    return problems, facts


def _load_lock(path: str) -> Fingerprint:
    try:
        data = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the fingerprint lock {path}: {exc}") from exc
    for key in ("target", "fingerprint"):  # a results.json, or a describe() dict
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            data = data[key]
    if isinstance(data, dict) and isinstance(data.get("fingerprint"), dict):
        data = data["fingerprint"]
    if not isinstance(data, dict) or not any(k in data for k in _COMPONENTS):
        raise ConfigError(f"{path} holds no fingerprint (weights/tokenizer/processor/config hashes)")
    return Fingerprint(
        weights=str(data.get("weights", "")),
        tokenizer=str(data.get("tokenizer", "")),
        processor=str(data.get("processor", "")),
        config=str(data.get("config", "")),
    )


def _recorded_accuracy(target: Target, ctx: CheckContext) -> tuple[float | None, str]:
    """The zero-shot accuracy a model directory's training.json records, if this run uses its data."""
    path = getattr(target, "path", None)
    record_path = path / "training.json" if isinstance(path, Path) else None
    if record_path is None or not record_path.is_file():
        return None, ""
    try:
        record = json.loads(record_path.read_text())
        evaluation = record["eval"]
        accuracy = float(evaluation["zero_shot_accuracy"])
        split, seed = str(evaluation.get("split", "test")), int(evaluation.get("seed", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None, ""
    source = ctx.dataset.source
    same_data = ctx.dataset.name == "shapes" and f"split={split}" in source and f"seed={seed}&" in source + "&"
    return (accuracy, str(record_path)) if same_data else (None, "")


class FingerprintMatchParams(Params):
    lock: str | None = Field(default=None, description="a JSON fingerprint (or results.json) of the validated artefact")
    probe: bool = Field(default=True, description="run the zero-shot probe on a labelled dataset")
    samples: int = Field(default=96, ge=8)
    reference_accuracy: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="zero-shot accuracy validated with these weights on this dataset; by default the model "
        "directory's training.json, when the run uses the data it was measured on",
    )
    model_dir: str | None = Field(
        default=None,
        description="generative VLMs: the model directory whose chat template and processor the served ones must "
        "match; by default the hf: target's own directory",
    )
    generate_probes: int = Field(
        default=3,
        ge=0,
        le=16,
        description="generative models: greedy answers read for end tokens generate runs past (0: static only)",
    )


class FingerprintMatchGate(Gate):
    on_mismatch: Literal["refuse", "warn"] = "refuse"
    min_accuracy_over_chance: float | None = Field(
        default=None,
        ge=1.0,
        description="opt in: zero-shot accuracy must exceed chance x this (only for a model known to be good on the "
        "data; an untrained or off-domain model is near chance however it is packaged)",
    )
    max_accuracy_drop: float = Field(
        default=0.1, ge=0.0, le=1.0, description="below the reference accuracy by more than this is a mismatch"
    )


class FingerprintMatch(Check[FingerprintMatchParams, FingerprintMatchGate]):
    """Tokenizer/processor/config vs weights: recorded hashes, static consistency, zero-shot probe."""

    name = "fingerprint_match"
    step = Step.INTEGRATION
    requires = (frozenset(),)

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        g = self.gate
        target = unwrap(ctx.target)
        current = target.fingerprint()
        recorded = _load_lock(p.lock) if p.lock else target.recorded_fingerprint()
        problems: list[tuple[str, str]] = []
        fixes: list[str] = []
        evidence: dict[str, Any] = {"current": current.to_dict(include_digest=False), "seed": ctx.seed}
        lines: list[str] = []
        if recorded is not None:
            evidence["recorded"] = recorded.to_dict(include_digest=False)
            for comp in _COMPONENTS:
                want, have = getattr(recorded, comp), getattr(current, comp)
                if want and have and want != have:
                    problems.append((comp, f"the {comp} hash {have[:12]} differs from the recorded {want[:12]}"))
            lines.append("recorded hashes compared")
        data = ctx.dataset.sample(p.samples, ctx.seed)
        texts = [s.caption or s.text or "" for s in data]
        if data.classes:
            texts += [data.prompt_template.format(c) for c in data.classes]
        static, facts = static_problems(target, [t for t in texts if t])
        problems += static
        evidence["static"] = facts
        if facts:
            lines.append("static consistency checked")
        metrics: dict[str, float] = {}
        if target.has(Capability.GENERATE):
            vlm_problems, vlm_facts, line = vlm_consistency(target, p.model_dir)
            problems += vlm_problems
            evidence["vlm"] = vlm_facts
            lines.append(line)
            requests = probe_requests(ctx, p.generate_probes)[0] if p.generate_probes else []
            settings = generation_settings(target, requests)
            if not settings.facts and p.model_dir is not None:  # a server: the directory it serves
                settings = directory_settings(Path(p.model_dir).expanduser())
            if settings.facts:
                problems += settings.problems
                fixes += settings.fixes
                evidence["generation"] = settings.facts
                emitted = settings.facts.get("emitted")
                against = f"{emitted['answers']} greedy answers" if emitted else "model_dir's files"
                lines.append(f"generation_config compared with the tokenizer, config and {against}")
        unfit = getattr(target, "processor_unfit", None)
        if p.probe and unfit:
            lines.append("zero-shot probe not run: the processor does not fit the model")
        elif p.probe:
            try:
                probe = self._probe(ctx, p.samples)
            except Exception as exc:  # a processor or tokenizer the weights cannot take fails right here
                problems.append((_EITHER, f"the zero-shot probe fails: {type(exc).__name__}: {exc}"))
                lines.append("zero-shot probe failed")
                probe = None
            if probe is not None:
                acc, chance = probe
                metrics.update(zero_shot_accuracy=acc, chance=chance, accuracy_over_chance=acc / chance)
                lines.append(f"zero-shot accuracy {acc:.3f} (chance {chance:.3f})")
                if g.min_accuracy_over_chance is not None and acc < g.min_accuracy_over_chance * chance:
                    problems.append((_EITHER, f"zero-shot accuracy {acc:.3f} is under "
                                     f"{g.min_accuracy_over_chance:g}x chance ({chance:.3f}): the text and image sides "
                                     "no longer line up"))  # fmt: skip
                reference, where = p.reference_accuracy, "params.reference_accuracy"
                if reference is None:
                    reference, where = _recorded_accuracy(target, ctx)
                if reference is not None:
                    metrics["reference_accuracy"] = reference
                    evidence["reference_accuracy_from"] = where
                    if acc < reference - g.max_accuracy_drop:
                        drop = f"zero-shot accuracy {acc:.3f} is {reference - acc:.3f} below the {reference:.3f}"
                        problems.append((_EITHER, f"{drop} recorded in {where}"))
        if not lines:
            yield self.finding(
                ctx,
                Verdict.SKIPPED,
                "nothing to compare: no recorded fingerprint, no config to check, no labelled data to probe",
                suggestion="pass params.lock (a fingerprint from a validated run) or use a labelled dataset",
            )
            return
        evidence["problems"] = [{"component": c, "problem": m} for c, m in problems]
        metrics["mismatches"] = float(len(problems))
        gate = f"no mismatch ({g.on_mismatch} on mismatch)"
        if not problems:
            yield self.finding(
                ctx, Verdict.PASS, "tokenizer, processor and config belong with the weights (" + "; ".join(lines) + ")",
                metrics=metrics, gate=gate, evidence=evidence,
            )  # fmt: skip
            return
        named = sorted({c for c, _ in problems if c != _EITHER})
        comps = named or [_EITHER]  # the probe cannot tell which side is wrong; a static finding can
        first = next(m for c, m in problems if c in comps)
        if comps == ["weights"]:
            title = f"weights do not load as the model they claim to be: {first}"
        else:
            verb = "does" if len(comps) == 1 else "do"
            title = f"{' and '.join(comps)} {verb} not belong with the weights: {first}"
        refuse = g.on_mismatch == "refuse"
        yield self.finding(
            ctx,
            Verdict.FAIL if refuse else Verdict.PASS,
            title if refuse else "warning: " + title,
            severity=Severity.HIGH if refuse else Severity.MEDIUM,
            metrics=metrics,
            gate=gate,
            message="; ".join(m for _, m in problems)[:1000],
            suggestion="; ".join(fixes if len(fixes) == len(problems) else [*fixes, _SHIP_AS_ONE]),
            evidence=evidence,
        )

    @staticmethod
    def _probe(ctx: CheckContext, samples: int) -> tuple[float, float] | None:
        data = ctx.dataset.sample(samples, ctx.seed)
        target = ctx.target
        if not (data.has_labels and data.has_images and data.classes and len(data.classes) > 1):
            return None
        if not target.has(Capability.EMBED_IMAGE, Capability.EMBED_TEXT):
            return None
        prompts = [data.prompt_template.format(c) for c in data.classes]
        text = l2_normalise(np.asarray(target.embed_texts(prompts), np.float32))
        images = [s.load_image() for s in data]
        img = l2_normalise(np.concatenate([np.asarray(target.embed_images(images[i : i + 32]), np.float32)
                                           for i in range(0, len(images), 32)]))  # fmt: skip
        truth = np.array([data.classes.index(s.label or "") for s in data])
        acc = float(((img @ text.T).argmax(axis=1) == truth).mean())
        counts = np.bincount(truth, minlength=len(data.classes))
        chance = float(max(counts.max() / len(truth), 1.0 / len(data.classes)))
        return acc, chance


def _reference_dir(target: Target, model_dir: str | None) -> Path | None:
    if model_dir is not None:
        path = Path(model_dir).expanduser()
        if not path.is_dir():
            raise ConfigError(f"params.model_dir {model_dir} is not a directory", code="model_dir_missing")
        return path
    own = getattr(target, "path", None)
    return own if isinstance(own, Path) and getattr(target, "processor", None) is not None else None


def _probe_image() -> Any:
    """A 64x64 picture (a red square on grey): any size works, both sides get the same one."""
    image = np.full((64, 64, 3), 128, np.uint8)
    image[16:48, 16:48] = (220, 30, 30)
    return image


def vlm_consistency(target: Target, model_dir: str | None) -> tuple[list[tuple[str, str]], dict[str, Any], str]:
    """(component, problem) pairs where the served chat template / processor differ from the model
    directory's, the facts compared, and a line for the finding's title."""
    from mmchaos.targets.vlm_processor import expected_prompt_tokens, load_processor, processor_facts

    reference_dir = _reference_dir(target, model_dir)
    if reference_dir is None:
        return [], {}, "chat template and processor not compared (no params.model_dir)"
    try:
        reference = load_processor(reference_dir)
    except MMChaosError as exc:
        raise ConfigError(
            f"params.model_dir {reference_dir}: no loadable processor ({exc.message})", code="model_dir_missing"
        ) from None
    problems: list[tuple[str, str]] = []
    facts: dict[str, Any] = {"model_dir": str(reference_dir), "model_dir_processor": processor_facts(reference)}
    served_processor = getattr(target, "processor", None)
    if served_processor is not None:
        served = processor_facts(served_processor)
        facts["served_processor"] = served
        wanted = facts["model_dir_processor"]
        for key in sorted(set(served) | set(wanted)):
            if served.get(key) != wanted.get(key):
                component = _TEMPLATE if key == "chat_template_sha256" else "processor"
                problems.append((component, f"{key} is {served.get(key)!r} served but {wanted.get(key)!r} in "
                                            f"{reference_dir.name}"))  # fmt: skip
    text_request = [Message("user", _VLM_QUESTION)]
    image_request = [Message("user", (_probe_image(), _VLM_QUESTION))]
    expected = (expected_prompt_tokens(reference, text_request), expected_prompt_tokens(reference, image_request))
    facts["prompt_tokens_model_dir"] = {"text": expected[0], "one_image": expected[1]}
    params = GenerationParams(max_new_tokens=1, logprobs=False)
    try:
        text_tokens: int | None = target.generate(text_request, params=params).prompt_tokens
    except MMChaosError as exc:  # a model that answers only with an image (BLIP-2) refuses it, typed
        if exc.code != "image_required":
            problems.append((_TEMPLATE, f"a text request fails ({exc.code}: {exc.message[:200]})"))
            return problems, facts, "chat template and processor compared with the model directory"
        facts["prompt_tokens_note"] = "text-only requests refused (image_required): one-image counts compared"
        text_tokens = expected[0]
    try:
        got = (text_tokens, target.generate(image_request, params=params).prompt_tokens)
    except MMChaosError as exc:
        problems.append(("processor", f"a one-image request fails ({exc.code}: {exc.message[:200]}); the model "
                                      f"directory's processor makes it {expected[1]} prompt tokens"))  # fmt: skip
        return problems, facts, "chat template and processor compared with the model directory"
    facts["prompt_tokens_served"] = {"text": got[0], "one_image": got[1]}
    if got[0] is None or got[1] is None:
        facts["prompt_tokens_note"] = "the target reports no prompt token counts (usage): compared statically only"
    else:
        if got[0] != expected[0]:
            problems.append((_TEMPLATE, f"a text request is {got[0]} prompt tokens served but {expected[0]} with "
                                        f"{reference_dir.name}'s chat template and tokenizer"))  # fmt: skip
        image_served, image_expected = got[1] - got[0], expected[1] - expected[0]
        if image_served != image_expected:
            problems.append(("processor", f"one 64x64 image adds {image_served} prompt tokens served but "
                                          f"{image_expected} with {reference_dir.name}'s processor (image size, patch "
                                          "size or image-token count differ)"))  # fmt: skip
    return problems, facts, "chat template and processor compared with the model directory"
