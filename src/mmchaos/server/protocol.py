"""Request and response bodies of the reference server, in the OpenAI API's shapes.

Images travel as ``data:`` URLs inside ``image_url`` content parts, as in OpenAI's chat API and
vLLM's multimodal embeddings. The server never fetches ``http(s)`` URLs (no server-side request
forgery): anything but a ``data:`` URL is refused with ``bad_data_url``.

Unknown fields are ignored, as vLLM does, so OpenAI clients that send ``user``, ``logit_bias``
and the like keep working. The fields the server reads take JSON's own types only, as OpenAI's API
does (``"stream": "yes"``, ``"max_tokens": true`` and ``"n": "2"`` are 400 ``invalid_request``; an
integer is a number). Ranges the server checks itself, with its own code (``bad_generation_params``,
``bad_messages``), are stated in the schema with :class:`WithJsonSchema`, so the schema says what the
server takes without turning those refusals into schema errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, WithJsonSchema, model_validator

__all__ = [
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatMessage",
    "ChoiceLogprobs",
    "ContentPart",
    "EmbeddingRequest",
    "EmbeddingResponse",
    "ErrorBody",
    "ErrorDetail",
    "ImageURL",
    "ImageURLPart",
    "ModelCard",
    "ModelList",
    "StreamOptions",
    "TextPart",
    "TokenLogprob",
]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ImageURL(_Lenient):
    url: str = Field(description="a data: URL, e.g. data:image/png;base64,iVBORw0...")
    detail: str | None = None


class ImageURLPart(_Lenient):
    type: Literal["image_url"]
    image_url: ImageURL


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


ContentPart = Annotated[ImageURLPart | TextPart, Field(discriminator="type")]
#: A token id of the target's tokenizer (JSON integers only; ``true`` is not 1).
TokenId = Annotated[int, Strict()]
StrictInt = Annotated[int, Strict()]
StrictBool = Annotated[bool, Strict()]
StrictStr = Annotated[str, Strict()]
#: A JSON number (an integer too, as OpenAI's API takes it; never a string or a boolean).
StrictFloat = Annotated[float, Strict()]

#: Chat roles the server takes (``developer`` is OpenAI's newer name of ``system``); another is
#: 400 ``bad_messages`` (:mod:`.inputs`), and the schema lists these.
CHAT_ROLES = ("system", "developer", "user", "assistant")
#: The least positive temperature: below it ``logits / temperature`` overflows (float32 past
#: 1e-37, float16 far sooner) and the sampler fails inside the model; vLLM clamps to the same 0.01.
MIN_TEMPERATURE = 0.01
#: OpenAI's largest temperature.
MAX_TEMPERATURE = 2.0
#: Most completions one request may ask for (GenerationParams' bound).
MAX_N = 128


class ChatMessage(_Lenient):
    role: Annotated[StrictStr, WithJsonSchema({"type": "string", "enum": list(CHAT_ROLES)})] = Field(max_length=64)
    content: str | list[ContentPart] | None = None


class EmbeddingRequest(_Lenient):
    """OpenAI's embeddings request, with images.

    ``input``: a string, or a list whose items are strings or content parts (one embedding per
    item, in order; a ``{"type": "image_url", ...}`` item is an image), or token ids of the target's
    tokenizer as OpenAI takes them (a list of ints: one text; a list of such lists: one each).
    ``messages`` (vLLM's chat embeddings form) is one conversation holding one image or one text:
    one embedding.
    """

    model: StrictStr | None = None
    input: str | list[TokenId] | list[list[TokenId]] | list[str | ContentPart] | None = None
    messages: list[ChatMessage] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> EmbeddingRequest:
        if (self.input is None) == (self.messages is None):
            raise ValueError("give exactly one of 'input' and 'messages'")
        return self


class StreamOptions(_Lenient):
    include_usage: StrictBool = False


class ChatCompletionRequest(_Lenient):
    """OpenAI's chat completion request; images in ``image_url`` content parts of the messages.

    Generative targets take every sampling field (``temperature`` defaults to 1 as OpenAI's);
    targets that read text (OCR) answer the text in the images and ignore sampling.
    ``return_tokens_as_token_ids`` is vLLM's: logprob tokens are sent as ``token_id:N``.
    """

    model: StrictStr | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_N})] = 1
    max_tokens: StrictInt | None = Field(default=None, ge=1, description="longest reply, in tokens")
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, description="OpenAI's newer name of max_tokens")
    temperature: (
        Annotated[StrictFloat, WithJsonSchema({"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE})] | None
    ) = Field(default=None, description=f"0 (greedy) or {MIN_TEMPERATURE} to {MAX_TEMPERATURE:g}; default 1")
    top_p: Annotated[StrictFloat, WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 1})] | None = None
    seed: StrictInt | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: StrictStr | list[StrictStr] | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(
        default=None, ge=0, le=20, description="the most likely tokens at each step (needs logprobs: true)"
    )
    return_tokens_as_token_ids: StrictBool = False
    user: str | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class Usage(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = None


class EmbeddingResponse(BaseModel):
    id: str = Field(description="embd-<request id>")
    object: Literal["list"] = "list"
    created: int = Field(description="Unix time of the answer")
    data: list[EmbeddingData]
    model: str
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[Any] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length"] = Field("stop", description="length: cut at max_tokens")


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, rate_limit_error, server_error, ...")
    param: str | None = None
    code: str | None = Field(None, description="stable machine-readable code, e.g. image_too_large")


class ErrorBody(BaseModel):
    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mmchaos"
    max_model_len: int | None = Field(
        default=None, description="the model's positions, prompt plus completion (vLLM's field); absent when unknown"
    )
    mmchaos: dict[str, Any] = Field(
        default_factory=dict, description="target URI, capabilities, fingerprint and input limits"
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
