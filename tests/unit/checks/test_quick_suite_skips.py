"""docs/vlm.md names the checks a quick run on ``builtin:tiny-vlm`` skips: they are the quick suite's
checks whose required capabilities the ``hf:`` VLM target lacks, so the page cannot drift from the
suite (it said 5, the README 8, while runs skipped another number)."""

from __future__ import annotations

import re

from mmchaos.suites import build_checks, load_suite
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.hf_vlm import HFVisionLanguageTarget
from tests.paths import DOCS


class _Capabilities(Target):
    """Only what a check's skip decision reads: the capabilities of the ``hf:`` VLM target."""

    capabilities = HFVisionLanguageTarget.capabilities


def documented() -> tuple[int, list[str]]:
    text = (DOCS / "vlm.md").read_text(encoding="utf-8")
    before, after = text.split("<!-- quick-skips:start -->", 1)
    body = after.split("<!-- quick-skips:end -->", 1)[0]
    count = re.search(r"\b(\d+) checks\b", before.rstrip().rsplit("\n\n", 1)[-1])  # the paragraph before the list
    assert count, "docs/vlm.md: the sentence before the quick-skips list says how many checks"
    return int(count.group(1)), re.findall(r"`([a-z_]+)`", body)


def test_the_documented_quick_skips_are_the_checks_the_vlm_target_cannot_run() -> None:
    target = _Capabilities()
    assert Capability.GENERATE in target.capabilities
    skipped = [key for key, check in build_checks(load_suite("quick")) if check.missing_capabilities(target)]
    count, names = documented()
    assert names == skipped, f"docs/vlm.md lists {names}; the quick suite skips {skipped} on an hf: VLM"
    assert count == len(skipped)
