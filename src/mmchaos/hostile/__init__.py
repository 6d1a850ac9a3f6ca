"""Hostile and malformed inputs, generated on the fly: the step-1 corpus as a library.

The ``contract`` check runs every case against a target; ``contract_fuzz`` and :mod:`mmchaos.fuzz`
seed their queues with its valid files. A library layer like :mod:`mmchaos.perturb`: it imports
only :mod:`mmchaos.guard` (the declared-size rule), so the fuzzer and the checks both build on it.
"""

from __future__ import annotations

from mmchaos.hostile.corpus import CASES, Case, CorpusBase, Expect, Kind, Payload, case_names, get_case, select_cases

__all__ = ["CASES", "Case", "CorpusBase", "Expect", "Kind", "Payload", "case_names", "get_case", "select_cases"]
