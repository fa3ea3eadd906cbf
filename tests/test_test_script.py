"""scripts/test.sh, the README's test command, says what it installs before each quiet
(pip -q) install step, which takes minutes: no silent minutes."""

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test.sh"


def test_every_install_step_is_announced_first():
    code = [line.strip() for line in SCRIPT.read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]
    installs = [i for i, line in enumerate(code) if re.search(r"\$PIP |apt-get install", line)]
    assert len(installs) >= 5  # torch, pxvm[test], two models, system packages
    for i in installs:
        before = code[i][:code[i].index("$PIP")] if "$PIP" in code[i] else ""
        assert re.search(r"\bstep \"|echo \"installing", before + code[i - 1]), code[i]
