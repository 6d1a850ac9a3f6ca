"""How much worse run B may be than run A before a difference is a regression.

A drop is judged on quality (the metric itself when higher is better, ``1 - value`` for error
rates such as CER), so one rule covers accuracy, recall@k and CER alike. A drop regresses when
it is larger than each of: ``relative`` times run A's quality (the part that scales with the
score: 5 % of 0.9 is more than 5 % of 0.2), ``absolute``, and what ``samples`` samples changing
their answer move the metric (one sample of 24 is 0.042, of 500 is 0.002): a single flipped
sample is noise at any sample count. Two runs of one model with one seed are identical, so
they always pass; two backends (fp32 vs fp16) flip a sample now and then, which this absorbs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mmchaos.errors import ConfigError

__all__ = ["DEFAULT_METRICS", "Tolerance", "Tolerances", "load_tolerances"]


class Tolerance(BaseModel):
    """The drop in quality allowed at one point of a curve."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    relative: float = Field(default=0.05, ge=0.0, le=1.0, description="share of run A's quality that may be lost")
    absolute: float = Field(default=0.02, ge=0.0, le=1.0, description="quality that may be lost whatever the score")
    samples: int = Field(default=1, ge=0, description="samples that may change their answer whatever the score")

    def allowed(self, quality_a: float, n_samples: int | None = None) -> float:
        """The largest drop from ``quality_a`` (a metric over ``n_samples``) that is not a regression."""
        by_samples = self.samples / n_samples if n_samples else 0.0
        return max(self.relative * max(quality_a, 0.0), self.absolute, by_samples)


DEFAULT_METRICS: dict[str, Tolerance] = {"cer": Tolerance(relative=0.05, absolute=0.01)}
"""The metric kinds whose default differs from ``default``. Scores (accuracy, recall@k,
discrimination, answer similarity) take ``default``: at most 5 % of run A's score lost, and
at least 0.02 (one sample in 50) is allowed. An error rate (CER) is read finer: a rise of 5 % of
its quality, at least 0.01, since a character error rate moves in small steps."""


class Tolerances(BaseModel):
    """Tolerances for a comparison: a default, then per task metric, then per perturbation (most specific wins).

    ``verdicts``: a finding that passed in run A and fails or errors in run B is a regression too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: Tolerance = Tolerance()
    metrics: dict[str, Tolerance] = Field(default_factory=lambda: dict(DEFAULT_METRICS))
    perturbations: dict[str, Tolerance] = Field(default_factory=dict)
    verdicts: bool = True

    def for_point(self, metric: str, perturbation: str) -> Tolerance:
        """The tolerance of one point of the ``metric`` curve of ``perturbation``."""
        if perturbation in self.perturbations:
            return self.perturbations[perturbation]
        return self.metrics.get(metric, self.default)

    def with_relative(self, relative: float) -> Tolerances:
        """These tolerances with every metric's relative part set to ``relative`` (the ``--tolerance`` flag).

        Per-perturbation entries of a file stay as written: they were declared for that perturbation.
        """
        if not 0.0 <= relative <= 1.0:
            raise ConfigError(f"--tolerance {relative} must be between 0 and 1", code="tolerances_invalid")
        return self.model_copy(
            update={
                "default": self.default.model_copy(update={"relative": relative}),
                "metrics": {k: v.model_copy(update={"relative": relative}) for k, v in self.metrics.items()},
            }
        )


def load_tolerances(path: Path | None) -> Tolerances:
    """The tolerances of a YAML file (its ``metrics`` add to the defaults), or the defaults; bad files exit 2."""
    if path is None:
        return Tolerances()
    import yaml

    from mmchaos._yaml import describe_yaml_error

    try:
        raw: Any = yaml.safe_load(Path(path).read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"cannot read --tolerances {path}: {why}", code="tolerances_invalid") from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"--tolerances {path}: not valid YAML: {describe_yaml_error(exc)}", code="tolerances_invalid"
        ) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"--tolerances {path} must be a mapping (default, metrics, perturbations, verdicts)",
            code="tolerances_invalid",
        )
    if isinstance(raw.get("metrics"), dict):
        raw = {**raw, "metrics": {**{k: v.model_dump() for k, v in DEFAULT_METRICS.items()}, **raw["metrics"]}}
    try:
        return Tolerances.model_validate(raw)
    except ValidationError as exc:
        from mmchaos.suites import format_validation_error

        raise ConfigError(format_validation_error(exc, f"--tolerances {path}"), code="tolerances_invalid") from None
