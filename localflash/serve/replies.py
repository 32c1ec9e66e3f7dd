"""From session chunks to OpenAI response bodies: usage, llama-server timings, SSE chunks."""

from __future__ import annotations

import secrets
import time


FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(last) -> dict:
    done = last.stats.generated
    return {
        "prompt_tokens": last.prompt_tokens,
        "completion_tokens": done,
        "total_tokens": last.prompt_tokens + done,
        "prompt_tokens_details": {"cached_tokens": last.cached_tokens},
    }


def timings(last) -> dict:
    """llama-server's ``timings`` (prompt_n counts decoded prompt tokens, cache_n the reused ones) plus τ and
    calibrate_ms: prompt_ms + calibrate_ms + predicted_ms is the time the request waited for its tokens."""
    st = last.stats
    prompt_n = max(0, last.prompt_tokens - last.cached_tokens)
    prompt_ms, predicted_ms = 1000 * st.t_prefill, 1000 * st.t_decode
    n = st.generated
    return {
        "cache_n": last.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / n if n else 0.0,
        "predicted_per_second": 1000 * n / predicted_ms if predicted_ms > 0 else 0.0,
        "calibrate_ms": 1000 * st.t_calibrate,  # the draft length's one-off timing passes (a server's first request)
        "draft_n": st.drafted,
        "draft_n_accepted": st.accepted,
        "tau": st.tau,
        "drafter": st.drafter,
        "sampled_in": st.sampled_in,  # host | graph: where the target's rows were sampled
        "kv_wait_ms": 1000 * st.kv_wait,  # waited for room in the unified KV pool (parallel slots)
        "kv_evicted": st.kv_evicted,  # idle slots' cached tokens dropped to make room for it
    }


def provenance(chunk) -> dict:
    """The optional ``localflash`` field of a streamed chunk: how its cycle's tokens were made (README: serve).

    ``chars[i]``: characters token i added to the reply's text (before stop-string holdback);
    the first ``accepted`` tokens are accepted drafts, the rest the target's own; ``drafted``:
    draft tokens proposed. Over a reply they sum to timings' draft_n_accepted, draft_n, predicted_n.
    ``phase``: think | answer after this chunk (a template may open the thinking block itself).
    """
    return {"localflash": {"drafted": chunk.drafted, "accepted": chunk.accepted, "chars": chunk.token_chars, "phase": chunk.phase}}


def finish_reason(last, has_calls: bool) -> str:
    reason = FINISH.get(last.finish_reason or "stop", "stop")
    return "tool_calls" if has_calls and reason == "stop" else reason


class ChatReply:
    """Accumulates one chat reply: thinking text out to ``reasoning_content``, then tool calls out of the rest.

    ``plan`` (:class:`~localflash.serve.assistant.ReplyPlan`) says how the reply is read; None: as plain text.
    """

    def __init__(self, rid: str, model: str, plan=None):
        self.rid, self.model, self.created = rid, model, int(time.time())
        self.parser = plan.calls() if plan is not None else None
        self.split = plan.reasoning() if plan is not None else None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls = []

    def feed(self, text: str) -> list[dict]:
        """New text -> the SSE deltas it makes (reasoning, content and completed tool calls)."""
        reasoning, text = self.split.feed(text) if self.split is not None else ("", text)
        return self._deltas(reasoning, *self._calls(text))

    def flush(self) -> list[dict]:
        reasoning, text = self.split.flush() if self.split is not None else ("", "")
        content, calls = self._calls(text)
        if self.parser is not None:
            tail, more = self.parser.flush()
            content, calls = content + tail, calls + more
        return self._deltas(reasoning, content, calls)

    def _calls(self, text: str):
        if self.parser is None or not text:
            return text, []
        return self.parser.feed(text)

    def _deltas(self, reasoning: str, content: str, calls) -> list[dict]:
        out = []
        if reasoning:
            self.reasoning.append(reasoning)
            out.append({"reasoning_content": reasoning})
        if content:
            self.content.append(content)
            out.append({"content": content})
        for c in calls:
            out += [{"tool_calls": [d]} for d in c.deltas(len(self.calls))]
            self.calls.append(c)
        return out

    def chunk(self, delta: dict, finish: str | None = None, **extra) -> dict:
        return {
            "id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra,
        }

    def usage_chunk(self, last) -> dict:
        return {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage(last), "timings": timings(last)}

    def whole(self, last) -> dict:
        text = "".join(self.content)
        message = {"role": "assistant", "content": text if text or not self.calls else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [c.to_openai() for c in self.calls]
        return {
            "id": self.rid, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(last, bool(self.calls)), "logprobs": None}],
            "usage": usage(last), "timings": timings(last),
        }


class CompletionReply:
    def __init__(self, rid: str, model: str):
        self.rid, self.model, self.created = rid, model, int(time.time())
        self.text: list[str] = []

    def chunk(self, text: str, finish: str | None = None, **extra) -> dict:
        return {"id": self.rid, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}], **extra}

    def usage_chunk(self, last) -> dict:
        return {"id": self.rid, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [], "usage": usage(last), "timings": timings(last)}

    def whole(self, last) -> dict:
        body = self.chunk("".join(self.text), finish_reason(last, False))
        body.update(usage=usage(last), timings=timings(last))
        return body
