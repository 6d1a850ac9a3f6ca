"""Step 5: say loudly when a modality the target half supports could not be tested.

An endpoint that embeds texts but accepted no form of image would otherwise pass every gate with
no image ever sent. The target reports such gaps (:meth:`~mmchaos.targets.Target.untested_modalities`,
filled by the ``openai:`` probe); each becomes a ``warn`` finding, which ``--strict`` turns into
exit 1. A target that takes no input at all is warned about too. The pass finding also says when
the endpoint ignores or refuses chat logprobs (the probe asks for them).
"""

from __future__ import annotations

from collections.abc import Iterator

from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.findings import Finding, Severity, Step, Verdict
from mmchaos.targets.wrappers import unwrap

__all__ = ["ModalityCoverage"]


class ModalityCoverage(Check[Params, Gate]):
    """Warn for each modality the target handles in part but that could not be tested."""

    name = "modality_coverage"
    step = Step.INTEGRATION

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        target = ctx.target
        covered = sorted(c.value for c in target.capabilities)
        gaps = target.untested_modalities()
        endpoint = unwrap(target).describe().get("endpoint", {})  # the runner's timing wrapper describes no endpoint
        evidence = {"capabilities": covered, "described": endpoint.get("probe")}
        if not covered:
            yield self.finding(ctx, Verdict.WARN, "the target declares no capability: nothing can be tested",
                               severity=Severity.HIGH, evidence=evidence,
                               suggestion="declare the target's capabilities")  # fmt: skip
            return
        for modality, reason in sorted(gaps.items()):
            yield self.finding(
                ctx,
                Verdict.WARN,
                f"{modality} not tested: {reason[:160]}",
                severity=Severity.HIGH,
                gate="every modality the target handles is tested",
                message=reason,
                evidence={**evidence, "modality": modality},
                suggestion="send this modality in a form the server takes, or declare the target's capabilities",
            )
        if not gaps:
            logprobs = _LOGPROBS_NOTE.get(str(endpoint.get("logprobs")), "")
            yield self.finding(ctx, Verdict.PASS, f"tested: {', '.join(covered)}{logprobs}",
                               evidence={**evidence, "logprobs": logprobs.lstrip("; ") or None},
                               gate="every modality the target handles is tested")  # fmt: skip


_LOGPROBS_NOTE = {
    "ignored": "; the endpoint ignores logprobs (answers carry none): checks judge on the text",
    "refused": "; the endpoint refuses logprobs: checks judge on the text",
}
"""What an ``openai:`` endpoint's probe found about chat logprobs, said where a report reader looks first:
checks that compare logprobs fall back to black-box judgement on such a server."""
