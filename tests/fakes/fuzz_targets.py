"""Targets with planted decode bugs for the fuzzer's tests, and their correct twin.

Numpy targets (fast to start in worker processes), importable as ``py:tests.fakes.fuzz_targets:NAME``.
Each bug is one a real decoder has had: a native chunk parser that crashes on a chunk it never
expected, and an orientation table indexed with the EXIF value as given.
"""

from __future__ import annotations

import ctypes
import io
import os
import signal
import struct
import time
from collections.abc import Sequence

import numpy as np

from mmchaos.executors.jobs import WorkerSpec
from mmchaos.targets.base import Target
from tests.fakes.broken_targets import ContractSafeTarget, HangOnTinyTarget, SegfaultOnCMYKTarget


def _png_chunk_types(blob: bytes) -> list[bytes]:
    if not blob.startswith(b"\x89PNG\r\n\x1a\n"):
        return []
    tags, pos = [], 8
    while pos + 12 <= len(blob):
        (length,) = struct.unpack(">I", blob[pos : pos + 4])
        tags.append(blob[pos + 4 : pos + 8])
        pos += 12 + length
    return tags


class SpltCrashTarget(ContractSafeTarget):
    """Broken: a native PNG reader that dereferences a null palette on a suggested-palette (sPLT) chunk."""

    uri = "py:tests.fakes.fuzz_targets:splt_crash"

    def decode_image(self, blob: bytes) -> np.ndarray:
        if b"sPLT" in _png_chunk_types(blob):
            ctypes.string_at(0)  # SIGSEGV, as the crashing C extension would
        return super().decode_image(blob)


# The transpose that turns stored pixels upright, indexed by the EXIF orientation value (0 unused).
_UPRIGHT: list[int | None] = [None, None, 0, 3, 1, 4, 2, 6, 5]


class OrientationTableTarget(ContractSafeTarget):
    """Broken: looks the EXIF orientation up in a 9-entry table, so orientation 9 and up raise IndexError."""

    uri = "py:tests.fakes.fuzz_targets:orientation_table"

    def decode_image(self, blob: bytes) -> np.ndarray:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(blob)) as img:
                orientation = int(img.getexif().get(0x0112, 1))
        except Exception:
            orientation = 1  # not this function's business: the real decoder below refuses it
        transpose = _UPRIGHT[orientation]  # the bug: no range check
        image = super().decode_image(blob)
        return image if transpose is None else np.ascontiguousarray(np.rot90(image, transpose % 4))


class CrashOrHangTarget(SegfaultOnCMYKTarget, HangOnTinyTarget):
    """Broken twice: a native decoder that segfaults on CMYK pictures, and an upscaler that never ends
    on a 1-pixel side (both bugs of :mod:`tests.fakes.broken_targets` in one target)."""

    uri = "py:tests.fakes.fuzz_targets:crash_or_hang"


class KillsItsParentOnTiffTarget(ContractSafeTarget):
    """Correct, but with ``MMCHAOS_TEST_KILL_PARENT_ON_TIFF`` set, decoding a TIFF SIGKILLs the worker's
    parent: the driver of a local run, as an out-of-memory kill of the driver would (resume tests)."""

    uri = "py:tests.fakes.fuzz_targets:kills_its_parent_on_tiff"

    def decode_image(self, blob: bytes) -> np.ndarray:
        if os.environ.get("MMCHAOS_TEST_KILL_PARENT_ON_TIFF") and blob[:4] in (b"II*\0", b"MM\0*"):
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(5)
        return super().decode_image(blob)


class ZeroForNoWordsTarget(ContractSafeTarget):
    """Broken, silently: a tokenizer that stops at a BOM, and mean pooling over no tokens gives zeros."""

    uri = "py:tests.fakes.fuzz_targets:zero_for_no_words"

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        kept = [t.split("\ufeff")[0] for t in texts]
        out = super().embed_texts([t if t.split() else "x" for t in kept])
        for i, t in enumerate(kept):
            if not t.split():
                out[i] = 0.0  # the bug: an answer for an input that has no content
        return out


def zero_for_no_words() -> Target:
    return ZeroForNoWordsTarget()


def splt_crash() -> Target:
    return SpltCrashTarget()


def orientation_table() -> Target:
    return OrientationTableTarget()


def crash_or_hang() -> Target:
    return CrashOrHangTarget()


def kills_its_parent_on_tiff() -> Target:
    return KillsItsParentOnTiffTarget()


def kill_or_stop_the_actor(target: Target, spec: WorkerSpec, payload: str) -> str:
    """Isolated job for the Ray executor's tests: ``kill`` SIGKILLs the Ray actor whose worker runs
    it (its parent process), ``stop`` freezes it; anything else is answered as it is."""
    if payload == "kill":
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(5)
    if payload == "stop":
        os.kill(os.getppid(), signal.SIGSTOP)
    return payload
