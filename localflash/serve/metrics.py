"""Server counters in Prometheus text format, named as llama-server names them.

``llamacpp:*`` are llama-server's series (same names, same meaning); the
speculative-decoding counters are also written under ``vllm:*``, the names
vLLM uses for the same quantities, so either dashboard reads them.
``localflash:*`` adds what neither has (requests by finish reason, τ, errors).
"""

from __future__ import annotations

import threading
from collections import Counter, deque

from localflash.api import Stats


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.prompt_tokens = 0  # decoded prompt tokens (cache hits excluded)
        self.cached_tokens = 0
        self.prompt_seconds = 0.0
        self.predicted_tokens = 0
        self.predicted_seconds = 0.0
        self.calibrate_seconds = 0.0
        self.target_passes = 0
        self.committed = 0
        self.drafts = 0  # verify passes that carried a draft
        self.draft_tokens = 0
        self.accepted = 0
        self.accepted_per_pos: list[int] = []
        self.verified_rows = 0  # target rows of decode cycles (a tree's nodes + 1)
        self.tree_passes = 0  # verify passes over a branching tree (--tree)
        self.tree_nodes = 0
        self.n_tokens_max = 0
        self.finished: Counter[str] = Counter()
        self.errors: Counter[int] = Counter()
        self.rejected_full = 0
        self.recent: deque = deque(maxlen=100)  # (slot, decode tok/s, τ) of the last requests

    def record(self, st: Stats, prompt_tokens: int, cached_tokens: int, finish_reason: str, slot: int = 0) -> None:
        with self.lock:
            if st.generated and st.t_decode > 0:
                self.recent.append((slot, st.generated / st.t_decode, st.tau))
            self.prompt_tokens += max(0, prompt_tokens - cached_tokens)
            self.cached_tokens += cached_tokens
            self.prompt_seconds += st.t_prefill
            self.predicted_tokens += st.generated
            self.predicted_seconds += st.t_decode
            self.calibrate_seconds += st.t_calibrate
            self.target_passes += st.cycles
            self.committed += st.committed
            self.drafts += st.pos_tries[0] if st.pos_tries else 0
            self.draft_tokens += st.drafted
            self.accepted += st.accepted
            for j, hits in enumerate(st.pos_hits):
                while len(self.accepted_per_pos) <= j:
                    self.accepted_per_pos.append(0)
                self.accepted_per_pos[j] += hits
            self.verified_rows += st.rows
            self.tree_passes += st.tree_cycles
            self.tree_nodes += st.tree_nodes
            self.n_tokens_max = max(self.n_tokens_max, prompt_tokens + st.generated)
            self.finished[finish_reason] += 1

    def record_error(self, status: int) -> None:
        with self.lock:
            self.errors[status] += 1
            if status == 503:
                self.rejected_full += 1

    def render(self, running: int, queued: int, slots: int = 1, busy_seconds: float = 0.0, decodes: tuple[int, int] | None = None) -> str:
        with self.lock:
            lines: list[str] = []

            def metric(name: str, kind: str, help_: str, value, labels: dict | None = None, header: bool = True):
                if header:
                    lines.append(f"# HELP {name} {help_}")
                    lines.append(f"# TYPE {name} {kind}")
                lab = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
                lines.append(f"{name}{lab} {_num(value)}")

            ll = "llamacpp:"
            metric(ll + "prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens", self.prompt_tokens)
            metric(ll + "prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache", self.cached_tokens)
            metric(ll + "prompt_seconds_total", "counter", "Total time spent processing prompts", self.prompt_seconds)
            metric(ll + "tokens_predicted_total", "counter", "Number of generation tokens processed", self.predicted_tokens)
            metric(ll + "tokens_predicted_seconds_total", "counter", "Total time spent generating tokens", self.predicted_seconds)
            metric(ll + "n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)", self.n_tokens_max)
            for prefix in (ll, "vllm:"):
                metric(prefix + "spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated", self.draft_tokens)
                metric(prefix + "spec_decode_num_accepted_tokens_total", "counter", "Speculative: Total draft tokens accepted by the target model", self.accepted)
                metric(prefix + "spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps", self.drafts)
                name = prefix + "spec_decode_num_accepted_tokens_per_pos_total"
                for j, hits in enumerate(self.accepted_per_pos):
                    metric(name, "counter", "Accepted tokens per draft position", hits, {"position": j}, header=j == 0)
            pt = self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0
            gt = self.predicted_tokens / self.predicted_seconds if self.predicted_seconds > 0 else 0.0
            metric(ll + "prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s", pt)
            metric(ll + "predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s", gt)
            metric(ll + "requests_processing", "gauge", "Number of requests processing", running)
            metric(ll + "requests_deferred", "gauge", "Number of requests deferred", queued)
            if decodes is not None:  # parallel slots: how full the batched decodes ran (llama-server's two)
                metric(ll + "n_decode_total", "counter", "Total number of llama_decode() calls", decodes[0])
                metric(ll + "n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
                       decodes[1] / decodes[0] if decodes[0] else 0.0)
            metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches", running)
            metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed", queued)
            lf = "localflash:"
            metric(lf + "calibrate_seconds_total", "counter",
                   "Time spent timing target passes for the adaptive draft length (once, not in tokens_predicted_seconds)",
                   self.calibrate_seconds)
            metric(lf + "target_passes_total", "counter", "Target forward passes after prefill (verify or plain decode)", self.target_passes)
            tau = self.committed / self.target_passes if self.target_passes else 0.0
            metric(lf + "tau", "gauge", "Mean committed tokens per target pass since start", tau)
            metric(lf + "verified_rows_total", "counter", "Target rows verified by decode passes (drafted tokens or tree nodes + 1)", self.verified_rows)
            metric(lf + "tree_passes_total", "counter", "Verify passes over a branching token tree (--tree)", self.tree_passes)
            metric(lf + "tree_nodes_total", "counter", "Drafted tokens in those trees (mean tree size: nodes / passes)", self.tree_nodes)
            reasons = sorted(set(self.finished) | {"stop", "length", "cancelled"})
            for i, r in enumerate(reasons):
                metric(lf + "requests_total", "counter", "Finished generations by finish reason", self.finished[r], {"finish_reason": r}, header=i == 0)
            for i, status in enumerate(sorted(self.errors)):
                metric(lf + "errors_total", "counter", "Error responses by HTTP status", self.errors[status], {"status": status}, header=i == 0)
            metric(lf + "rejected_queue_full_total", "counter", "Requests answered 503 because the queue was full", self.rejected_full)
            metric(lf + "slots", "gauge", "Parallel slots (requests decoded together)", slots)
            metric(lf + "slots_busy", "gauge", "Slots running a request now", running)
            metric(lf + "busy_seconds_total", "counter", "Wall time with at least one request running", busy_seconds)
            agg = self.predicted_tokens / busy_seconds if busy_seconds > 0 else 0.0
            metric(lf + "aggregate_tokens_per_second", "gauge", "Generated tokens over busy wall time (all slots together)", agg)
            rates = sorted(r for _, r, _ in self.recent)
            for i, q in enumerate((0.5, 0.9)):
                value = rates[min(len(rates) - 1, int(q * len(rates)))] if rates else 0.0
                metric(lf + "request_tokens_per_second", "gauge", "Per-request decode throughput over the last 100 requests",
                       value, {"quantile": q}, header=i == 0)
            return "\n".join(lines) + "\n"


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)
