"""The serving-chaos experiment engine: steady-state hypothesis, faults, budgets and load.

    from mmchaos.chaos import LoadDriver, LoadConfig, embeddings_mix

Experiments read like Chaos Toolkit's: a steady-state hypothesis with tolerances, the method
(faults injected through :mod:`mmchaos.proxy`), rollbacks that always run, and a journal. The
load driver needs ``httpx``, imported when a run starts.

One job a module: ``spec`` (typed parameters), ``budget`` (the request ledger inside the
transport), ``windows`` (SLO windows, one load phase), ``deployment`` (server and proxy, and their
teardown), ``payloads`` (what is sent), ``experiment`` (the experiment and its journal), ``load``
(the bounded load driver). Nothing here imports :mod:`mmchaos.checks`; the checks use this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmchaos._lazy import lazy_exports

if TYPE_CHECKING:
    from mmchaos.chaos.load import (
        ERROR_KINDS,
        LatencySummary,
        LoadConfig,
        LoadDriver,
        LoadRequest,
        LoadResult,
        MixEntry,
        PayloadMix,
        RequestRecord,
        embeddings_mix,
        ensure_loopback,
        run_load,
    )

__all__ = [
    "ERROR_KINDS",
    "LatencySummary",
    "LoadConfig",
    "LoadDriver",
    "LoadRequest",
    "LoadResult",
    "MixEntry",
    "PayloadMix",
    "RequestRecord",
    "embeddings_mix",
    "ensure_loopback",
    "run_load",
]

_MODULE_OF = dict.fromkeys(__all__, "mmchaos.chaos.load")

__getattr__, __dir__ = lazy_exports("mmchaos.chaos", _MODULE_OF, globals())
