"""The catalogue of mmchaos's stable error codes: each code's one HTTP status and its meaning.

Codes are an API (scripts, dashboards and HTTP clients switch on them), so they live here as data
rather than as free strings at the raise sites: ``tests/unit/runs/test_error_codes.py`` fails on a code the
sources use that this table lacks (a typo would otherwise become a new code) and on an entry no
source uses; ``docs/error-codes.md`` is rendered from it by ``python scripts/error_codes.py``.

``status`` is the one HTTP status a server answers the code with. A code that never reaches HTTP
(a CLI, data or run-store error) gets the status an HTTP front end would answer if it did: 400 for
bad input to mmchaos, 404 for a name or stored thing that does not exist, 501 for a missing
optional extra, 500 for a failure on the serving side, 502/504 for an upstream that failed. The
server, the fault proxy's control API and the guards' ``http_status`` all read it from here.

Codes mmchaos passes through from elsewhere (a remote endpoint's own ``code``, ``http_<status>``
for an endpoint that gave none, a third-party plugin's) are not in the table; they keep the
status of their exception class (:attr:`mmchaos.errors.MMChaosError.http_status`).

Standard library only: :mod:`mmchaos.errors` imports it, and everything imports that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["CODES", "LAYERS", "Code", "status_of", "statuses"]


@dataclass(frozen=True, slots=True)
class Code:
    """One stable error code: its name, the HTTP status it is answered with, and what it means."""

    name: str
    status: int
    meaning: str
    layer: str = ""


#: The layers codes are grouped by, in the order docs/error-codes.md shows them: (key, heading).
LAYERS: tuple[tuple[str, str], ...] = (
    ("core", "Exception roots (the default code of each class in `mmchaos.errors`)"),
    ("data", "Datasets, data files and image loading (`mmchaos.data`, the CLI's input files)"),
    ("perturb", "Perturbations and attacks (`mmchaos.perturb`, `mmchaos.attacks`, adversarial checks)"),
    ("targets", "Targets: loading them and calling them (`mmchaos.targets`)"),
    ("run", "Runs: executors, the run store, reports, fuzz replays (`mmchaos.executors`, `store`, `report`)"),
    ("guard", "Runtime guards (`mmchaos.guard`: preflight, declared sizes, breaker, compat, drift, SLO)"),
    ("server", "The reference server (`mmchaos serve`, `mmchaos.server`)"),
    ("proxy", "The fault proxy, its control API and the load driver (`mmchaos.proxy`, `mmchaos.chaos`)"),
)

_ENTRIES: dict[str, list[tuple[str, int, str]]] = {
    "core": [
        ("mmchaos_error", 500, "an mmchaos error with no more specific code (the root's default)"),
        ("usage_error", 400, "bad input to mmchaos itself; the CLI exits 2"),
        ("config_invalid", 400, "a suite file, check parameter, CLI option or setting is invalid"),
        ("unknown_name", 404, "a registry name (check, perturbation, suite, scheme...) that does not exist"),
        ("data_invalid", 400, "a data file or saved request is not what it must be"),
        ("target_load_failed", 400, "a target URI names nothing that can be loaded"),
        ("missing_dependency", 501, "an optional extra is not installed; the message names the pip install"),
        ("store_error", 500, "the run store cannot be opened or used"),
        ("capability_missing", 400, "a check or request asked a target for something it cannot do"),
        ("target_call_failed", 422, "the target refused an input or returned garbage during a call"),
    ],
    "data": [
        ("data_bad_encoding", 400, "a data or input text file is not UTF-8"),
        ("data_bad_row", 400, "a dataset row has unknown or missing fields"),
        ("data_bad_spec", 400, "a --data value names no built-in dataset or readable file"),
        ("data_empty", 400, "a dataset or payload file has no rows"),
        ("data_inconsistent", 400, "a field is given on some dataset rows but not on all"),
        ("data_missing_file", 400, "a data, image or reproducer file does not exist"),
        ("data_no_image", 400, "a sample that must have an image has none"),
        ("data_no_labels", 400, "zero-shot classification was asked of a dataset without class labels"),
        ("data_unreadable", 400, "a data file or folder cannot be read (permissions, I/O)"),
        ("data_unreadable_image", 400, "an image named by a dataset row or the CLI cannot be read"),
        ("data_unwritable", 400, "an output file of the CLI cannot be written"),
        ("image_empty", 400, "an image payload or file of 0 bytes, or an array with a 0-length side"),
        ("image_not_bytes", 400, "an encoded image was expected (bytes or a path) and something else came"),
        ("image_too_large", 413, "an image's declared pixels exceed the limit; refused before decoding"),
        ("image_undecodable", 400, "the bytes are not an image in a format the decoder knows"),
        ("image_unsupported_mode", 415, "the image's mode has no agreed conversion to RGB (e.g. float mode F)"),
    ],
    "perturb": [
        ("attack_bad_budget", 400, "an attack's query budget is below one query"),
        ("attack_bad_eps", 400, "an attack's eps is outside [1/255, 16/255] of the pixel range"),
        ("attack_bad_norm", 400, "an attack's norm is not 'linf' or 'l2'"),
        ("attack_bad_steps", 400, "an attack was given fewer than one step"),
        ("attack_budget_spent", 429, "a black-box attack used up its query budget"),
        ("attack_mixed_shapes", 400, "a batched attack was given images of different shapes"),
        ("attack_no_path", 422, "the target offers no differentiable image path on this worker"),
        ("attack_no_task", 422, "no image task fits this target and dataset"),
        ("bad_batch", 400, "a perturbation was given one item where it takes a batch"),
        ("bad_item_type", 400, "a perturbation was given items of a modality it does not perturb"),
        ("bad_severity", 400, "a severity outside 0-5 (0 is clean)"),
        ("replay_mismatch", 400, "recorded parameters do not fit the input they are replayed on"),
        ("unstackable_output", 400, "a perturbation's outputs differ in shape and cannot be stacked"),
    ],
    "targets": [
        ("bad_content_part", 422, "a chat content part holds something that is not an image or text"),
        ("bad_generation_params", 400, "a generation parameter is out of range (temperature, top_p, stop, n...)"),
        ("bad_messages", 400, "chat messages have a role, order or shape the target does not take"),
        ("bad_response", 502, "an endpoint answered with a body that is not the expected JSON"),
        ("bad_text_type", 400, "a text input that is not a str"),
        ("chat_template_missing", 400, "a generative checkpoint ships no chat template"),
        ("connection_failed", 502, "an endpoint could not be reached (refused, reset, DNS)"),
        ("context_exceeded", 400, "a prompt plus max_new_tokens exceeds the model's positions"),
        ("bad_export_dtype", 400, "an ONNX export precision other than float32 or float16"),
        ("export_dtype_unavailable", 400, "--dtype float16 needs onnxruntime's float16 converter, which is missing"),
        ("export_failed", 500, "exporting a target to ONNX failed"),
        ("generate_failed", 500, "the model's generate raised (a crash of the model, not a refusal)"),
        ("image_bad_dtype", 400, "an image array that is not uint8"),
        ("image_bad_shape", 400, "an image array that is not (H, W, 3) (or a layout the caller accepts)"),
        ("steps_unsupported", 501, "the model cannot decode step by step (its cache or positions); it keeps generate"),
        ("image_required", 422, "the model answers only requests with an image (its generate requires pixels)"),
        ("onnx_provider_missing", 400, "the onnx: device needs an execution provider this onnxruntime lacks"),
        ("onnx_run_failed", 500, "ONNX Runtime failed while running an encoder"),
        ("processor_failed", 500, "the model's processor failed on a request it should take (its own fault)"),
        ("processor_refused", 422, "the model's processor refused the request (e.g. image placeholders)"),
        ("processor_unfit", 500, "the processor shipped with the model does not fit it, so the call was not run"),
        ("stream_error", 502, "an endpoint sent an error event inside a stream"),
        ("stream_truncated", 502, "an endpoint's stream ended before its finish_reason or [DONE]"),
        ("target_bad_input", 422, "PP-OCR cannot preprocess this image (empty, or its pipeline refused it)"),
        ("target_bad_threads", 400, "a thread count that is not a positive integer"),
        ("target_config_invalid", 400, "a --target-config file is unreadable, not YAML or not a mapping"),
        ("target_option_inapplicable", 400, "a target option the scheme has but this target cannot apply"),
        ("target_option_invalid", 400, "a target option with a value its scheme's options model refuses"),
        ("target_option_unknown", 400, "a target option its scheme does not take (the message names its options)"),
        ("target_options_model_invalid", 500, "a scheme factory registered an options model that is not SchemeOptions"),
        ("text_exceeds_model_positions", 400, "a text has more tokens than the model has usable positions"),
        ("text_not_bytes", 400, "encoded text bytes were expected and something else came"),
        ("timeout", 504, "an endpoint did not answer, or its stream stalled, within the timeout"),
        ("unsupported_architecture", 400, "a checkpoint is not a model family mmchaos can run"),
        ("weights_missing", 400, "a checkpoint lacks weights the model needs (they would be random)"),
    ],
    "run": [
        ("executor_actor_lost", 500, "a work unit took down several Ray actors in a row"),
        ("executor_bad_option", 400, "an executor option is out of range (workers, memory...)"),
        ("executor_ray_missing", 501, "--executor ray needs Ray, which is not installed"),
        ("executor_ray_unavailable", 503, "the Ray cluster cannot be started or reached"),
        ("executor_unknown", 400, "--executor names no known executor"),
        ("executor_unit_failed", 500, "a work unit failed on a forked worker, or those workers could not start"),
        ("executor_worker_lost", 500, "a work unit took down the forked worker that ran it"),
        ("fuzz_bad_kind", 400, "a saved fuzz reproducer has an unknown input kind"),
        ("output_unusable", 400, "the report folder cannot be written"),
        ("results_invalid", 400, "a results.json given to compare is not valid JSON or not a results document"),
        ("run_ambiguous", 400, "a run id prefix matches several stored runs"),
        ("run_missing", 404, "a run names no stored run (or, to compare, no results.json or report folder)"),
        ("runs_disjoint", 400, "two runs to compare have no check, perturbation or finding in common"),
        ("store_corrupt", 500, "the run store is corrupted; it is left as it is"),
        ("store_foreign", 400, "the file given as run store is not one mmchaos wrote"),
        ("store_missing", 404, "there is no run store at the given path"),
        ("store_missing_unit", 404, "a stored run lacks a work unit it should have"),
        ("store_options_outdated", 400, "a stored run's target options are ones its scheme no longer takes"),
        ("store_read_only", 500, "the run store's folder cannot be written"),
        ("store_unreadable", 500, "the run store exists but cannot be read (permissions)"),
        ("store_unusable", 400, "the run store path is a folder, not a file"),
        ("tolerances_invalid", 400, "a --tolerances file or --tolerance value is invalid"),
    ],
    "guard": [
        ("animated_image", 422, "an animated image, where the contract takes still images only"),
        ("bad_array", 400, "an image array of a shape that is not (H, W) or (H, W, 1|3|4)"),
        ("bad_aspect_ratio", 422, "an image's aspect ratio exceeds the limit"),
        ("bad_data_url", 400, "a string that is not a base64 data: URL"),
        ("bad_embeddings", 400, "a drift reference with too few or malformed embeddings"),
        (
            "bad_event",
            400,
            "an impossible SLO event (negative count, NaN or negative latency) or one lacking its latency",
        ),
        ("bad_modality", 400, "a drift monitor fed a modality that is not a non-empty string"),
        ("bad_image", 400, "the data is not a recognised image"),
        ("bad_input_type", 400, "an input of the wrong Python type (e.g. a data URL that is not a str)"),
        ("bad_utf8", 400, "a text that is not valid UTF-8 (or holds lone surrogates UTF-8 cannot encode)"),
        ("bad_window", 400, "an SLO window that is not a whole number of seconds"),
        ("call_not_permitted", 503, "the circuit breaker is open and refuses calls (Retry-After)"),
        ("config_mismatch", 500, "a model's files disagree with its config.json"),
        ("decompression_bomb", 413, "an image declares far more decoded bytes than its size allows"),
        ("element_count_overflow", 413, "a declared element count exceeds int32 (or the set limit)"),
        ("empty_input", 400, "a request with no image and no text, or an empty input list"),
        ("fingerprint_mismatch", 500, "tokenizer, processor, config or weights do not belong together"),
        ("image_too_small", 422, "an image side is below the contract's minimum"),
        ("input_too_large", 413, "an input exceeds a size limit (InputTooLargeError's default)"),
        ("malformed_input", 400, "an input is not what it claims to be (MalformedInputError's default)"),
        ("model_dir_missing", 400, "a model directory to fingerprint does not exist or loads nothing"),
        ("model_file_invalid", 500, "a model directory's config or component files cannot be read"),
        ("non_finite", 422, "an image array holding NaN or infinite values"),
        ("payload_too_large", 413, "an encoded payload or request body exceeds its byte limit"),
        ("preflight_rejected", 400, "an input broke the serving contract (PreflightError's default)"),
        ("shape_negative", 400, "a declared shape with a negative dimension"),
        ("text_too_long", 413, "a text exceeds the contract's byte limit"),
        ("too_many_tokens", 413, "a text exceeds the contract's token limit"),
        ("truncated_image", 400, "the image data ends early"),
        ("unprocessable_input", 422, "well-formed but unprocessable input (UnprocessableInputError's default)"),
        ("unsupported_format", 415, "an image format the contract does not accept"),
        ("unsupported_input", 415, "an input the contract does not accept (UnsupportedInputError's default)"),
        ("unsupported_mode", 415, "an image mode the contract does not accept"),
    ],
    "server": [
        ("bad_model_output", 500, "the model returned something that cannot be served (wrong shape or type)"),
        ("body_timeout", 408, "the request body did not arrive in time"),
        ("client_disconnected", 499, "the client closed the connection before its answer (nginx's 499)"),
        ("dimensions_unsupported", 400, "the 'dimensions' asked for is not what this model gives"),
        ("http_error", 400, "another refusal by the HTTP framework (answered with the framework's status)"),
        ("invalid_api_key", 401, "a missing or wrong API key"),
        ("invalid_json", 400, "the request body is not valid JSON"),
        ("invalid_request", 400, "the request does not fit the endpoint's schema"),
        ("invalid_token_id", 400, "a token id outside the vocabulary"),
        ("max_tokens_too_large", 400, "max_tokens above what this server generates"),
        ("method_not_allowed", 405, "the path exists but not for this method"),
        ("model_error", 500, "the model raised an untyped exception"),
        ("model_load_mismatch", 503, "the model failed its load check; the server serves nothing"),
        ("model_not_found", 404, "the request names a model this server does not have"),
        ("n_unsupported", 400, "an n this endpoint cannot give (n > 1, or n > 1 with stream)"),
        ("non_finite_output", 500, "the model returned NaN or infinite values"),
        ("not_found", 404, "no such path"),
        ("not_ready", 503, "the server is starting, draining, or its breaker is open"),
        ("one_item_per_conversation", 400, "an embeddings 'messages' request with more than one content part"),
        ("overloaded", 429, "a request now would wait longer for a slot than allowed (Retry-After)"),
        ("queue_full", 429, "the server is at capacity: running and waiting slots are full (Retry-After)"),
        ("request_pixels_too_large", 413, "the request's images declare more pixels in all than allowed"),
        ("request_timeout", 504, "the request took longer than the server's request timeout"),
        ("stream_unsupported", 400, "streaming asked of an endpoint that does not stream"),
        ("token_ids_unsupported", 400, "token ids sent to a model without a tokenizer"),
        ("too_many_inputs", 413, "more inputs or content parts than the server takes at once"),
        ("unsupported_media_type", 415, "a request body whose Content-Type is not JSON"),
    ],
    "proxy": [
        ("config_bad_address", 400, "an address that is not host:port (IPv6 as [::1]:port)"),
        ("config_invalid_load", 400, "a load driver setting is invalid (URL, rate, bounds)"),
        ("config_invalid_proxy", 400, "a proxy definition is invalid (not an object, bad field)"),
        ("config_invalid_toxic", 400, "a toxic definition is invalid (bad attribute, duplicate name)"),
        ("config_missing_file", 400, "a toxics file does not exist"),
        ("control_bad_json", 400, "a control API body that is not strict JSON, or nests too deep"),
        ("control_browser_refused", 403, "a control API request from a browser (Mozilla/ agent, foreign Origin)"),
        ("control_host_refused", 403, "a control API request whose Host is not a loopback name (DNS rebinding)"),
        ("control_method", 405, "a control API path that does not take this method"),
        ("control_no_route", 404, "no such control API path"),
        ("control_unsupported_media_type", 415, "a control API body whose Content-Type is not JSON"),
        ("http_bad_chunk", 400, "a chunked body with a bad chunk size or framing"),
        ("http_bad_content_length", 400, "a Content-Length that is not plain digits"),
        ("http_bad_request", 400, "a bad request line, header line or request head"),
        ("http_body_too_large", 413, "a request body over the proxy's HTTP server limit"),
        ("http_head_too_large", 431, "a request head or trailer section over the limit"),
        ("http_internal_error", 500, "a handler of the proxy's HTTP server failed (a bug; it is logged)"),
        ("listen_failed", 400, "a server or proxy cannot listen on the given address (in use, unresolvable)"),
        ("remote_not_allowed", 403, "an address that is not loopback, without the flag that allows it"),
        ("proxy_exists", 409, "a proxy of that name already exists"),
        ("proxy_not_found", 404, "no proxy of that name"),
        ("toxic_exists", 409, "the proxy already has a toxic of that name"),
        ("toxic_not_found", 404, "the proxy has no toxic of that name"),
        ("unknown_toxic", 400, "a toxic type that does not exist"),
    ],
}


def _build() -> Mapping[str, Code]:
    table: dict[str, Code] = {}
    for layer, _ in LAYERS:
        for name, status, meaning in _ENTRIES[layer]:
            if name in table:
                raise ValueError(f"error code {name!r} is in the table twice")
            table[name] = Code(name, status, meaning, layer)
    return MappingProxyType(table)


#: Every stable error code by name.
CODES: Mapping[str, Code] = _build()


def status_of(code: str, default: int = 500) -> int:
    """The HTTP status answered with ``code``; ``default`` for a code not in the table."""
    entry = CODES.get(code)
    return entry.status if entry is not None else default


def statuses(*names: str) -> Mapping[str, int]:
    """``{code: status}`` for the given codes (a module's own list); KeyError on a code not in the table."""
    return MappingProxyType({name: CODES[name].status for name in names})
