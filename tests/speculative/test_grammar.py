"""Grammar-constrained decoding (``grammar=`` GBNF, ``json_schema=``) is lossless with every drafter.

Configuration: exact mode (``exact=True``: batch-invariant CPU numerics, engine.exact_options), one
thread, a fixed draft length of 4, 48 tokens, in a process of its own (``localflash.testing.constrained``:
exact mode is chosen once per process). Targets: the demo pair's SmolLM2-135M (its DFlash drafter,
DFlash + n-gram, n-gram, its Q2_K draft model) and the tiny qwen35 hybrid in Q4_K_M with an MTP block
(MTP, MTP + n-gram, n-gram, a draft model, DFlash, DFlash2, EAGLE-3, DFlash + n-gram). Every reply is
compared with plain constrained decoding (greedy: token for token; sampled: with the same seed) and
is parsed and validated: ``jsonschema`` for the schema, a regular expression of the same language for
the GBNF grammar.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema
import pytest

from localflash.api import load
from localflash.errors import GrammarError
from localflash.formats.dflash_gguf import DFlash2Spec, DFlashSpec
from localflash.testing.constrained import GBNF, GBNF_LANGUAGE, SCHEMA
from localflash.testing.tiny import Eagle3Spec, HybridSpec, write_dflash, write_dflash2, write_eagle3, write_hybrid

DEMO_PROMPTS = ["Describe a cat as JSON with its name, whether it is ok and its colour.", "Write a list of short words."]
TINY_PROMPTS = ["The quick brown fox jumps over the lazy dog", "one two three four five six"]
HYBRID_KINDS = [("mtp", None), ("mtp+ngram", None), ("ngram", None), ("draft", "draft"), ("dflash", "dflash"),
                ("dflash", "dflash2"), ("eagle3", "eagle3"), ("dflash+ngram", "dflash")]
DEMO_RUNS = [dict(pair="demo"), dict(pair="demo", spec="dflash+ngram"), dict(pair="demo", spec="ngram"), dict(pair="demo-draft")]


def run(base: dict, runs: list[dict], prompts: list[str], sampled: bool = False, chat: bool = False) -> list[dict]:
    job = dict(base={"threads": 1, "exact": True, "fixed": True, "ctx": 1024, **base}, runs=runs, prompts=prompts,
               n=48, sampled=sampled, chat=chat)
    res = subprocess.run([sys.executable, "-m", "localflash.testing.constrained", json.dumps(job)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def valid(key: str, text: str) -> bool:
    if key.startswith("grammar"):
        return re.fullmatch(GBNF_LANGUAGE, text) is not None
    jsonschema.validate(json.loads(text), SCHEMA)  # raises on a reply that is not an instance
    return True


def check(plain: dict, got: dict, label: str) -> None:
    assert plain["replies"].keys() == got["replies"].keys()
    for key, (ids, text, finish) in plain["replies"].items():
        assert got["replies"][key][0] == ids, f"{label} {key}: diverged from plain constrained decoding"
        assert finish == "stop" and valid(key, text), f"{label} {key}: {text!r} ({finish})"


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """The tiny qwen35 hybrid (Q4_K_M, 256 wide, an MTP block) and drafters of its width and vocabulary."""
    from localflash.llama.quantize import quantize

    d = tmp_path_factory.mktemp("grammar")
    wide = dict(n_embd=256, n_ff=512, head_dim=64, n_rot=16, linear_head_dim=64, linear_v_heads=4)
    f32 = write_hybrid(d / "q35-f32.gguf", HybridSpec(seed=3, n_nextn=1, mtp_agree=0.3, **wide))
    return {
        "target": str(quantize(f32, d / "q35-q4km.gguf", "Q4_K_M")),
        "draft": str(write_hybrid(d / "q35-draft.gguf", HybridSpec(seed=3, noise=0.1))),
        "dflash": str(write_dflash(d / "q35-dflash.gguf", DFlashSpec(n_embd=256, target_layers=[1, 3, 5], block_size=8, seed=5))),
        "dflash2": str(write_dflash2(d / "q35-dflash2.gguf", DFlash2Spec(n_embd=256, target_layers=[1, 3, 5], seed=6))),
        "eagle3": str(write_eagle3(d / "q35-eagle3.gguf", Eagle3Spec(n_embd=256, target_hidden_size=256, target_layers=[1, 3, 5],
                                                                      echo=4.0, fc_scale=0.3))),
    }


def _hybrid_runs(hybrid, kinds) -> list[dict]:
    return [dict(spec=s, draft_max=4, **({"drafter": hybrid[d]} if d else {})) for s, d in kinds]


@pytest.fixture(scope="module")
def hybrid_greedy(hybrid):
    return run({"model": hybrid["target"]}, [dict(spec="none")] + _hybrid_runs(hybrid, HYBRID_KINDS), TINY_PROMPTS)


@pytest.mark.parametrize("i", range(len(HYBRID_KINDS)), ids=[f"{s}-{d or s}" for s, d in HYBRID_KINDS])
def test_constrained_greedy_on_the_tiny_hybrid_equals_plain_constrained_with_every_drafter(hybrid_greedy, i):
    plain, got = hybrid_greedy[0], hybrid_greedy[1 + i]
    check(plain, got, HYBRID_KINDS[i][0])
    assert got["drafted"] > 0 or HYBRID_KINDS[i][0] == "ngram", "never drafted"


def test_constrained_sampling_on_the_tiny_hybrid_equals_plain_with_the_same_seed(hybrid):
    kinds = [("mtp", None), ("dflash", "dflash"), ("draft", "draft")]
    plain, *got = run({"model": hybrid["target"]}, [dict(spec="none")] + _hybrid_runs(hybrid, kinds), TINY_PROMPTS, sampled=True)
    for (spec, _), g in zip(kinds, got):
        check(plain, g, spec)


@pytest.fixture(scope="module")
def demo_greedy():
    return run({"draft_max": 4}, [dict(pair="demo", spec="none")] + DEMO_RUNS, DEMO_PROMPTS, chat=True)


@pytest.mark.parametrize("i", range(len(DEMO_RUNS)), ids=["dflash", "dflash+ngram", "ngram", "draft"])
def test_constrained_greedy_on_the_demo_pair_equals_plain_constrained_with_every_drafter(demo_greedy, i):
    plain, got = demo_greedy[0], demo_greedy[1 + i]
    check(plain, got, str(DEMO_RUNS[i]))
    assert got["drafted"] > 0, "never drafted"


def test_constrained_sampling_on_the_demo_pair_equals_plain_with_the_same_seed():
    plain, got = run({"draft_max": 4}, [dict(pair="demo", spec="none"), dict(pair="demo")], DEMO_PROMPTS, sampled=True, chat=True)
    check(plain, got, "dflash")


def test_a_bad_grammar_or_schema_is_one_typed_error_naming_the_param(tiny_target):
    with load(model=tiny_target, spec="none", threads=1, ctx=256) as llm:
        with pytest.raises(GrammarError) as e:
            llm.generate("hi", grammar='root ::= "a" undefined_rule')
        assert e.value.param == "grammar" and "GBNF" in e.value.message
        with pytest.raises(GrammarError) as e:
            llm.generate("hi", json_schema={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
        assert e.value.param == "json_schema"
        with pytest.raises(GrammarError):
            llm.generate("hi", grammar=GBNF, json_schema=SCHEMA)
        assert llm.generate("hi", max_tokens=24, grammar=GBNF).finish_reason == "stop"  # the LLM still serves
