"""What the unit and integration halves of ``test_integration_checks.py`` share.

Those tests: Step 5 checks: thread safety, determinism, fingerprint match; correct twins pass, broken ones fail.
"""

from __future__ import annotations

from typing import Any

from mmchaos.data.shapes import make_shapes
from mmchaos.findings import Finding
from tests.fakes import broken_targets as bt
from tests.support import run_check

DATA = make_shapes(16, seed=4)


def _run(check: Any, target: Any, data: Any = DATA) -> list[Finding]:
    return run_check(check, target, data)


class LastBitJitterTarget(bt.ContractSafeTarget):
    """Correct, but like a server with dynamic batching: each call's floats differ in the last bits.

    The relative change is ~1e-7 (one float32 ulp), new on every call, so no two runs are
    bit-identical, though every answer is the same.
    """

    def _jitter(self, out: Any) -> Any:
        import numpy as np

        rng = np.random.default_rng()
        wide = np.asarray(out, np.float64)
        return (wide * (1.0 + 1e-7 * rng.standard_normal(wide.shape))).astype(np.float32)

    def embed_images(self, images: Any) -> Any:
        return self._jitter(super().embed_images(images))

    def embed_texts(self, texts: Any) -> Any:
        return self._jitter(super().embed_texts(texts))
