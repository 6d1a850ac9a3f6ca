"""``mmchaos export TARGET DIR``: write an ONNX directory that ``onnx:DIR`` loads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mmchaos.cli.target_flags import with_target_flags
from mmchaos.targets.options import TargetOptions

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""

    @app.command("export")
    @with_target_flags
    def export(
        target: Annotated[str, typer.Argument(help="a white-box target URI: builtin:tiny-clip, hf:PATH")],
        directory: Annotated[Path, typer.Argument(help="where to write the ONNX files and preprocessing files")],
        opset: Annotated[int, typer.Option("--opset", help="ONNX opset version")] = 17,
        dtype: Annotated[
            str, typer.Option("--dtype", help="graph precision: float32, or float16 (inputs and outputs too)")
        ] = "float32",
        force: Annotated[bool, typer.Option("--force", help="overwrite a non-empty DIR")] = False,
        validate: Annotated[
            bool, typer.Option("--validate/--no-validate", help="compare ONNX Runtime with torch after export")
        ] = True,
        options: TargetOptions | None = None,
    ) -> None:
        """Export a white-box target to ONNX (dynamic batch/sequence axes) plus its tokenizer and processor."""
        from mmchaos.errors import ConfigError
        from mmchaos.report.files import writable_dir
        from mmchaos.targets import load_target, resolve_target_options
        from mmchaos.targets.export import EXPORT_DTYPES, export_onnx

        resolve_target_options(target, options)  # an option the scheme does not take: exit 2 now
        if dtype not in EXPORT_DTYPES:
            raise ConfigError(f"--dtype {dtype}: choose one of {', '.join(EXPORT_DTYPES)}", code="bad_export_dtype")
        writable_dir(directory, "export folder")  # before loading the model, not after
        loaded = load_target(target, options)
        try:
            result = export_onnx(
                loaded, directory, opset=opset, overwrite=force, validate=validate,
                dtype="float16" if dtype == "float16" else "float32",
            )  # fmt: skip
        finally:
            loaded.close()
        typer.echo(f"exported {target} to {directory}: {', '.join(result.files.values())}")
        for name, value in result.differences.items():
            typer.echo(f"  {name}: {value:.2e}")
        typer.echo(f"load it with --target onnx:{directory}")
