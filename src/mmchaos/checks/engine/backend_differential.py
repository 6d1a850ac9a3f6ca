"""Step 4: the model exported to ONNX and run by ONNX Runtime must answer like PyTorch.

The white-box target is exported (dynamic batch and sequence axes, as ``mmchaos export`` does)
to a temporary directory. The same preprocessed tensors then go through torch and ONNX Runtime at
each batch size (and, for texts, at short and full sequence lengths, so the dynamic axes are
exercised); shapes, dtypes, max abs difference and cosine are compared. Then the exported
directory is loaded as an ``onnx:`` target and compared end to end with the original on the same
raw inputs, which catches tokenizer or processor files that did not travel. A shape that differs
(a batch or sequence size baked into the graph) is flagged as a silent shape change.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from mmchaos._lazy import require
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap

__all__ = ["BackendDifferential"]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    denom = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.where(denom > 0, (a64 * b64).sum(axis=1) / np.where(denom > 0, denom, 1.0), np.nan)


def _npz(arrays: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    named: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items()}
    np.savez_compressed(buf, **named)
    return buf.getvalue()


class BackendDifferentialParams(Params):
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 4], min_length=1)
    opset: int = Field(default=17, ge=11)
    keep_export: str | None = Field(
        default=None, description="write the export here (for a repro) instead of a temp dir"
    )


class BackendDifferentialGate(Gate):
    max_rel_diff: float = Field(default=1e-4, ge=0.0, description="max |torch - ORT| / max |torch|")
    min_cosine: float = Field(default=0.99999, ge=-1.0, le=1.0)


class BackendDifferential(Check[BackendDifferentialParams, BackendDifferentialGate]):
    """PyTorch vs ONNX Runtime on the exported model: shapes, dtypes, max diff, cosine, batch >1."""

    name = "backend_differential"
    step = Step.ENGINE
    requires = (
        frozenset({Capability.TORCH_MODULE, Capability.PREPROCESS, Capability.EMBED_IMAGE}),
        frozenset({Capability.TORCH_MODULE, Capability.PREPROCESS, Capability.EMBED_TEXT}),
    )

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        p = self.params
        target = unwrap(ctx.target)
        missing = [m for m in ("preprocess_images", "tokenize") if not callable(getattr(target, m, None))]
        if missing:
            yield self.finding(
                ctx, Verdict.SKIPPED, f"the target exposes no {' / '.join(missing)} to feed both backends"
            )
            return
        require("onnxruntime")
        from mmchaos.targets.export import export_onnx

        with tempfile.TemporaryDirectory(prefix="mmchaos-backend-") as tmp:
            where = Path(p.keep_export) if p.keep_export else Path(tmp) / "export"
            export_onnx(target, where, opset=p.opset, overwrite=True, validate=False)
            from mmchaos.targets.onnx import OnnxTarget

            exported = OnnxTarget(str(where))
            try:
                data = ctx.dataset.head(max(p.batch_sizes) * 2)
                if target.has(Capability.EMBED_IMAGE) and data.has_images:
                    images = [s.load_image() for s in data]
                    yield self._image(ctx, target, exported, images)
                if target.has(Capability.EMBED_TEXT):
                    texts = [s.caption or s.text or "" for s in data] or ["a photo"]
                    yield self._text(ctx, target, exported, texts)
            finally:
                exported.close()

    def _torch(self, tower: Any, *tensors: Any) -> np.ndarray:
        torch = require("torch")
        with torch.inference_mode():
            out = tower(*tensors)
        return np.asarray(out.detach().to("cpu", torch.float32).numpy())

    def _compare_runs(
        self, runs: list[tuple[str, np.ndarray, Any]], g: BackendDifferentialGate
    ) -> tuple[dict[str, float], list[str], dict[str, Any]]:
        """runs: (label, torch output, ORT output or an error string)."""
        metrics: dict[str, float] = {}
        problems: list[str] = []
        detail: dict[str, Any] = {}
        for label, ref, got in runs:
            if isinstance(got, str):
                problems.append(f"{label}: ONNX Runtime failed: {got[:200]}")
                detail[label] = {"error": got[:1000], "torch_shape": list(ref.shape)}
                continue
            row: dict[str, Any] = {"torch_shape": list(ref.shape), "ort_shape": list(got.shape),
                                   "torch_dtype": str(ref.dtype), "ort_dtype": str(got.dtype)}  # fmt: skip
            detail[label] = row
            if got.shape != ref.shape:
                problems.append(
                    f"{label}: silent shape change: ONNX Runtime returned {tuple(got.shape)}, torch {tuple(ref.shape)}"
                )
                continue
            scale = float(np.abs(ref).max()) or 1.0
            rel = float(np.abs(got.astype(np.float64) - ref).max() / scale)
            cos = float(np.nanmin(_cosines(ref, got))) if len(ref) else 1.0
            row.update(max_abs_diff=float(np.abs(got.astype(np.float64) - ref).max()), max_rel_diff=rel, min_cosine=cos)
            metrics[f"{label}_max_rel_diff"] = rel
            metrics[f"{label}_min_cosine"] = cos
            if got.dtype != ref.dtype:
                problems.append(f"{label}: dtype {got.dtype} from ONNX Runtime, {ref.dtype} from torch")
            if not (rel <= g.max_rel_diff and cos >= g.min_cosine):
                problems.append(f"{label}: max rel diff {rel:.2e}, min cosine {cos:.6f}")
        return metrics, problems, detail

    def _ort(self, exported: Any, kind: str, feeds: dict[str, np.ndarray]) -> np.ndarray | str:
        session = exported.sessions[kind]
        wanted = {i.name for i in session.get_inputs()}
        try:
            return np.asarray(session.run(None, {k: v for k, v in feeds.items() if k in wanted})[0])
        except Exception as exc:  # onnxruntime's errors are untyped; the message is the finding
            return f"{type(exc).__name__}: {exc}"

    def _image(self, ctx: CheckContext, target: Target, exported: Any, images: list[Any]) -> Finding:
        p = self.params
        g = self.gate
        from mmchaos.targets.export import towers

        tower, _ = towers(target.torch_module())
        runs: list[tuple[str, np.ndarray, Any]] = []
        inputs: dict[str, Any] = {}
        for b in p.batch_sizes:
            pixels = target.preprocess_images(images[:b])  # type: ignore[attr-defined]
            ref = self._torch(tower, pixels)
            inputs[f"pixel_values_b{b}"] = pixels.numpy()
            runs.append((f"tensor_b{b}", ref, self._ort(exported, "image", {"pixel_values": pixels.numpy()})))
        n = max(p.batch_sizes)
        try:
            e2e: np.ndarray | str = np.asarray(exported.embed_images(images[:n]))
        except Exception as exc:
            e2e = f"{type(exc).__name__}: {exc}"
        runs.append((f"end_to_end_b{n}", np.asarray(target.embed_images(images[:n])), e2e))
        return self._finding(ctx, "image", runs, g, inputs)

    def _text(self, ctx: CheckContext, target: Target, exported: Any, texts: list[str]) -> Finding:
        p = self.params
        g = self.gate
        from mmchaos.targets.export import towers

        _, tower = towers(target.torch_module())
        long = " ".join((" ".join(texts) + " ") * 8).split()
        long_text = " ".join(long[:400])  # past the limit: exercises truncation in both pipelines
        pool = [*texts, long_text, "a"]
        runs: list[tuple[str, np.ndarray, Any]] = []
        inputs: dict[str, Any] = {}
        cases = [(f"tensor_b{b}", pool[:b]) for b in p.batch_sizes]
        cases += [("tensor_short_seq", ["a"]), ("tensor_full_seq", [long_text]), ("tensor_mixed", pool[-3:])]
        for label, batch in cases:
            enc = target.tokenize(batch)  # type: ignore[attr-defined]
            ref = self._torch(tower, enc["input_ids"], enc["attention_mask"])
            feeds = {k: v.numpy() for k, v in enc.items()}
            inputs.update({f"{label}_{k}": v for k, v in feeds.items()})
            runs.append((label, ref, self._ort(exported, "text", feeds)))
        try:
            e2e: np.ndarray | str = np.asarray(exported.embed_texts(pool))
        except Exception as exc:
            e2e = f"{type(exc).__name__}: {exc}"
        runs.append((f"end_to_end_b{len(pool)}", np.asarray(target.embed_texts(pool)), e2e))
        return self._finding(ctx, "text", runs, g, inputs)

    def _finding(
        self,
        ctx: CheckContext,
        kind: str,
        runs: list[tuple[str, np.ndarray, Any]],
        g: BackendDifferentialGate,
        inputs: dict[str, Any],
    ) -> Finding:
        p = self.params
        metrics, problems, detail = self._compare_runs(runs, g)
        evidence: dict[str, Any] = {
            "modality": kind,
            "runs": detail,
            "opset": p.opset,
            "exporter": "torch.onnx.export(dynamo=False), dynamic batch/sequence axes",
            "seed": ctx.seed,
        }
        gate = f"same shapes and dtypes; max rel diff <= {g.max_rel_diff:g}; min cosine >= {g.min_cosine:g}"
        rels = [v for k, v in metrics.items() if k.endswith("max_rel_diff")]
        if rels:
            metrics["max_rel_diff"] = max(rels)
        if not problems:
            return self.finding(
                ctx,
                Verdict.PASS,
                f"{kind}: ONNX Runtime matches torch (max rel diff {max(rels, default=0.0):.1e}, "
                f"batch sizes {', '.join(map(str, p.batch_sizes))})",
                metrics=metrics,
                gate=gate,
                evidence=evidence,
            )
        artifact = Artifact(f"{ctx.check_id}-{kind}-inputs.npz", _npz(inputs), "application/x-npz")
        evidence["input_artifact"] = artifact.name
        evidence["replay"] = "mmchaos export TARGET DIR, then feed the arrays of the .npz to both backends"
        silent = any("silent shape change" in x for x in problems)
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"{kind}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            severity=Severity.HIGH if silent or any("failed" in x for x in problems) else Severity.MEDIUM,
            metrics=metrics,
            gate=gate,
            message="; ".join(problems)[:1000],
            suggestion="export with dynamic axes and without Python-int shape arithmetic (use tensor ops on "
            "x.shape), or torch.export; check custom ops' ONNX symbolic functions",
            evidence=evidence,
            artifacts=[artifact],
        )
