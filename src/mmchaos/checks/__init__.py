"""The check registry. A new check is one module and one line here (or an entry point in the
``mmchaos.checks`` group)."""

from __future__ import annotations

from mmchaos.checks.base import AnyCheck, Check, CheckContext
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.registry import Registry

__all__ = ["REGISTRY", "Check", "CheckContext", "Finding", "Severity", "Step", "Verdict"]

REGISTRY: Registry[type[AnyCheck]] = Registry("check", "mmchaos.checks")
for _name, _spec in {
    "robustness": "mmchaos.checks.robustness.robustness:Robustness",
    "missing_modality": "mmchaos.checks.robustness.missing_modality:MissingModality",
    "batch_invariance": "mmchaos.checks.engine.batch_invariance:BatchInvariance",
    "contract": "mmchaos.checks.contract.contract:Contract",
    "contract_fuzz": "mmchaos.checks.contract.fuzz:ContractFuzz",
    "precision": "mmchaos.checks.engine.precision:Precision",
    "context_boundary": "mmchaos.checks.engine.context_boundary:ContextBoundary",
    "image_context_boundary": "mmchaos.checks.engine.image_context_boundary:ImageContextBoundary",
    "long_context_recall": "mmchaos.checks.engine.long_context:LongContextRecall",
    "image_token_consistency": "mmchaos.checks.engine.image_token_consistency:ImageTokenConsistency",
    "generation_precision": "mmchaos.checks.engine.generation_precision:GenerationPrecision",
    "generation_batch_invariance": "mmchaos.checks.engine.generation_batch_invariance:GenerationBatchInvariance",
    "backend_differential": "mmchaos.checks.engine.backend_differential:BackendDifferential",
    "thread_safety": "mmchaos.checks.integration.thread_safety:ThreadSafety",
    "determinism": "mmchaos.checks.integration.determinism:Determinism",
    "fingerprint_match": "mmchaos.checks.integration.fingerprint_match:FingerprintMatch",
    "reference_parity": "mmchaos.checks.integration.reference_parity:ReferenceParity",
    "modality_coverage": "mmchaos.checks.integration.modality_coverage:ModalityCoverage",
    "image_cache_isolation": "mmchaos.checks.integration.image_cache_isolation:ImageCacheIsolation",
    "multi_turn_consistency": "mmchaos.checks.integration.multi_turn_consistency:MultiTurnConsistency",
    "generation_semantics": "mmchaos.checks.integration.generation_semantics:GenerationSemantics",
    "serving_faults": "mmchaos.checks.serving.faults:ServingFaults",
    "serving_poison": "mmchaos.checks.serving.poison:ServingPoison",
    "serving_overload": "mmchaos.checks.serving.overload:ServingOverload",
    "serving_resilience": "mmchaos.checks.serving.resilience:ServingResilience",
    "serving_streaming": "mmchaos.checks.serving.streaming:ServingStreaming",
    "drift_detection": "mmchaos.checks.observability.drift_detection:DriftDetection",
    "metrics_exposure": "mmchaos.checks.observability.metrics_exposure:MetricsExposure",
    "generation_drift": "mmchaos.checks.observability.generation_drift:GenerationDrift",
    "adversarial_whitebox": "mmchaos.checks.adversarial.whitebox:WhiteBox",
    "adversarial_blackbox": "mmchaos.checks.adversarial.blackbox:BlackBox",
    "adversarial_transfer": "mmchaos.checks.adversarial.transfer:Transfer",
    "text_attack": "mmchaos.checks.adversarial.text_attack:TextAttack",
    "typographic_attack": "mmchaos.checks.adversarial.typographic_attack:TypographicAttack",
    "semantic_margin": "mmchaos.checks.adversarial.semantic_margin:SemanticMargin",
    "occlusion_attack": "mmchaos.checks.adversarial.occlusion:OcclusionAttack",
}.items():
    REGISTRY.register(_name, _spec)
