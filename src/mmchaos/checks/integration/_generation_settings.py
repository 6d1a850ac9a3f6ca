"""The generation settings a checkpoint ships, against its tokenizer, its config and what it emits.

``generate`` stops on ``generation_config.eos_token_id`` (an id or a list), not on the tokenizer's
EOS or the config's: a ``generation_config.json`` that names another id answers every question with
a run-on string, and nothing static outside this file says so. The same file holds the pad and BOS
ids and the sampling defaults a server applies to requests that do not set them. Compared here:

* the EOS ids ``generate`` stops on must include the tokenizer's EOS (the token the chat template
  and the training ended answers with); pad and BOS ids must agree where both name one;
* no id ``generate`` stops on may be suppressed or banned (the answer could never end);
* what the model emits: greedy answers that run to the token limit while containing the
  tokenizer's or config's EOS id are answers ``generate`` ran past their end;
* a decoder-only model's tokenizer saved with right padding: a batch of prompts of different
  lengths then generates after the shorter rows' padding (the fix: save it with left padding).

Each problem comes with the fix to suggest. Used by ``fingerprint_match``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmchaos._lazy import require
from mmchaos.errors import MMChaosError
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.generation import GenerationParams, Message

__all__ = ["GenerationSettings", "directory_settings", "generation_settings", "id_set", "settings_problems"]

COMPONENT = "generation_config"
_DEFAULTS = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty", "max_new_tokens", "max_length",
             "num_beams", "min_new_tokens")  # fmt: skip
_BANS = ("suppress_tokens", "begin_suppress_tokens", "bad_words_ids")


def id_set(value: Any) -> set[int]:
    """The token ids ``value`` names: an int, a list of ints (or of lists, as ``bad_words_ids``), or None."""
    if value is None or isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list | tuple):
        return {i for v in value for i in id_set(v)}
    return set()


@dataclass
class GenerationSettings:
    """What the checks found: (component, problem) pairs, the fix for each, and the facts compared."""

    problems: list[tuple[str, str]] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, component: str, problem: str, fix: str) -> None:
        self.problems.append((component, problem))
        if fix not in self.fixes:
            self.fixes.append(fix)


def _token(tokenizer: Any, token_id: int) -> str:
    try:
        return repr(str(tokenizer.convert_ids_to_tokens(int(token_id))))
    except Exception:  # an id outside the vocabulary is named by its number alone
        return "?"


def settings_problems(generation: dict[str, Any], config: dict[str, Any], tokenizer: Any) -> GenerationSettings:
    """Static comparison of a ``generation_config`` (as a dict) with the model config and tokenizer."""
    out = GenerationSettings()
    text_cfg = config.get("text_config") or config
    stops = id_set(generation.get("eos_token_id"))
    facts: dict[str, Any] = {"generation_config_eos": sorted(stops)}
    for name in ("eos", "pad", "bos"):
        facts[f"{name}_token_id"] = {"generation_config": generation.get(f"{name}_token_id"),
                                     "config": text_cfg.get(f"{name}_token_id", config.get(f"{name}_token_id")),
                                     "tokenizer": getattr(tokenizer, f"{name}_token_id", None)}  # fmt: skip
    facts["defaults"] = {k: generation[k] for k in _DEFAULTS if generation.get(k) is not None}
    out.facts.update(facts)
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if not stops:
        out.add(COMPONENT, "generation_config names no eos_token_id: generate stops only at max_new_tokens",
                "set generation_config.json's eos_token_id to the tokenizer's EOS id (a list where the chat "
                "template ends turns with another token)")  # fmt: skip
    elif isinstance(tok_eos, int) and tok_eos not in stops:
        out.add(COMPONENT, f"generation_config.eos_token_id is {generation.get('eos_token_id')!r} but the tokenizer's "
                           f"EOS is id {tok_eos} ({_token(tokenizer, tok_eos)}): generate runs past the end of "
                           "every answer",
                f"set generation_config.json's eos_token_id to {tok_eos} (or a list that includes it), as the "
                "tokenizer and the chat template end answers")  # fmt: skip
    for name in ("pad", "bos"):
        want, have = generation.get(f"{name}_token_id"), getattr(tokenizer, f"{name}_token_id", None)
        if isinstance(want, int) and isinstance(have, int) and want != have:
            out.add(COMPONENT, f"generation_config.{name}_token_id is {want} but the tokenizer's is {have} "
                               f"({_token(tokenizer, have)})",
                    f"save generation_config.json with {name}_token_id {have}, the tokenizer's")  # fmt: skip
    for key in _BANS:
        banned = id_set(generation.get(key)) & stops
        if banned:
            out.add(COMPONENT, f"generation_config.{key} bans EOS id {min(banned)}: no answer can end before "
                               "max_new_tokens",
                    f"remove the EOS ids from generation_config.json's {key}")  # fmt: skip
    return out


def _decoder_only(model: Any) -> bool:
    config = getattr(model, "config", None)
    if config is None:
        return True
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return not (getattr(config, "is_encoder_decoder", False) or getattr(text, "is_encoder_decoder", False))


def _emitted(target: Target, requests: Sequence[list[Message]], stops: set[int], ends: dict[int, str],
             out: GenerationSettings, max_new_tokens: int) -> None:  # fmt: skip
    """Greedy answers to ``requests``: one that runs to the limit past an end token ``generate`` does
    not stop on is an answer the shipped EOS does not end."""
    params = GenerationParams(max_new_tokens=max_new_tokens, logprobs=False)
    seen: dict[int, int] = {}
    finishes = []
    for request in requests:
        try:
            completion = target.generate(request, params=params).completions[0]
        except MMChaosError:  # a request this target refuses is the other checks' finding
            continue
        finishes.append(completion.finish_reason)
        if completion.finish_reason != "length" or completion.token_ids is None:
            continue
        for token in set(completion.token_ids) & set(ends):
            seen[token] = seen.get(token, 0) + 1
    out.facts["emitted"] = {"answers": len(finishes), "ended_by_length": finishes.count("length"),
                            "end_tokens_run_past": {str(k): v for k, v in sorted(seen.items())}}  # fmt: skip
    for token, count in sorted(seen.items()):
        out.add(COMPONENT, f"{count} of {len(finishes)} greedy answers contain {ends[token]} (id {token}) and run on "
                           f"to max_new_tokens: generate stops only on {sorted(stops)}",
                f"add {token} to generation_config.json's eos_token_id")  # fmt: skip


def generation_settings(
    target: Target, requests: Sequence[list[Message]], max_new_tokens: int = 16
) -> GenerationSettings:
    """The shipped generation settings of a transformers-backed generative target (its model's
    ``generation_config``, config and tokenizer), the emitted answers to ``requests``, and its
    padding side; empty facts where the target exposes no model or tokenizer."""
    model = target.torch_module() if target.has(Capability.TORCH_MODULE) else None
    tokenizer = getattr(target, "tokenizer", None)
    gen_cfg = getattr(model, "generation_config", None)
    if model is None or gen_cfg is None or tokenizer is None:
        return GenerationSettings()
    generation = gen_cfg.to_dict() if hasattr(gen_cfg, "to_dict") else {}
    config = model.config.to_dict() if hasattr(getattr(model, "config", None), "to_dict") else {}
    out = settings_problems(generation, config, tokenizer)
    if hasattr(gen_cfg, "to_diff_dict"):  # the defaults the artefact sets, not transformers' own
        shipped = gen_cfg.to_diff_dict()
        out.facts["defaults"] = {k: shipped[k] for k in _DEFAULTS if shipped.get(k) is not None}
    path = getattr(target, "path", None)
    if isinstance(path, Path) and (path / "generation_config.json").is_file():
        out.facts["generation_config_file"] = str(path / "generation_config.json")
    stops = id_set(generation.get("eos_token_id"))
    text_cfg = config.get("text_config") or config
    ends = {int(i): _token(tokenizer, int(i)) for i in id_set(getattr(tokenizer, "eos_token_id", None))
            | id_set(text_cfg.get("eos_token_id")) if int(i) not in stops}  # fmt: skip
    if requests and target.has(Capability.GENERATE):
        _emitted(target, requests, stops, ends, out, max_new_tokens)
    side = getattr(target, "padding_side", getattr(tokenizer, "padding_side", None))
    out.facts["padding_side"] = side
    if side == "right" and _decoder_only(model):
        out.add("tokenizer", "the tokenizer is saved with padding_side 'right': in a batch of prompts of different "
                             "lengths this decoder-only model generates after the shorter prompts' padding",
                "save the tokenizer with padding_side 'left' (tokenizer.padding_side = 'left'; "
                "tokenizer.save_pretrained(dir)), as decoder-only batched generation needs")  # fmt: skip
    return out


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def directory_settings(directory: Path) -> GenerationSettings:
    """The static comparison for a model directory a server serves (``fingerprint_match``'s
    ``model_dir`` for an ``openai:`` target): its ``generation_config.json`` (what vLLM's
    ``--generation-config auto`` and transformers apply) against its config and tokenizer. Padding
    and emitted tokens are not judged: a server batches without the tokenizer's padding, and
    gives no token ids to read."""
    generation = _json(directory / "generation_config.json")
    if not generation:
        return GenerationSettings()
    try:
        tokenizer = require("transformers").AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception:  # a directory whose tokenizer does not load is found by the processor comparison
        return GenerationSettings()
    out = settings_problems(generation, _json(directory / "config.json"), tokenizer)
    out.facts["generation_config_file"] = str(directory / "generation_config.json")
    return out
