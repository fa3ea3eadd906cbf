"""A compiler from a small trained network to a .pxi: an MLP on scikit-learn's bundled
digits data set (offline), quantized to int8 weights, int32 accumulators and a requantize
step, emitted as one pxVM program that classifies every held-out digit at once.

    python -m pxvm.vm.digits            # or: pxvm digits -o digits.pxi
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..backends.webgpu import WebGPUBackend
from ..core import get_backend
from .assembler import assemble
from .cpu import run_program_cpu
from .gpu import run_program_gpu
from .io import save_pxi
from .protocol import (REQUANT_MAX_MULT, REQUANT_MAX_SHIFT, Matrix, ProgramError,
                       element_positions)

WIDTH = 128


@dataclass
class CompiledDigits:
    image: np.ndarray       # the .pxi program
    labels: np.ndarray      # held-out labels
    float_accuracy: float   # the float model's accuracy on the same held-out digits
    out: Matrix             # where ARGMAX writes the predicted classes


def train(hidden: int = 32, seed: int = 0):
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        from sklearn.neural_network import MLPClassifier
    except ImportError as exc:  # an optional dependency (pxvm[digits])
        raise ProgramError("the digits compiler needs scikit-learn: pip install 'pxvm[digits]'") from exc
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=seed,
                                                        stratify=y)
    clf = MLPClassifier(hidden_layer_sizes=(hidden,), max_iter=800, random_state=seed)
    clf.fit(X_train / 16.0, y_train)
    return clf, X_train, X_test, y_train, y_test


def multiplier_and_shift(scale: float) -> tuple[int, int]:
    """Integers (mult, shift) with mult / 2^shift ~ scale and mult < 2^16."""
    shift = min(REQUANT_MAX_SHIFT, int(math.floor(math.log2((REQUANT_MAX_MULT - 1) / scale))))
    return int(round(scale * 2**shift)), shift


def compile_digits(hidden: int = 32, seed: int = 0) -> CompiledDigits:
    clf, X_train, X_test, _, y_test = train(hidden, seed)
    w1, w2 = clf.coefs_
    b1, b2 = clf.intercepts_
    # Inputs are 0..16; the model saw x/16. Quantize x/16 with scale 1/127: x_q = x*127/16.
    s_x = 1.0 / 127
    xq = np.round(X_test / 16.0 / s_x).astype(np.int64)
    s_w1 = np.abs(w1).max() / 127
    w1q = np.round(w1 / s_w1).astype(np.int64)
    b1q = np.round(b1 / (s_x * s_w1)).astype(np.int64)
    # Hidden activations' scale from the training data (calibration).
    h_train = np.maximum(X_train / 16.0 @ w1 + b1, 0)
    s_h = max(h_train.max(), 1e-6) / 127
    mult, shift = multiplier_and_shift(s_x * s_w1 / s_h)
    s_w2 = np.abs(w2).max() / 127
    w2q = np.round(w2 / s_w2).astype(np.int64)
    b2q = np.round(b2 / (s_h * s_w2)).astype(np.int64)

    m, k = xq.shape
    layout = {}
    row = 1

    def place(name, rows, cols):
        nonlocal row
        layout[name] = Matrix(row, rows, cols)
        row += layout[name].image_rows(WIDTH) + 1

    place("w1", k, hidden)
    place("b1", 1, hidden)
    layout["rq"] = Matrix(row, 1, 2)
    row += 1
    place("w2", hidden, 10)
    place("b2", 1, 10)
    place("acc1", m, hidden)
    place("h", m, hidden)
    place("logits", m, 10)
    place("out", m, 1)
    place("x", m, k)  # last: with WIDTH 128 its rows lie past 255, so ROWHI is exercised

    L = {name: mat.row for name, mat in layout.items()}

    def values(a):
        return " ".join(str(int(v)) for v in np.asarray(a).reshape(-1))

    source = "\n".join([
        f".size {WIDTH} {row}",
        f"MATMUL_I8 {L['x']} {L['w1']} {L['acc1']}",
        f"BIAS_I32 {L['acc1']} {L['b1']}",
        f"REQUANT {L['acc1']} {L['rq']} {L['h']}",
        f"RELU_I8 {L['h']}",
        f"MATMUL_I8 {L['h']} {L['w2']} {L['logits']}",
        f"BIAS_I32 {L['logits']} {L['b2']}",
        f"ARGMAX_I32 {L['logits']} {L['out']}",
        "HALT",
        f".matrix {L['x']} {m} {k} {values(xq)}",
        f".matrix {L['w1']} {k} {hidden} {values(w1q)}",
        f".matrix32 {L['b1']} 1 {hidden} {values(b1q)}",
        f".requant {L['rq']} {mult} {shift} 0",
        f".matrix {L['w2']} {hidden} 10 {values(w2q)}",
        f".matrix32 {L['b2']} 1 10 {values(b2q)}",
    ])
    float_acc = float(clf.score(X_test / 16.0, y_test))
    return CompiledDigits(assemble(source), y_test, float_acc, layout["out"])


def predictions(result: np.ndarray, out: Matrix) -> np.ndarray:
    ys, xs = element_positions(out, result.shape[1])
    return result[ys, xs, 0].astype(np.int64) + 256 * result[ys, xs, 1].astype(np.int64)


def report(output=None, hidden: int = 32, backend: str = "auto", console=None):
    say = console.print if console is not None else print
    be = get_backend(backend)  # first: a notice that auto fell back comes before the results
    compiled = compile_digits(hidden)
    img = compiled.image
    say(f"digits MLP 64-{hidden}-10, {len(compiled.labels)} held-out digits; program "
        f"{img.shape[1]}x{img.shape[0]} pixels")
    say(f"float model accuracy:      {compiled.float_accuracy * 100:.2f}%")
    cpu = run_program_cpu(img)
    acc_cpu = float(np.mean(predictions(cpu, compiled.out) == compiled.labels))
    say(f".pxi on the CPU executor:  {acc_cpu * 100:.2f}%")
    if isinstance(be, WebGPUBackend):
        gpu = run_program_gpu(img, be)
        acc_gpu = float(np.mean(predictions(gpu, compiled.out) == compiled.labels))
        say(f".pxi on the GPU executor:  {acc_gpu * 100:.2f}% ({be.describe()})")
        say("CPU and GPU images: " + ("IDENTICAL" if np.array_equal(cpu, gpu) else "DIFFERENT"))
    if output is not None:
        save_pxi(img, output)
        say(f"wrote {output}")
    return compiled, acc_cpu


if __name__ == "__main__":
    report()
