"""``mmchaos export TARGET DIR``: write an ONNX directory that ``onnx:DIR`` loads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""

    @app.command("export")
    def export(
        target: Annotated[str, typer.Argument(help="a white-box target URI: builtin:tiny-clip, hf:PATH")],
        directory: Annotated[Path, typer.Argument(help="where to write the ONNX files and preprocessing files")],
        opset: Annotated[int, typer.Option("--opset", help="ONNX opset version")] = 17,
        force: Annotated[bool, typer.Option("--force", help="overwrite a non-empty DIR")] = False,
        validate: Annotated[
            bool, typer.Option("--validate/--no-validate", help="compare ONNX Runtime with torch after export")
        ] = True,
        trust_remote_code: Annotated[
            bool, typer.Option("--trust-remote-code", help="let hf: targets run code from the model repo")
        ] = False,
        allow_pickle: Annotated[
            bool, typer.Option("--allow-pickle-weights", help="let hf: targets load non-safetensors weights")
        ] = False,
    ) -> None:
        """Export a white-box target to ONNX (dynamic batch/sequence axes) plus its tokenizer and processor."""
        from mmchaos.report.files import writable_dir
        from mmchaos.targets import TargetOptions, load_target
        from mmchaos.targets.export import export_onnx

        writable_dir(directory, "export folder")  # before loading the model, not after
        loaded = load_target(
            target, TargetOptions(trust_remote_code=trust_remote_code, use_safetensors=not allow_pickle)
        )
        try:
            result = export_onnx(loaded, directory, opset=opset, overwrite=force, validate=validate)
        finally:
            loaded.close()
        typer.echo(f"exported {target} to {directory}: {', '.join(result.files.values())}")
        for name, value in result.differences.items():
            typer.echo(f"  {name}: {value:.2e}")
        typer.echo(f"load it with --target onnx:{directory}")
