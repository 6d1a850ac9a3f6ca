"""Model fingerprints and compatibility checks: refuse a tokenizer or processor that is not the one
the weights were validated with (the 004 write-up's grey-release mismatch), without torch.

Two checks, for two situations:

- :func:`check_compatible` compares the component hashes of what is deployed with what was
  validated (a recorded :class:`~mmchaos.guard.artefacts.Fingerprint`, a dict from a report, or a
  model directory) and names every component that differs.
- :func:`check_consistency` reads the JSON files of a model directory (and, optionally, a
  tokenizer or processor taken from somewhere else) and compares their semantic fields with
  ``config.json``: input image size, patch divisibility, channels vs mean/std, token ids vs the
  embedding table, tokenizer length vs position embeddings. It catches a mismatch when no
  recorded hashes exist.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmchaos.errors import MMChaosError
from mmchaos.guard.artefacts import PROCESSOR_FILES, Fingerprint, component_hashes, hash_files

__all__ = [
    "COMPONENTS",
    "CompatibilityError",
    "Difference",
    "check_compatible",
    "check_consistency",
    "compare_processors",
    "consistency_issues",
    "fingerprint",
]

COMPONENTS = ("weights", "tokenizer", "processor", "config")

#: What :func:`hash_files` gives for no files at all: the component is absent.
EMPTY_HASH = hash_files([])
# transformers' "no limit" sentinel for model_max_length (int(1e30)).
_NO_LIMIT = 10**20


@dataclass(frozen=True, slots=True)
class Difference:
    component: str
    expected: Any
    actual: Any
    reason: str
    #: ``error`` refuses; ``warning`` is reported by :func:`consistency_issues` only.
    severity: str = "error"

    def __str__(self) -> str:
        return f"{self.component}: {self.reason} (expected {self.expected!r}, got {self.actual!r})"


class CompatibilityError(MMChaosError):
    """Model components that do not belong together; ``differences`` names each one."""

    code = "fingerprint_mismatch"

    def __init__(self, message: str, differences: Sequence[Difference], *, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.differences = tuple(differences)

    @property
    def components(self) -> list[str]:
        return sorted({d.component for d in self.differences})


def fingerprint(model_dir: str | Path) -> Fingerprint:
    """Hashes of a model directory's weights, tokenizer, processor and config files."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CompatibilityError(f"{path} is not a model directory", (), code="model_dir_missing")
    config = _read_json(path / "config.json")
    versions = {"transformers": str(config["transformers_version"])} if "transformers_version" in config else {}
    return Fingerprint(**component_hashes(path), versions=versions)


def _as_fingerprint(value: Fingerprint | Mapping[str, Any] | str | Path) -> Fingerprint:
    if isinstance(value, Fingerprint):
        return value
    if isinstance(value, (str, Path)):
        return fingerprint(value)
    if isinstance(value, Mapping):
        parts = {k: str(value.get(k, "") or "") for k in COMPONENTS}
        return Fingerprint(
            weights=parts["weights"], tokenizer=parts["tokenizer"], processor=parts["processor"], config=parts["config"]
        )
    raise TypeError(f"expected a Fingerprint, a mapping or a model directory, got {type(value).__name__}")


def check_compatible(
    expected: Fingerprint | Mapping[str, Any] | str | Path,
    actual: Fingerprint | Mapping[str, Any] | str | Path,
    *,
    components: Sequence[str] = COMPONENTS,
) -> None:
    """Refuse ``actual`` unless every compared component hashes like ``expected``'s.

    A component neither side has is skipped; one side missing it is a difference.
    """
    unknown = sorted(set(components) - set(COMPONENTS))
    if unknown:
        raise ValueError(f"unknown components {unknown}; choose from {list(COMPONENTS)}")
    a, b = _as_fingerprint(expected), _as_fingerprint(actual)
    diffs = []
    for comp in components:
        left, right = _present(getattr(a, comp)), _present(getattr(b, comp))
        if left == right:
            continue
        if not left or not right:
            reason = "missing from the deployed model" if not right else "absent from the validated model"
        else:
            reason = "content differs"
        diffs.append(Difference(comp, left[:16] or None, right[:16] or None, reason))
    if diffs:
        names = ", ".join(d.component for d in diffs)
        hint = ""
        if {d.component for d in diffs} & {"tokenizer", "processor"} and "weights" not in names:
            hint = " (a tokenizer or processor that does not belong with these weights)"
        raise CompatibilityError(f"model components differ: {names}{hint}", diffs)


def _present(value: str) -> str:
    return "" if value in ("", EMPTY_HASH) else value


# -- semantic consistency ------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CompatibilityError(f"cannot read {path}: {exc}", (), code="model_file_invalid") from exc
    return data if isinstance(data, dict) else {}


