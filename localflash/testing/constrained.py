"""Constrained replies (``grammar=`` / ``json_schema=``) of one target under several drafters, in a process of its own.

Exact mode is chosen once per process, before its first model context, so the constrained-decoding
tests run this module in a subprocess::

    python -m localflash.testing.constrained '{"base": {"model": ...}, "runs": [{"spec": "none"}, ...], "sampled": false}'

It prints one JSON object: for each run (in order) the replies of every constraint and prompt as
``[token ids, text, finish reason]`` and the run's drafted / verified / grammar-rejected counts.
"""

from __future__ import annotations

import json
import sys

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "ok": {"type": "boolean"},
        "colour": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "ok", "colour"],
    "additionalProperties": False,
}
GBNF = r'''root ::= "(" item ("," item){0,3} ")"
item ::= [a-z]{1,4} | [0-9]{1,3}
'''
GBNF_LANGUAGE = r"\((?:[a-z]{1,4}|[0-9]{1,3})(?:,(?:[a-z]{1,4}|[0-9]{1,3})){0,3}\)"  # the same language as GBNF
CONSTRAINTS = {"json_schema": {"json_schema": SCHEMA}, "grammar": {"grammar": GBNF}}


def replies(opts: dict, prompts: list[str], n: int, sampled: bool, chat: bool) -> dict:
    """``opts``: load options; ``batch`` among them: every prompt of a constraint at once on parallel slots."""
    from localflash.api import load

    out: dict = {"replies": {}, "drafted": 0, "rows": 0, "rejected": 0}
    batch = opts.pop("batch", False)
    with load(**opts) as llm:
        for kind, kw in CONSTRAINTS.items():
            sampling = dict(temperature=0.8, top_k=40, top_p=0.95, seed=11) if sampled else {}
            if batch:
                done = llm.generate_batch(prompts, max_tokens=n, raw=not chat, **sampling, **kw)
            else:
                done = [(llm.chat if chat else llm.generate)(p, max_tokens=n, **sampling, **kw) for p in prompts]
            for i, c in enumerate(done):
                out["replies"][f"{kind}/{i}"] = [c.token_ids, c.text, c.finish_reason]
                out["drafted"] += c.stats.drafted
                out["rows"] += c.stats.rows
                out["rejected"] += c.stats.grammar_rejected
    return out


def main(arg: str) -> None:
    job = json.loads(arg)
    runs = [replies({**job["base"], **run}, job["prompts"], job.get("n", 48), job.get("sampled", False), job.get("chat", False))
            for run in job["runs"]]
    print(json.dumps(runs))


if __name__ == "__main__":
    main(sys.argv[1])
