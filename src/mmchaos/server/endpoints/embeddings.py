"""``POST /v1/embeddings``: OpenAI's embeddings of texts and images, one vector per input.

A request's items are one model batch per modality; with batching on, so are the items of every
request in the same batch (:mod:`mmchaos.server.batcher`): one ``embed_texts`` and one
``embed_images`` call for all of them. The vectors are checked (shape, finite) before any is sent,
and fed to the drift monitor.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Request
from fastapi.responses import Response

from mmchaos.guard.preflight import estimate_tokens
from mmchaos.server.core import GuardedServer
from mmchaos.server.errors import BadModelOutput, ServerError
from mmchaos.server.http_errors import ERROR_RESPONSES
from mmchaos.server.inputs import Item, embedding_items
from mmchaos.server.protocol import EmbeddingRequest, EmbeddingResponse
from mmchaos.server.respond import disconnected, guarded, json_response, server_of
from mmchaos.targets.base import Capability

__all__ = ["embed_batch", "embed_job", "router"]

FloatArray = npt.NDArray[np.float32]

router = APIRouter()


def _encode(vector: FloatArray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    out: list[float] = vector.tolist()
    return out


def _check_capability(server: GuardedServer, items: Sequence[Item]) -> None:
    for item in items:
        cap = Capability.EMBED_TEXT if item.modality == "text" else Capability.EMBED_IMAGE
        if not server.target.has(cap):
            raise ServerError(
                f"{server.model_name} cannot embed {item.modality} inputs", code="capability_missing",
                param=item.param,
            )  # fmt: skip


def _check_embeddings(out: Any, n: int) -> FloatArray:
    try:
        arr = np.asarray(out, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise BadModelOutput(f"the model returned no embedding array: {exc}", code="bad_model_output") from exc
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] == 0:
        raise BadModelOutput(
            f"the model returned shape {arr.shape} for {n} inputs (expected ({n}, D))", code="bad_model_output"
        )
    if not np.isfinite(arr).all():
        raise BadModelOutput("the model returned NaN or infinite embedding values", code="non_finite_output")
    return arr


#: One request's decoded inputs: each item's modality and value, in input order.
_Inputs = tuple[tuple[str, ...], list[Any]]


def embed_batch(server: GuardedServer, requests: Sequence[_Inputs], cancel: threading.Event) -> list[FloatArray]:
    """The vectors of several requests' inputs: one model call per modality for all of them, the
    rows handed back to each request in its input order."""
    by_modality: dict[str, list[tuple[int, int]]] = {}  # modality -> (request, item) in call order
    for r, (modalities, _) in enumerate(requests):
        for i, modality in enumerate(modalities):
            by_modality.setdefault(modality, []).append((r, i))
    outs: list[FloatArray | None] = [None] * len(requests)
    for modality, where in by_modality.items():
        batch = [requests[r][1][i] for r, i in where]
        fn = server.target.embed_texts if modality == "text" else server.target.embed_images
        tentative = len(requests) > 1  # a failing batch of several is run again one request at a time
        vectors = server.model.call(modality, fn, batch, _check_embeddings, cancel, tentative=tentative)
        for row, (r, i) in enumerate(where):
            out = outs[r]
            if out is None:
                out = outs[r] = np.empty((len(requests[r][0]), vectors.shape[1]), dtype=np.float32)
            elif vectors.shape[1] != out.shape[1]:
                raise BadModelOutput(
                    f"text and image embeddings differ in size ({out.shape[1]} vs {vectors.shape[1]})",
                    code="bad_model_output",
                )
            out[i] = vectors[row]
    done = [o for o in outs if o is not None]
    assert len(done) == len(requests)  # no request has no items
    return done


def embed_job(server: GuardedServer, items: Sequence[Item], cancel: threading.Event) -> FloatArray:
    """The worker's part: decode every input, then the model call (batched with other requests'
    when batching is on), the vectors in input order, fed to the drift monitor."""
    modalities = tuple(i.modality for i in items)
    runner = partial(embed_batch, server)
    if server.batcher is None:
        out = runner([(modalities, server.model.decode(items, cancel))], cancel)[0]
    else:
        with server.batcher.joining() as submit:
            values = server.model.decode(items, cancel)
            out = submit(("embed",), (modalities, values), runner, cancel)
    if server.guards:
        for modality in dict.fromkeys(modalities):
            server.drift.update(modality, out[[m == modality for m in modalities]])
    return out


@router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERROR_RESPONSES, tags=["openai"])
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    """Embed texts and images (``image_url`` parts with ``data:`` URLs); one vector per input."""
    server = server_of(request)
    server.check_model(body.model)
    items = embedding_items(body, server.config.max_items, server.model.detokenize)
    _check_capability(server, items)
    if body.dimensions is not None and body.dimensions < 1:
        raise ServerError("dimensions must be a positive integer", code="dimensions_unsupported", param="dimensions")
    pixels = server.declared_pixels(items)
    job = partial(embed_job, server, items)
    vectors = await guarded(lambda: server.work.run(job, pixels=pixels, gone=disconnected(request)))
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise ServerError(
            f"this model's embeddings have {vectors.shape[1]} dimensions", code="dimensions_unsupported",
            param="dimensions",
        )  # fmt: skip
    tokens = sum(estimate_tokens(i.value) if i.modality == "text" else 1 for i in items)
    return json_response(
        {
            "id": f"embd-{request.state.request_id}",
            "object": "list",
            "created": int(time.time()),
            "data": [
                {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "model": server.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