def _sub(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = config.get(key)
    return value if isinstance(value, Mapping) else config


def _processor_config(directory: Path) -> dict[str, Any]:
    for name in PROCESSOR_FILES:
        data = _read_json(directory / name)
        if data:
            return dict(_sub(data, "image_processor")) if "image_processor" in data else data
    return {}


def _side(value: Any) -> int | None:
    """The square side a processor's ``size``/``crop_size`` produces, when it fixes one."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, Mapping):
        if "height" in value and "width" in value and value["height"] == value["width"]:
            return int(value["height"])
        if "shortest_edge" in value and len(value) == 1:
            return int(value["shortest_edge"])
    return None


def processor_input_side(processor: Mapping[str, Any]) -> int | None:
    """The side of the square the processor feeds the model (crop size if it crops)."""
    if processor.get("do_center_crop") and "crop_size" in processor:
        return _side(processor["crop_size"])
    return _side(processor.get("size"))


def tokenizer_vocab(directory: Path) -> tuple[int | None, int | None]:
    """(highest token id + 1, model_max_length) read from tokenizer files, without transformers."""
    top = -1
    data = _read_json(directory / "tokenizer.json")
    vocab = _sub(data, "model").get("vocab") if data else None
    if isinstance(vocab, Mapping):
        top = max([top, *(int(v) for v in vocab.values() if isinstance(v, int))])
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        top = max(top, len(vocab) - 1)
    for tok in data.get("added_tokens", []) if data else []:
        if isinstance(tok, Mapping) and isinstance(tok.get("id"), int):
            top = max(top, tok["id"])
    if top < 0:
        plain = _read_json(directory / "vocab.json")
        if plain:
            top = max(int(v) for v in plain.values() if isinstance(v, int))
    added = _read_json(directory / "added_tokens.json")
    if added:
        top = max([top, *(int(v) for v in added.values() if isinstance(v, int))])
    tok_config = _read_json(directory / "tokenizer_config.json")
    for key in tok_config.get("added_tokens_decoder", {}) or {}:
        if str(key).isdigit():
            top = max(top, int(key))
    max_len = tok_config.get("model_max_length")
    return (top + 1 if top >= 0 else None), (int(max_len) if isinstance(max_len, (int, float)) else None)


def consistency_issues(
    model_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    processor_dir: str | Path | None = None,
) -> list[Difference]:
    """Semantic mismatches between ``config.json`` and the tokenizer and processor files."""
    model = Path(model_dir)
    config = _read_json(model / "config.json")
    if not config:
        raise CompatibilityError(f"{model} has no readable config.json", (), code="model_file_invalid")
    issues: list[Difference] = []
    vision = _sub(config, "vision_config")
    text = _sub(config, "text_config")
    processor = _processor_config(Path(processor_dir) if processor_dir else model)
    if processor:
        side = processor_input_side(processor)
        image_size = vision.get("image_size")
        if isinstance(image_size, int) and side is not None and side != image_size:
            issues.append(
                Difference("processor", image_size, side, "the processor's output size is not the model's image_size")
            )
        patch = vision.get("patch_size")
        if isinstance(patch, int) and patch > 0 and side is not None and side % patch:
            issues.append(
                Difference("processor", f"a multiple of {patch}", side, "size is not a whole number of patches")
            )
        channels = int(vision.get("num_channels", 3) or 3)
        for key in ("image_mean", "image_std"):
            stats = processor.get(key)
            if isinstance(stats, list) and len(stats) != channels:
                issues.append(Difference("processor", channels, len(stats), f"{key} does not match num_channels"))
        std = processor.get("image_std")
        if isinstance(std, list) and any(not isinstance(s, (int, float)) or s <= 0 for s in std):
            issues.append(Difference("processor", "> 0", std, "image_std has a zero or negative entry"))
    tok_dir = Path(tokenizer_dir) if tokenizer_dir else model
    n_tokens, max_len = tokenizer_vocab(tok_dir)
    vocab_size = text.get("vocab_size")
    if isinstance(vocab_size, int) and n_tokens is not None and n_tokens > vocab_size:
        issues.append(
            Difference(
                "tokenizer", vocab_size, n_tokens, "the tokenizer has token ids beyond the model's embedding table"
            )
        )
    positions = text.get("max_position_embeddings")
    if isinstance(positions, int) and max_len is not None:
        if max_len >= _NO_LIMIT:
            issues.append(
                Difference(
                    "tokenizer",
                    positions,
                    "no limit",
                    "the tokenizer does not truncate; pass max_length or texts overflow the positions",
                    severity="warning",
                )
            )
        elif max_len > positions:
            issues.append(
                Difference("tokenizer", positions, max_len, "model_max_length exceeds the model's position embeddings")
            )
    return issues


def check_consistency(
    model_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    processor_dir: str | Path | None = None,
) -> None:
    """Raise :class:`CompatibilityError` (code ``config_mismatch``) on any error-level issue."""
    errors = [
        d
        for d in consistency_issues(model_dir, tokenizer_dir=tokenizer_dir, processor_dir=processor_dir)
        if d.severity == "error"
    ]
    if errors:
        detail = "; ".join(str(d) for d in errors)
        raise CompatibilityError(f"model files disagree with config.json: {detail}", errors, code="config_mismatch")


_PROCESSOR_FIELDS = (
    "size",
    "crop_size",
    "do_center_crop",
    "do_resize",
    "resample",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "do_convert_rgb",
)


def compare_processors(
    expected: Mapping[str, Any] | str | Path, actual: Mapping[str, Any] | str | Path, *, tolerance: float = 1e-6
) -> list[Difference]:
    """Differences in the fields that change pixels (size, crop, resample, rescale, mean/std).

    Formatting, key order and unrelated fields (processor class name, auto_map) are ignored.
    """
    a = expected if isinstance(expected, Mapping) else _processor_config(Path(expected))
    b = actual if isinstance(actual, Mapping) else _processor_config(Path(actual))
    diffs = []
    for key in _PROCESSOR_FIELDS:
        left, right = a.get(key), b.get(key)
        if key in ("size", "crop_size"):
            left, right = _side(left) or left, _side(right) or right
        if not _same(left, right, tolerance):
            diffs.append(Difference("processor", left, right, f"{key} differs"))
    return diffs


def _same(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k], tol) for k in a)
    return bool(a == b)
