"""Chat templates are code from downloaded files: rendering them is bounded in loop items,
time and sizes (pxvm.llm.template_sandbox), and whatever goes wrong in one is one
ChatTemplateError naming the model file."""

from __future__ import annotations

import time

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pxvm.llm import template_sandbox
from pxvm.llm.chat import ChatTemplateError, render_chat

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]


def _refused(template: str, match: str, seconds: float = 2.0) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match=match) as caught:
        render_chat(MESSAGES, template, source="hostile.gguf")
    assert time.monotonic() - t0 < seconds
    message = str(caught.value)
    assert "hostile.gguf" in message and "\n" not in message


def test_a_template_within_bounds_renders_as_jinjas_own_sandbox():
    template = ("{% for m in messages %}{% if loop.first %}[{{ loop.length }}]{% endif %}"
                "{{ m.role|upper }}: {{ m.content|center(20) }}|{{ '%-5s' % m.role }}"
                "{{ '{:>4}'.format(loop.index) }}{{ (m.content ~ '!') * 2 }}"
                "{{ m.content|replace('i', 'ii') }}{{ ', '.join([m.role, m.content]) }}"
                "{% endfor %}{% for i in range(3) %}{{ i ** 2 }}{% endfor %}"
                "{{ range(5)|batch(2)|list }}{{ messages|map(attribute='role')|join('/') }}")
    reference = ImmutableSandboxedEnvironment().from_string(template).render(messages=MESSAGES)
    assert render_chat(MESSAGES, template) == reference


def test_nested_range_loops_stop_at_the_loop_bound():
    _refused("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
             "loops went through more than 1,000,000 items", seconds=10)


def test_recursive_loops_count_their_items_too():
    _refused("{% for x in [range(100000)] * 100 recursive %}{% if x is iterable %}{{ loop(x) }}"
             "{% endif %}{% endfor %}", "loops went through more than", seconds=10)


@pytest.mark.parametrize("template,match", [
    ("{{ lipsum(10**6) }}", "lipsum"),
    ("{{ 'a' * 3000000000 }}", "'\\*' would make 9,000,000,000 characters"),
    ("{{ ['a'] * 3000000000 }}", "'\\*' would make"),
    ("{{ 'a'|center(3000000000) }}", "center's width 3,000,000,000"),
    ("{{ messages|tojson(indent=3000000000) }}", "tojson's indent"),
    ("{{ 'x'|indent(3000000000) }}", "indent's width"),
    ("{{ '%099999999d'|format(1) }}", "format width"),
    ("{{ '%*d'|format(3000000000, 1) }}", "width from an argument"),
    ("{{ '%0999999999d' % 1 }}", "format width"),
    ("{{ '{:>999999999}'.format(1) }}", "format width"),
    ("{{ '{:{w}}'.format(1, w=999999999) }}", "another field"),
    ("{{ 'a'.ljust(3000000000) }}", "ljust's width"),
    ("{{ ('a' * 1000000).replace('a', 'a' * 20) }}", "replace would make"),
    ("{{ ('a' * 1000000)|replace('a', 'a' * 20) }}", "replace would make"),
    ("{{ ', '.join(['a' * 1000000] * 8) ~ 'x' * 1000000 }}", "would make"),
    ("{{ [1]|batch(3000000000, 0)|list }}", "batch's count"),
    ("{{ [1]|slice(3000000000, 0)|list }}", "slice's count"),
    ("{{ [[1] * 100000] * 80|sum(start=[]) }}", "sum adds numbers only"),
    ("{{ range(3000000000) }}", "a range of 3,000,000,000 numbers"),
    ("{{ 10 ** 100000 }}", "a power of more than"),
    ("{% set a = 'a' * 1000000 %}{{ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a }}", "'~' would make"),
    ("{% set a = 'a' * 1000000 %}{{ [a] * 8 + [a] }}", "'\\+' would make"),
    ("{{ range(100000)|map(attribute='x', default='a' * 100000)|list }}",
     "a value of more than"),
    (("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}{{ ns.s }}"), "'\\+' would make"),
    ("{% set x %}{% for i in range(1000) %}{{ 'a' * 10000 }}{% endfor %}{% endset %}{{ x }}",
     "the template's output would make"),
    ("{% for i in range(1000) %}{{ 'a' * 10000 }}{% endfor %}",
     "the template's output would make"),
])
def test_growth_past_the_bounds_is_refused_before_it_happens(template, match):
    _refused(template, match)


def test_rendering_stops_at_its_wall_clock_bound(monkeypatch):
    # 2^40 macro calls, each doing nothing: only the clock can stop it
    monkeypatch.setattr(template_sandbox, "RENDER_SECONDS", 0.5)
    _refused("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
             "{{ f(40) }}", "rendering took more than 0.5 s")


@pytest.mark.parametrize("template,match", [
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{{ messages[99] }}{{ 'a' + 1 }}", "TypeError|unsupported"),
    ("{% for %}", "(?i)expected"),
    ("(" * 200 + "{{ (" * 300 + "1" + ")" * 300 + " }}", "failed"),
])
def test_runtime_and_syntax_errors_are_one_template_error(template, match):
    _refused(template, match)


def test_a_template_that_is_not_text_is_refused():
    with pytest.raises(ChatTemplateError, match="hostile.gguf.*not text but list"):
        render_chat(MESSAGES, ["{{ messages }}"], source="hostile.gguf")


def test_the_templates_own_refusal_says_so():
    with pytest.raises(ChatTemplateError, match="refused the messages: no system role"):
        render_chat(MESSAGES, "{{ raise_exception('no system role') }}", source="m.gguf")
