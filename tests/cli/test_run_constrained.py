"""``localflash run --grammar-file / --json-schema``: the reply follows the grammar; a bad one is one line and a non-zero exit."""

from __future__ import annotations

import json
import re

import jsonschema

from localflash.testing.constrained import GBNF, GBNF_LANGUAGE, SCHEMA


def test_run_follows_a_grammar_file_and_a_json_schema(lf, tiny_target, tiny_dflash, tmp_path):
    g = tmp_path / "list.gbnf"
    g.write_text(GBNF)
    args = ("run", "-m", tiny_target, "--drafter", tiny_dflash, "-t", "1", "-c", "512", "-n", "48", "--temp", "0")
    r = lf(*args, "--grammar-file", g, "one two three")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(GBNF_LANGUAGE, r.stdout.rstrip("\n")), r.stdout
    r = lf(*args, "--json-schema", json.dumps(SCHEMA), "one two three")
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), SCHEMA)


def test_run_refuses_a_bad_grammar_or_schema_in_one_line(lf, tiny_target, tmp_path):
    bad = tmp_path / "bad.gbnf"
    bad.write_text('root ::= "a" nowhere\n')
    base = ("run", "-m", tiny_target, "-t", "1", "-c", "256", "-n", "4")
    for extra in (("--grammar-file", bad), ("--grammar-file", tmp_path / "missing.gbnf"), ("--json-schema", "{not json"),
                  ("--json-schema", '{"$ref": "#/nope"}')):
        r = lf(*base, *extra, "hi")
        assert r.returncode != 0 and r.stdout == "", (extra, r.stdout)
        lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in r.stderr, (extra, r.stderr)
