"""A Jinja sandbox with bounds, for chat templates: code that comes inside a downloaded
model file. Jinja's own sandbox stops a template from reaching Python's internals, but
not from running for ever or allocating without bound (`range` loops nested, `'a' *
3000000000`, `center(10**10)`, `lipsum(10**6)`, a macro calling itself twice).

Threads cannot be killed, so rendering is bounded from inside: every place where a
template spends time or grows data passes through a hook of BoundedSandbox, and each
hook checks the render's Budget (ContextVar, so concurrent renders keep their own):

* every `for` loop's items (the code generator wraps each loop's iterable, recursive
  loops' calls included), at most MAX_LOOP_ITEMS per render;
* every call (functions, macros, methods), every intercepted operator (`*`, `**`, `+`,
  `%`), every output expression (`finalize`) and every join of output (`concat`, `~`)
  checks the wall clock against RENDER_SECONDS;
* whatever makes text or lists checks the size of its result BEFORE making it: `*` and
  `+` on strings and lists, `%`, `str.format`, the `format`, `center`, `indent`,
  `replace`, `join`, `string`, `pprint`, `tojson`, `batch`, `slice`, `sum` filters,
  `lipsum`, str methods that pad, and the joins of output; none may exceed MAX_TEXT
  characters (a list counts the characters of its items: printing it writes them).
  Integers are bounded to MAX_INT_BITS bits (`10 ** 10 ** 10` would never finish).

Any bound passed raises TemplateBoundError (a jinja2 SecurityError)."""

from __future__ import annotations

import contextvars
import re
import string
import time
from dataclasses import dataclass

from jinja2 import nodes, pass_eval_context
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.filters import FILTERS
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum

#: The longest text (and the largest list, in characters) a template may make: a prompt
#: ~2M tokens long, past any context pxvm runs by default.
MAX_TEXT = 8 << 20
#: Loop items a render may go through: real templates loop over messages and tools.
MAX_LOOP_ITEMS = 1_000_000
#: Wall-clock seconds a render may take; real templates take milliseconds.
RENDER_SECONDS = 5.0
#: A field width, precision, indent or pad a template may ask for.
MAX_WIDTH = 10_000
#: The size of integers a template may compute.
MAX_INT_BITS = 1 << 16
#: `range` lengths, batch and slice counts, and lipsum's paragraphs and words.
MAX_RANGE = 100_000
MAX_LIPSUM = (100, 1000)


class TemplateBoundError(SecurityError):
    """The template went past one of the render's bounds."""


@dataclass
class Budget:
    deadline: float
    loop_items: int = MAX_LOOP_ITEMS

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateBoundError(f"rendering took more than {RENDER_SECONDS:g} s")


_budget: contextvars.ContextVar[Budget] = contextvars.ContextVar("template_budget")


def _tick() -> None:
    _budget.get().tick()


def render_bounded(template, **variables) -> str:
    """`template.render(**variables)` within the bounds (a template of BoundedSandbox)."""
    token = _budget.set(Budget(time.monotonic() + RENDER_SECONDS))
    try:
        return template.render(**variables)
    finally:
        _budget.reset(token)


# ---- sizes ---------------------------------------------------------------------------------
def _weight(value, limit: int, memo: dict) -> int:
    """The characters `value` takes as text (about: a list's repr adds a few per item),
    counting shared items each time they occur; TemplateBoundError past `limit`."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3 + 2
    if isinstance(value, Namespace):  # printed as <Namespace ...>: only its data counts
        value = dict(object.__getattribute__(value, "_Namespace__attrs"))
    if not isinstance(value, (list, tuple, dict, set, frozenset)):
        return 8
    key = id(value)
    if key in memo:
        return memo[key]
    memo[key] = 0  # in progress: a cycle adds nothing
    items = (x for kv in value.items() for x in kv) if isinstance(value, dict) else value
    total = 2
    for item in items:
        total += _weight(item, limit, memo) + 2
        if total > limit:
            raise TemplateBoundError(f"a value of more than {limit:,} characters")
    memo[key] = total
    return total


def within(value, limit: int = MAX_TEXT) -> int:
    """`value`'s size in characters, TemplateBoundError when over `limit`."""
    size = _weight(value, limit, {})
    if size > limit:
        raise TemplateBoundError(f"a value of more than {limit:,} characters")
    return size


def _check_size(size: int, what: str) -> None:
    if size > MAX_TEXT:
        raise TemplateBoundError(f"{what} would make {size:,} characters, over the bound of "
                                 f"{MAX_TEXT:,}")


