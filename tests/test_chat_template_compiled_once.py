"""A chat template is compiled once per source text, not once per request (a Qwen template costs ~10 ms to compile)."""

import pytest

from localflash.errors import LocalflashError
from localflash.prompt import _compiled, render_chat
from localflash.serve.assistant import _TemplateOnly

SOURCE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


def test_second_render_of_a_template_reuses_its_compiled_form():
    model = _TemplateOnly(SOURCE + "{# compiled-once #}")
    before = _compiled.cache_info()
    first = render_chat(model, [{"role": "user", "content": "hi"}])
    second = render_chat(model, [{"role": "user", "content": "bye"}])
    after = _compiled.cache_info()
    assert first == "<|user|>hi\n<|assistant|>" and second == "<|user|>bye\n<|assistant|>"
    assert after.misses - before.misses == 1 and after.hits - before.hits == 1


def test_a_template_that_does_not_compile_is_one_clear_error_each_time():
    model = _TemplateOnly("{% for m in messages %}")
    for _ in range(2):
        with pytest.raises(LocalflashError, match="chat template of the model failed"):
            render_chat(model, [{"role": "user", "content": "hi"}])
