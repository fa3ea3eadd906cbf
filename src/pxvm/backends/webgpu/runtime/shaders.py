"""Loading WGSL kernel files shipped as package data (`pxvm/backends/webgpu/kernels/*.wgsl`).

Kernels are specialised only through WGSL `override` constants, so the text loaded
here is exactly what a browser loads from the same file.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

#: The package holding the kernel files (the browser page serves the same files)
KERNELS = __package__.rsplit(".", 1)[0] + ".kernels"


#: Kernels compiled without naga's runtime checks where the device's calls can
#: (native.NativeCalls; `PXVM_SHADER_CHECKS=1` keeps them everywhere, for debugging a
#: kernel). Naga bounds every array index and counts every loop's trips so that no WGSL
#: can reach outside its buffers or spin forever; these kernels' indices come from shapes
#: their ops check on the host and their loops from those shapes, and their tests run at
#: odd shapes on poisoned buffers. Without the checks the products and attention run
#: much faster (docs/benchmarks-log.md, issue 19). Kernels that index by data a user gives (the
#: pxVM interpreter) keep them, as do browsers, which always check; attention_paged's
#: block table is such data, which its kernel checks before following any entry.
UNCHECKED_KERNELS = frozenset({
    "matmul_blocked.wgsl", "matmul_f16_half.wgsl", "matmul_quant.wgsl",
    "matmul_quant_subgroups.wgsl", "matmul_quant_columns.wgsl", "attention_cached.wgsl",
    "attention_cached_subgroups.wgsl",
    "attention_prompt.wgsl", "attention_paged.wgsl", "attention_paged_subgroups.wgsl",
})


#: A kernel file's first line naming the file it extends: WGSL has no imports, so a
#: variant that needs a feature its base must not (subgroup operations: a module using
#: them does not compile without the feature) is a file of functions that replace the
#: base's of the same name, loaded with the base's text and sharing its entry points,
#: bindings and Params.
EXTENDS = re.compile(r"\A// extends (\w+\.wgsl)\n")
#: WGSL enable directives, which must precede every declaration of a module.
ENABLE = re.compile(r"^enable [\w, ]+;\n", re.MULTILINE)
#: A function declaration at the start of a line (pxvm's kernels declare them so).
FUNCTION = re.compile(r"^fn (\w+)\(", re.MULTILINE)


@functools.lru_cache(maxsize=None)
def load_wgsl(filename: str) -> str:
    """Return the source of `kernels/<filename>`; for a file that extends another
    (EXTENDS), the base's text without the functions the file replaces, then the file's
    own, the enable directives of both first."""
    text = resources.files(KERNELS).joinpath(filename).read_text(encoding="utf-8")
    base = EXTENDS.match(text)
    if base is None:
        return text
    own = text[base.end():]
    kept = load_wgsl(base.group(1))
    for name in FUNCTION.findall(own):
        kept = _without_function(kept, name)
    parts = [kept, own]
    directives = [d for part in parts for d in ENABLE.findall(part)]
    return "".join(dict.fromkeys(directives)) + "".join(ENABLE.sub("", part) for part in parts)


def function_span(text: str, name: str) -> tuple[int, int] | None:
    """Where function `name` is declared in `text`: from `fn name(` to just past the brace
    closing its body, braces in comments skipped; None where it is not."""
    found = re.search(rf"^fn {name}\(", text, re.MULTILINE)
    if found is None:
        return None
    depth, i = 0, text.index("{", found.end())
    while True:
        if text.startswith("//", i):
            i = text.index("\n", i)
        elif text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return found.start(), i + 1
        i += 1


def _without_function(text: str, name: str) -> str:
    """`text` without the declaration of function `name` (unchanged if it has none)."""
    span = function_span(text, name)
    if span is None:
        return text
    return text[:span[0]] + text[span[1]:].removeprefix("\n")


def enables(source: str) -> list[str]:
    """The extensions a module's enable directives name, e.g. ["f16", "subgroups"]."""
    return [name.strip() for d in ENABLE.findall(source)
            for name in d[len("enable "):-2].split(",")]


def kernel_files() -> list[str]:
    """Names of every shipped kernel file."""
    return sorted(
        p.name for p in resources.files(KERNELS).iterdir() if p.name.endswith(".wgsl")
    )


#: A group-0 resource declaration (web/static/gpu.js parses kernels with the same pattern).
BINDING = re.compile(
    r"@group\(\s*0\s*\)\s*@binding\(\s*(\d+)\s*\)\s*var\s*<\s*(storage|uniform)\s*(?:,\s*(read_write|read))?\s*>"
)


@functools.lru_cache(maxsize=None)
def declared_bindings(filename: str) -> tuple[tuple[int, str], ...]:
    """(binding, kind) of every group-0 resource declared in a kernel file; kind is
    "read-only-storage", "storage" or "uniform". All entry points of a file share this
    layout, so an entry point need not use every binding."""
    found = {}
    for m in BINDING.finditer(load_wgsl(filename)):
        index, space, access = int(m.group(1)), m.group(2), m.group(3)
        kind = "uniform" if space == "uniform" else (
            "storage" if access == "read_write" else "read-only-storage")
        if found.get(index, kind) != kind:
            raise ValueError(f"{filename}: binding {index} is declared with two kinds")
        found[index] = kind
    return tuple(sorted(found.items()))


_STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{([^}]*)\}")


def _fields(body: str) -> list[tuple[str, str]]:
    """(name, type) of a struct body's members, comments and whitespace removed."""
    body = re.sub(r"//[^\n]*", "", body)
    members, depth, start = [], 0, 0
    for i, ch in enumerate(body + ","):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            member = body[start:i].strip()
            start = i + 1
            if member:
                name, _, wgsl_type = member.partition(":")
                members.append((name.strip(), re.sub(r"\s+", "", wgsl_type)))
    return members


@functools.lru_cache(maxsize=None)
def struct_fields(filename: str, struct: str = "Params") -> tuple[tuple[str, str], ...]:
    """(name, type) of every member of `struct` in a kernel file, in order, types without
    whitespace (e.g. ("shape", "array<vec4<u32>,2>")). KeyError if there is none."""
    for m in _STRUCT.finditer(load_wgsl(filename)):
        if m.group(1) == struct:
            return tuple(_fields(m.group(2)))
    raise KeyError(f"{filename} declares no struct {struct}")
