"""Request and response models of the OpenAI-compatible API (pydantic, so /openapi.json is real).

Requests ignore fields they do not know (clients send many); fields we know but
cannot honour (n > 1, logprobs, penalties, ...) are refused by the routes with a
400 that names them. Sampling defaults are llama-server's (and ``localflash chat``'s).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


# -- requests -------------------------------------------------------------------

class TextPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Request):
    name: str
    arguments: Union[str, dict[str, Any]] = Field("{}", description="JSON text (an object is accepted too)")


class ToolCallIn(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an earlier reply's thinking (templates that keep it read it)


class FunctionDef(_Request):
    name: str = Field(..., min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: dict[str, Any]


class StreamOptions(_Request):
    include_usage: bool = False


class ResponseFormat(_Request):
    type: str = "text"
    json_schema: dict[str, Any] | None = Field(None, description="type json_schema: {\"name\": ..., \"schema\": {...}, \"strict\": true}.")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="type json_object: an optional schema (llama-server's).")


class _Generation(_Request):
    model: str | None = Field(None, description="The served model's id (see /v1/models); may be left out.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, description="Default: until the context is full (chat) or 16 (completions).")
    temperature: float = Field(0.8, ge=0.0, le=2.0, description="0 is greedy.")
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(40, ge=0, le=1_000_000, description="0 disables it.")
    min_p: float = Field(0.05, ge=0.0, lt=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: Union[str, list[str], None] = Field(None, description="Up to 16 stop strings; none is returned in the text.")
    n: int = Field(1, description="Only 1 is supported.")
    presence_penalty: float = Field(0.0, description="Only 0 is supported.")
    frequency_penalty: float = Field(0.0, description="Only 0 is supported.")
    logit_bias: dict[str, float] | None = Field(None, description="Not supported (leave out or empty).")
    user: str | None = None
    grammar: str | None = Field(None, description="llama-server's: GBNF every token of the reply must follow.")
    speculative_n_max: int | None = Field(None, alias="speculative.n_max", ge=0,
                                          description="llama-server's name: this request's longest draft (0: no drafting).")


class ChatCompletionRequest(_Generation):
    messages: list[Message] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="Wins over max_tokens.")
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = Field(None, description="Not supported.")
    top_logprobs: int | None = Field(None, description="Not supported.")
    response_format: ResponseFormat | None = Field(None, description="text, json_object or json_schema (constrained by grammar).")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="{\"enable_thinking\": bool} switches thinking (templates that have it).")
    reasoning_format: Literal["auto", "none", "deepseek"] | None = Field(
        None, description="auto (or deepseek): thinking goes to reasoning_content; none: it stays in content. Default: the server's --reasoning-format.")


class CompletionRequest(_Generation):
    prompt: Union[str, list[str]] = Field(..., description="Sent as is (no chat template); a list must hold one string.")
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = Field(False, description="Not supported.")
    suffix: str | None = Field(None, description="Not supported.")
    logprobs: int | None = Field(None, description="Not supported.")
    best_of: int | None = Field(None, description="Only 1 is supported.")


# -- responses ------------------------------------------------------------------

class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class Timings(BaseModel):
    """llama-server's per-response timings, plus τ (committed tokens per target pass)."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    calibrate_ms: float = 0.0  # the adaptive draft length's one-off timing passes (not in predicted_ms)
    draft_n: int
    draft_n_accepted: int
    tau: float
    drafter: str
    sampled_in: str = "host"  # where the target's rows were sampled: host (logits copied) | graph (llama.cpp's chain, ids copied)
    kv_wait_ms: float = 0.0  # waited for room in the unified KV pool (parallel slots)
    kv_evicted: int = 0  # idle slots' cached tokens dropped from the pool to make room for it


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    timings: Timings
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "localflash"
    meta: dict[str, Any] = {}


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: str
    running: int
    queued: int


class ErrorInfo(BaseModel):
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    n_prompt_tokens: int | None = None
    n_ctx: int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
