"""How many intra-op threads torch uses in the process that loads a target.

Torch's default is one thread per core. For the built-in tiny models that is the slow choice:
their operations are far too small to split, so every one of them pays the threads' hand-over,
and on a machine whose cores are busy with other work (a CI runner, a laptop running the
reference server and a load generator) a thread that waits for a core stalls every operation
(measured 7-14x slower than one thread at load average ~3 on 2 cores). Large models gain from the
threads, so for ``hf:`` targets the default stays torch's own. ``--threads N`` (``TargetOptions.threads``)
overrides either. The setting is per process (torch has no other), so it is applied when the
target loads, where the user asked for that target.
"""

from __future__ import annotations

from mmchaos.errors import ConfigError

__all__ = ["TINY_MODEL_THREADS", "apply_threads"]

TINY_MODEL_THREADS = 1
"""Intra-op threads for the built-in tiny models unless ``--threads`` says otherwise."""


def apply_threads(threads: int | None, default: int | None = None) -> int | None:
    """Set torch's intra-op threads to ``threads`` (or ``default``; None for both: leave torch's).

    Returns the number set, or None when nothing was changed."""
    wanted = threads if threads is not None else default
    if wanted is None:
        return None
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        raise ConfigError(f"threads must be a positive integer, got {wanted!r}", code="target_bad_threads")
    import torch  # already imported by the targets that call this

    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    return wanted
