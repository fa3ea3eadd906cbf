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
    for previous, i in zip([-1, *installs], installs):
        # said since the install before: on its line (`cond || { step ...; $PIP ...; }`)
        # or the lines before it
        said = " ".join(code[previous + 1:i]) + code[i].split("$PIP")[0]
        assert re.search(r"\bstep \"|echo \"installing", said), code[i]