def _check_width(width, what: str) -> None:
    if isinstance(width, int) and abs(width) > MAX_WIDTH:
        raise TemplateBoundError(f"{what} {width:,} is over the bound of {MAX_WIDTH:,}")


_NUMBERS = re.compile(r"\d+")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?([#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?)[hlL]?.",
                           re.DOTALL)


def _spec_widths(spec: str) -> int:
    if "*" in spec:
        raise TemplateBoundError("a format taking its width from an argument ('*')")
    widths = [int(n) for n in _NUMBERS.findall(spec)]
    for width in widths:
        _check_width(width, "a format width")
    return sum(widths)


def _check_percent(fmt: str, args) -> None:
    """`fmt % args` within MAX_TEXT: each conversion may write all of args, padded."""
    specs = _PERCENT_SPEC.findall(fmt)
    per_field = within(args)
    _check_size(len(fmt) + sum(_spec_widths(s) + per_field for s in specs), "a '%' format")


def _check_brace(fmt: str, args) -> None:
    """`fmt.format(*args)` within MAX_TEXT; formats nested in specs are refused."""
    per_field, total = within(args), len(fmt)
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is None:
            continue
        if spec and "{" in spec:
            raise TemplateBoundError("a format spec holding another field")
        total += _spec_widths(spec or "") + per_field
    _check_size(total, "a format")


def bounded_join(pieces, what: str) -> str:
    """The pieces joined, checked against MAX_TEXT and the clock as they come."""
    budget, size, kept = _budget.get(), 0, []
    for piece in pieces:
        size += len(piece)
        _check_size(size, what)
        budget.tick()
        kept.append(piece)
    return "".join(kept)


# ---- filters and globals, with their bounds ---------------------------------------------
def _center(value, width=80):
    _check_width(width, "center's width")
    return FILTERS["center"](value, width)


def _indent(s, width=4, first=False, blank=False):
    pad = len(width) if isinstance(width, str) else width
    _check_width(pad, "indent's width")
    lines = str(s).count("\n") + 1
    _check_size(len(str(s)) + lines * max(pad, 0), "indent")
    return FILTERS["indent"](s, width, first, blank)


def _format(value, *args, **kwargs):
    _check_percent(str(value), (args, kwargs))
    return FILTERS["format"](value, *args, **kwargs)


@pass_eval_context
def _replace(eval_ctx, s, old, new, count=None):
    s, old, new = str(s), str(old), str(new)
    n = s.count(old) if count is None or count < 0 else min(count, s.count(old))
    _check_size(len(s) + n * (len(new) - len(old)), "replace")
    return FILTERS["replace"](eval_ctx, s, old, new, count)


@pass_eval_context
def _join(eval_ctx, value, d="", attribute=None):
    items = list(value)
    _check_size(within(items) + len(str(d)) * len(items), "join")
    return FILTERS["join"](eval_ctx, items, d, attribute)


def _string(value):
    within(value)
    return FILTERS["string"](value)


def _pprint(value):
    within(value)
    return FILTERS["pprint"](value)


def _batch(value, linecount, fill_with=None):
    if linecount > MAX_RANGE:
        raise TemplateBoundError(f"batch's count {linecount:,} is over the bound of "
                                 f"{MAX_RANGE:,}")
    return FILTERS["batch"](value, linecount, fill_with)


def _slice(value, slices, fill_with=None):
    if slices > MAX_RANGE:
        raise TemplateBoundError(f"slice's count {slices:,} is over the bound of {MAX_RANGE:,}")
    return FILTERS["slice"](value, slices, fill_with)


def _sum(environment, iterable, attribute=None, start=0):
    # Summing lists copies the total so far at each step: only numbers are summed.
    if not isinstance(start, (int, float)) or isinstance(start, bool):
        raise TemplateBoundError("sum adds numbers only")
    return FILTERS["sum"](environment, iterable, attribute, start)


_sum.jinja_pass_arg = FILTERS["sum"].jinja_pass_arg  # type: ignore[attr-defined]


def _lipsum(n=5, html=True, min=20, max=100):
    if n > MAX_LIPSUM[0] or max > MAX_LIPSUM[1] or min > MAX_LIPSUM[1]:
        raise TemplateBoundError(f"lipsum of more than {MAX_LIPSUM[0]} paragraphs of "
                                 f"{MAX_LIPSUM[1]} words")
    return generate_lorem_ipsum(n, html, min, max)


def _range(*args):
    numbers = range(*args)
    if len(numbers) > MAX_RANGE:
        raise TemplateBoundError(f"a range of {len(numbers):,} numbers, over the bound of "
                                 f"{MAX_RANGE:,}")
    return numbers


#: str methods that pad: their width argument is bounded.
_PADDING_METHODS = ("center", "ljust", "rjust", "zfill", "expandtabs")


def _check_method_call(obj, args, kwargs) -> None:
    """Bounds of the str methods that make large text (called on a template's value)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return
    if name in _PADDING_METHODS:
        for width in (*args[:1], *kwargs.values()):
            _check_width(width, f"{name}'s width")
        if name == "expandtabs":
            _check_size(len(owner) * (args[0] if args else 8), "expandtabs")
    elif name == "replace" and len(args) >= 2:
        _check_size(len(owner) + owner.count(str(args[0])) * len(str(args[1])), "replace")
    elif name == "join" and args:
        items = args[0]
        _check_size(within(items) + len(owner) * len(items), "join")


# ---- the environment -------------------------------------------------------------------
class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with every loop's iterable passed through
    `environment.loop_items` and every `~` through `environment.joined`."""

    def visit_For(self, node, frame):
        wrapped = nodes.Call(nodes.EnvironmentAttribute("loop_items"), [node.iter], [], None,
                             None, lineno=node.lineno)
        bounded = nodes.For(node.target, wrapped, node.body, node.else_, node.test,
                            node.recursive, lineno=node.lineno)
        bounded.set_environment(self.environment)
        super().visit_For(bounded, frame)

    def visit_Concat(self, node, frame):
        self.write("environment.joined((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable Jinja sandbox whose renders (render_bounded) stay within the module's
    bounds of time, loop items and sizes."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options):
        super().__init__(finalize=self._finalize, **options)
        self.globals["range"] = _range
        self.globals["lipsum"] = _lipsum
        self.filters.update(center=_center, indent=_indent, format=_format, replace=_replace,
                            join=_join, string=_string, pprint=_pprint, batch=_batch,
                            slice=_slice, sum=_sum)

    def loop_items(self, iterable):
        budget = _budget.get()
        for item in iterable:
            budget.loop_items -= 1
            if budget.loop_items < 0:
                raise TemplateBoundError(f"loops went through more than {MAX_LOOP_ITEMS:,} "
                                         "items")
            budget.tick()
            yield item

    def call(self, context, obj, /, *args, **kwargs):
        _tick()
        if getattr(obj, "__name__", "") == "join" and args:
            args = (list(args[0]), *args[1:])  # sized before joining, so made a list
        _check_method_call(obj, args, kwargs)
        if isinstance(obj, LoopContext) and args:  # a recursive loop's next level
            args = (self.loop_items(args[0]), *args[1:])
        return super().call(context, obj, *args, **kwargs)

    def call_binop(self, context, operator, left, right):
        _tick()
        if operator == "*":
            _check_product(left, right)
        elif operator == "**":
            _check_power(left, right)
        elif operator == "+" and not isinstance(left, (int, float)):
            _check_size(within(left) + within(right), "'+'")
        elif operator == "%" and isinstance(left, str):
            _check_percent(left, right)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        def bounded(*args, **kwargs):
            _tick()
            _check_brace(fmt, (args, kwargs))
            return wrapper(*args, **kwargs)

        return bounded

    def _finalize(self, value):
        # printing a list writes its items: bound it before str() does
        _tick()
        if not isinstance(value, str):
            within(value)
        return value

    def concat(self, pieces) -> str:
        """Joins of output (a whole render, a macro's, a {% set %} block's)."""
        return bounded_join(pieces, "the template's output")

    def joined(self, parts) -> str:
        """`a ~ b ~ ...`"""
        _tick()
        _check_size(sum(within(p) for p in parts), "'~'")
        return "".join(map(str, parts))


def _check_product(left, right) -> None:
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateBoundError(f"a product of more than {MAX_INT_BITS:,} bits")
        return
    seq, n = (left, right) if isinstance(right, int) else (right, left)
    if isinstance(n, int) and isinstance(seq, (str, list, tuple)):
        _check_size(within(seq) * max(n, 0), "'*'")


def _check_power(base, exponent) -> None:
    if (isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1
            and exponent > 0 and base.bit_length() * exponent > MAX_INT_BITS):
        raise TemplateBoundError(f"a power of more than {MAX_INT_BITS:,} bits")
