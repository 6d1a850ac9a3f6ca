"""The validate path stays light until it loads the target.

``mmchaos validate`` spends its time outside the checks in loading the target (for builtin:tiny-clip:
torch and transformers' CLIP modelling code, which itself pulls torch._dynamo, torch.distributed
and scipy.optimize). Everything before that (the CLI, the runner, building a suite's checks) must not
import those packages at module level, or a run against a served or ONNX target pays for them too.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "scipy", "sklearn", "onnxruntime")

PROBE = """
import json, sys
import mmchaos.cli, mmchaos.cli.validate_cmd, mmchaos.runner
from mmchaos.suites import build_checks, load_suite
for name in ("quick", "prelaunch"):
    build_checks(load_suite(name))
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
"""


@pytest.mark.integration  # a child interpreter, so the modules other tests imported do not count
def test_validate_path_before_the_target_load_imports_no_heavy_package() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE % (HEAVY,)], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
