"""What the unit and integration halves of ``test_generation_integration.py`` share.

Those tests: Step 5 on generative targets: thread safety and determinism of ``generate``.
"""

from __future__ import annotations

from mmchaos.data.vqa import make_vqa
from mmchaos.findings import Finding

DATA = make_vqa(8, seed=5)


def _by(findings: list[Finding], key: str) -> dict[str, Finding]:
    return {f.evidence[key]: f for f in findings}
