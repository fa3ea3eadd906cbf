"""pxVM: programs as RGBA images (.pxi) run by a CPU and a GPU executor that agree byte
for byte. Specification: docs/pixel-protocol.md."""

from .cpu import run_program_cpu
from .gpu import record_program, run_program_gpu
from .io import load_pxi, save_pxi
from .protocol import PROTOCOL_VERSION, BudgetExceededError, ProgramError, validate_program

__all__ = ["PROTOCOL_VERSION", "BudgetExceededError", "ProgramError", "load_pxi",
           "record_program", "run_program_cpu", "run_program_gpu", "save_pxi", "validate_program"]
