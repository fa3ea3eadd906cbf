"""pxVM commands: asm -> run/compare/disasm/show, and one-line errors with exit code 1."""

import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, ImageFont


def pxvm(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pxvm", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_assemble_run_compare_disassemble_and_show(gpu_device, tmp_path):
    src = tmp_path / "p.pxs"
    src.write_text(".size 16 16\nDOT_RGB 1 2 3\nHALT\n.vector 1 1 2 3 4\n.vector 2 10 20 30 40\n")
    pxi = tmp_path / "p.pxi"
    assert pxvm("asm", str(src), "-o", str(pxi)).returncode == 0
    run = pxvm("run", str(pxi), "--backend", "cpu", "-o", str(tmp_path / "out.pxi"))
    assert run.returncode == 0 and "pixel (x=0, y=3): (0, 0, 0, 0) -> (44, 1, 0, 0)" in run.stdout
    cmp = pxvm("compare", str(pxi))
    assert cmp.returncode == 0 and "IDENTICAL" in cmp.stdout, cmp.stdout + cmp.stderr
    dis = pxvm("disasm", str(pxi))
    assert dis.returncode == 0 and "DOT_RGB 1 2 3" in dis.stdout
    (tmp_path / "again.pxs").write_text(dis.stdout)
    assert pxvm("asm", str(tmp_path / "again.pxs"), "-o", str(tmp_path / "again.pxi")).returncode == 0
    assert (tmp_path / "again.pxi").read_bytes() == pxi.read_bytes()
    assert pxvm("show", str(pxi), "-o", str(tmp_path / "view.png")).returncode == 0
    assert Image.open(tmp_path / "view.png").size[0] >= 16 * 8


def test_bad_program_is_one_line_and_exit_code_1(tmp_path):
    bad = tmp_path / "bad.pxi"
    bad.write_bytes(b"this is not a png")
    proc = pxvm("run", str(bad), "--backend", "cpu")
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "not a PNG" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_backend_is_one_line_naming_the_valid_ones(tmp_path):
    src = tmp_path / "p.pxs"
    src.write_text(".size 16 16\nDOT_RGB 1 2 3\nHALT\n")
    pxi = tmp_path / "prog.pxi"
    assert pxvm("asm", str(src), "-o", str(pxi)).returncode == 0
    proc = pxvm("run", str(pxi), "--backend", "bogus")
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    words = set(re.findall(r"\w+", proc.stderr))
    assert "bogus" in words
    assert {"auto", "numpy", "cpu", "webgpu", "wgpu", "gpu"} <= words


def test_show_refuses_a_picture_past_its_bound_and_a_scale_past_64(tmp_path):
    src = tmp_path / "wide.pxs"
    src.write_text(".size 4000 3000\nHALT\n")  # drawn at 4 pixels a pixel: 192M pixels
    pxi = tmp_path / "wide.pxi"
    assert pxvm("asm", str(src), "-o", str(pxi)).returncode == 0
    proc = pxvm("show", str(pxi), "-o", str(tmp_path / "view.png"))
    assert proc.returncode == 1 and "192,000,000 pixels" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "view.png").exists()
    assert pxvm("show", str(pxi), "-o", str(tmp_path / "v.png"), "--scale", "65").returncode == 2


def test_digits_chooses_its_backend_before_any_result():
    # the backend is settled (and a fallback notice printed) before the seconds of training
    # and results, so a backend that cannot be had stops it at once, with nothing printed
    proc = pxvm("digits", "--backend", "no-such-backend")
    assert proc.returncode == 1
    assert "unknown backend 'no-such-backend'" in proc.stderr
    assert "accuracy" not in proc.stdout


def test_show_names_each_instruction_whole(tmp_path):
    # row 0 of the picture's label band holds the names; each one's drawn text spans (read
    # upwards) as many pixels as PIL's font says the whole name takes, not a 4-letter stub
    src = tmp_path / "p.pxs"
    src.write_text(".size 16 16\nMATMUL_I8 1 2 3\nARGMAX_I32 1 1\nHALT\n")
    pxi, png = tmp_path / "p.pxi", tmp_path / "view.png"
    assert pxvm("asm", str(src), "-o", str(pxi)).returncode == 0
    assert pxvm("show", str(pxi), "-o", str(png), "--scale", "8").returncode == 0
    picture = np.asarray(Image.open(png).convert("RGB")).astype(int)
    font = ImageFont.load_default()
    label_ink = (picture[..., 0] > 150) & (picture[..., 2] < 200)  # the labels' yellow
    for column, name in ((0, "MATMUL_I8"), (1, "ARGMAX_I32")):
        rows = np.nonzero(label_ink[:, column * 8:column * 8 + 8].any(axis=1))[0]
        rows = rows[rows < picture.shape[0] - 16 * 8]  # the band above the program's cells
        assert rows.max() - rows.min() + 1 >= font.getlength(name) - 2, name


@pytest.mark.parametrize("backend", ["cpu", "numpy", "cuda"])
def test_compare_says_what_it_compares_when_the_backend_has_no_gpu_executor(backend, tmp_path):
    pxi = tmp_path / "p.pxi"
    (tmp_path / "p.pxs").write_text(".size 16 16\nDOT_RGB 1 2 3\nHALT\n")
    assert pxvm("asm", str(tmp_path / "p.pxs"), "-o", str(pxi)).returncode == 0
    proc = pxvm("compare", str(pxi), "--backend", backend)
    assert proc.returncode == 1, proc.stdout
    assert "CPU executor and on the GPU executor (WebGPU)" in proc.stderr
    assert f"--backend {backend} has no GPU executor" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


def test_compare_runs_on_a_webgpu_device_asked_for_by_flag(gpu_device, tmp_path):
    pxi = tmp_path / "p.pxi"
    (tmp_path / "p.pxs").write_text(".size 16 16\nDOT_RGB 1 2 3\nHALT\n")
    assert pxvm("asm", str(tmp_path / "p.pxs"), "-o", str(pxi)).returncode == 0
    proc = pxvm("compare", str(pxi), "--backend", "webgpu")
    assert proc.returncode == 0 and "IDENTICAL" in proc.stdout, proc.stderr


def test_asm_refuses_a_source_past_its_bound_without_reading_it(tmp_path):
    huge = tmp_path / "huge.pxs"
    with open(huge, "wb") as f:
        f.truncate((1 << 30) + 1)  # sparse: a size, no data to read
    proc = pxvm("asm", str(huge), "-o", str(tmp_path / "huge.pxi"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "over 1024 MiB" in proc.stderr

