"""`pxvm pixels pack / unpack / show`: files written, the same bytes back, a picture, and
user errors as one line with exit code 1 through the real entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from make_tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402

from pxvm.cli import app  # noqa: E402
from pxvm.core.errors import PxvmError  # noqa: E402

runner = CliRunner()


def pxvm(*args):
    return subprocess.run([sys.executable, "-m", "pxvm", *args], capture_output=True,
                          text=True, timeout=300)


def tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(), np.random.default_rng(3))
    return path


def test_pack_unpack_and_show_write_what_they_say(tmp_path):
    path = tiny(tmp_path)
    packed = runner.invoke(app, ["pixels", "pack", str(path), "-o", str(tmp_path / "px")])
    assert packed.exit_code == 0, packed.output
    assert "into" in packed.output and (tmp_path / "px" / "metadata-0000.png").exists()
    back = runner.invoke(app, ["pixels", "unpack", str(tmp_path / "px"), "-o",
                               str(tmp_path / "back.gguf")])
    assert back.exit_code == 0, back.output
    assert (tmp_path / "back.gguf").read_bytes() == path.read_bytes()
    for model, extra in ((path, []), (tmp_path / "px", ["--tensor", "blk.0.ffn_up.weight"]),
                         (tmp_path / "px", ["--scales"]), (path, ["--diff", str(path)])):
        out = tmp_path / "view.png"
        shown = runner.invoke(app, ["pixels", "show", str(model), "-o", str(out), *extra])
        assert shown.exit_code == 0, shown.output
        assert "blk.0.ffn_up.weight" in shown.output and Image.open(out).size[0] > 100


def test_user_errors_name_the_problem(tmp_path):
    path = tiny(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for args, words in (
            (["unpack", str(tmp_path), "-o", str(tmp_path / "o.gguf")], "no pixel container"),
            (["show", str(path), "-o", str(tmp_path / "v.png"), "--tensor", "nope"],
             "no tensor 'nope'"),
            (["show", str(path), "-o", str(tmp_path / "v.png"), "--tensor",
              "output_norm.weight", "--scales"], "no quant blocks")):
        result = runner.invoke(app, ["pixels", *args])
        assert isinstance(result.exception, PxvmError), result.output
        assert words in str(result.exception)
    # through the real entry point: one line, exit code 1
    proc = pxvm("pixels", "pack", str(path), "-o", str(tmp_path / "full"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "not an empty folder" in proc.stderr
    assert "Traceback" not in proc.stderr
