"""Step 4: the model exported to ONNX and run by ONNX Runtime must answer like PyTorch.

The white-box target is exported (dynamic batch and sequence axes, as ``mmchaos export`` does)
to a temporary directory. The same preprocessed tensors then go through torch and ONNX Runtime at
each batch size (and, for texts, at short and full sequence lengths, so the dynamic axes are
exercised); shapes, dtypes, max abs difference and cosine are compared. Then the exported
directory is loaded as an ``onnx:`` target and compared end to end with the original on the same
raw inputs, which catches tokenizer or processor files that did not travel. A shape that differs
(a batch or sequence size baked into the graph) is flagged as a silent shape change.

``dtype: float16`` exports the half-precision graph a GPU deployment serves (``mmchaos export
--dtype float16``) and compares it with torch at float32 under the fp16 gates: the deviation is
reported, and only values that overflow half precision or drift past the gates fail. Each graph
input's element type is compared with what the target's own preprocessing feeds it: ONNX Runtime
refuses any mismatch ("Unexpected input data type"), so a pipeline that feeds int32 ids to an
int64 graph, or float64 pixels to a float32 one, fails in serving however close the numbers are.
The float32 pixels an fp16 graph is fed are the one intended cast: reported, not failed (the
``onnx:`` target casts them at the boundary; a server that feeds them raw must too).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from mmchaos._lazy import require
from mmchaos.checks.base import Check, CheckContext, Gate, Params
from mmchaos.findings import Artifact, Finding, Severity, Step, Verdict
from mmchaos.targets.base import Capability, Target
from mmchaos.targets.wrappers import unwrap
from mmchaos.timing import model_busy

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
    dtype: Literal["float32", "float16"] = Field(
        default="float32", description="the exported graph's precision (float16: as `mmchaos export --dtype float16`)"
    )
    keep_export: str | None = Field(
        default=None, description="write the export here (for a repro) instead of a temp dir"
    )


class BackendDifferentialGate(Gate):
    max_rel_diff: float = Field(default=1e-4, ge=0.0, description="max |torch - ORT| / max |torch|")
    min_cosine: float = Field(default=0.99999, ge=-1.0, le=1.0)
    fp16_max_rel_diff: float = Field(default=1e-2, ge=0.0, description="max_rel_diff for a float16 graph")
    fp16_min_cosine: float = Field(default=0.999, ge=-1.0, le=1.0, description="min_cosine for a float16 graph")

    def limits(self, dtype: str) -> tuple[float, float]:
        """(max rel diff, min cosine) for a graph of ``dtype``."""
        if dtype == "float16":
            return self.fp16_max_rel_diff, self.fp16_min_cosine
        return self.max_rel_diff, self.min_cosine


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
            from mmchaos.targets.onnx import OnnxTarget

            # The export traces the model and ORT builds its sessions: model work the timing wrapper
            # around ctx.target cannot see (it goes to the unwrapped module), so it is timed here.
            with model_busy(ctx.target):
                export_onnx(target, where, opset=p.opset, overwrite=True, validate=False, dtype=p.dtype)
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
            if got.dtype != ref.dtype and str(got.dtype) != self.params.dtype:
                problems.append(f"{label}: dtype {got.dtype} from ONNX Runtime, {ref.dtype} from torch")
            if not np.isfinite(got).all():
                bad = int((~np.isfinite(got)).sum())
                problems.append(f"{label}: {bad} non-finite values from ONNX Runtime (past {got.dtype}'s range)")
                continue
            max_rel, min_cos = g.limits(self.params.dtype)
            if not (rel <= max_rel and cos >= min_cos):
                problems.append(f"{label}: max rel diff {rel:.2e}, min cosine {cos:.6f}")
        return metrics, problems, detail

    def _ort(
        self, exported: Any, kind: str, feeds: dict[str, np.ndarray], types: dict[str, dict[str, Any]]
    ) -> np.ndarray | str:
        """Run the raw graph on what the pipeline produced; each input whose element type differs
        from the graph's is recorded in ``types`` and cast, so the numbers are still compared."""
        from mmchaos.targets.onnx import graph_input_types

        session = exported.sessions[kind]
        ready: dict[str, np.ndarray] = {}
        for name, graph in graph_input_types(session).items():
            if name not in feeds:
                continue
            value = feeds[name]
            if graph is not None and value.dtype != graph:
                intended = self.params.dtype == "float16" and graph == np.float16 and value.dtype == np.float32
                types[name] = {"graph": str(graph), "fed": str(value.dtype), "intended": intended}
                value = value.astype(graph)
            ready[name] = value
        try:
            return np.asarray(session.run(None, ready)[0])
        except Exception as exc:  # onnxruntime's errors are untyped; the message is the finding
            return f"{type(exc).__name__}: {exc}"

    def _image(self, ctx: CheckContext, target: Target, exported: Any, images: list[Any]) -> Finding:
        p = self.params
        g = self.gate
        from mmchaos.targets.export import towers

        tower, _ = towers(target.torch_module())
        runs: list[tuple[str, np.ndarray, Any]] = []
        inputs: dict[str, Any] = {}
        types: dict[str, dict[str, Any]] = {}
        with model_busy(ctx.target):  # both backends' calls: model time (see run)
            for b in p.batch_sizes:
                pixels = target.preprocess_images(images[:b])  # type: ignore[attr-defined]
                ref = self._torch(tower, pixels)
                inputs[f"pixel_values_b{b}"] = pixels.numpy()
                ort = self._ort(exported, "image", {"pixel_values": pixels.numpy()}, types)
                runs.append((f"tensor_b{b}", ref, ort))
            n = max(p.batch_sizes)
            try:
                e2e: np.ndarray | str = np.asarray(exported.embed_images(images[:n]))
            except Exception as exc:
                e2e = f"{type(exc).__name__}: {exc}"
            runs.append((f"end_to_end_b{n}", np.asarray(target.embed_images(images[:n])), e2e))
        return self._finding(ctx, "image", runs, g, inputs, types)

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
        types: dict[str, dict[str, Any]] = {}
        cases = [(f"tensor_b{b}", pool[:b]) for b in p.batch_sizes]
        cases += [("tensor_short_seq", ["a"]), ("tensor_full_seq", [long_text]), ("tensor_mixed", pool[-3:])]
        with model_busy(ctx.target):  # both backends' calls: model time (see run)
            for label, batch in cases:
                enc = target.tokenize(batch)  # type: ignore[attr-defined]
                ref = self._torch(tower, enc["input_ids"], enc["attention_mask"])
                feeds = {k: v.numpy() for k, v in enc.items()}
                inputs.update({f"{label}_{k}": v for k, v in feeds.items()})
                runs.append((label, ref, self._ort(exported, "text", feeds, types)))
            try:
                e2e: np.ndarray | str = np.asarray(exported.embed_texts(pool))
            except Exception as exc:
                e2e = f"{type(exc).__name__}: {exc}"
            runs.append((f"end_to_end_b{len(pool)}", np.asarray(target.embed_texts(pool)), e2e))
        return self._finding(ctx, "text", runs, g, inputs, types)

    def _finding(
        self,
        ctx: CheckContext,
        kind: str,
        runs: list[tuple[str, np.ndarray, Any]],
        g: BackendDifferentialGate,
        inputs: dict[str, Any],
        types: dict[str, dict[str, Any]],
    ) -> Finding:
        p = self.params
        metrics, problems, detail = self._compare_runs(runs, g)
        problems = [
            f"graph input {name} takes {t['graph']} but the pipeline feeds {t['fed']}: ONNX Runtime refuses it "
            "(Unexpected input data type)"
            for name, t in types.items()
            if not t["intended"]
        ] + problems
        evidence: dict[str, Any] = {
            "modality": kind,
            "runs": detail,
            "dtype": p.dtype,
            "input_types": types,
            "opset": p.opset,
            "exporter": "torch.onnx.export(dynamo=False), dynamic batch/sequence axes",
            "seed": ctx.seed,
        }
        max_rel, min_cos = g.limits(p.dtype)
        gate = (f"same shapes; graph inputs fed their own element types; max rel diff <= {max_rel:g}; "
                f"min cosine >= {min_cos:g} ({p.dtype} graph)")  # fmt: skip
        rels = [v for k, v in metrics.items() if k.endswith("max_rel_diff")]
        if rels:
            metrics["max_rel_diff"] = max(rels)
        cast = [f"{n} {t['fed']} -> {t['graph']}" for n, t in types.items() if t["intended"]]
        if not problems:
            return self.finding(
                ctx,
                Verdict.PASS,
                f"{kind}: ONNX Runtime ({p.dtype}) matches torch (max rel diff {max(rels, default=0.0):.1e}, "
                f"batch sizes {', '.join(map(str, p.batch_sizes))})",
                message=f"cast at the graph's boundary: {', '.join(cast)} (the onnx: target does; a server feeding "
                "the preprocessor's tensors raw must too)"
                if cast
                else "",
                metrics=metrics,
                gate=gate,
                evidence=evidence,
            )
        artifact = Artifact(f"{ctx.check_id}-{kind}-inputs.npz", _npz(inputs), "application/x-npz")
        evidence["input_artifact"] = artifact.name
        evidence["replay"] = "mmchaos export TARGET DIR, then feed the arrays of the .npz to both backends"
        silent = any("silent shape change" in x or "refuses it" in x for x in problems)
        return self.finding(
            ctx,
            Verdict.FAIL,
            f"{kind}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            severity=Severity.HIGH if silent or any("failed" in x for x in problems) else Severity.MEDIUM,
            metrics=metrics,
            gate=gate,
            message="; ".join(problems)[:1000],
            suggestion="cast each input to the graph's element type where the pipeline hands it over"
            if any("refuses it" in x for x in problems)
            else "export with dynamic axes and without Python-int shape arithmetic (use tensor ops on "
            "x.shape), or torch.export; check custom ops' ONNX symbolic functions",
            evidence=evidence,
            artifacts=[artifact],
        )
