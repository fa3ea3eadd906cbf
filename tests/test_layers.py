"""The layers only point down (core -> batch -> ops -> backends -> clients -> cli) and
the backends never import one another: import-linter checks the contracts in
pyproject.toml, so a wrong-way import fails here. Ops name no backend."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_imports_a_higher_layer():
    # import-linter's own command (lint-imports), run by this interpreter
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    result = subprocess.run([sys.executable, "-c", command, "--no-cache", "--no-logo"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def _imports_inside_functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    yield node.lineno, node.level, node.module or ""
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        yield node.lineno, 0, alias.name


def test_no_function_imports_pxvm_itself():
    # A pxvm module imported inside a function would hide a cycle from the layers check;
    # only optional third-party packages (wgpu's internals, scikit-learn) load lazily.
    found = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        for line, level, module in _imports_inside_functions(path):
            if level > 0 or module.split(".")[0] in ("pxvm", "pixel_llm"):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {'.' * level}{module}")
    assert not found, "\n".join(found)
