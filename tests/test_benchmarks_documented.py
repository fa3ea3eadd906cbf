"""benchmarks/ holds maintained entry points only: each is documented in its README."""

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.rglob("*")
                 if p.is_file() and p.suffix in (".py", ".sh") and "__pycache__" not in p.parts)


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_script_is_documented_in_the_readme(script):
    assert f"`{script}`" in (BENCHMARKS / "README.md").read_text()


def test_benchmarks_folder_has_scripts():
    assert "llm.py" in SCRIPTS and "ab.py" in SCRIPTS
