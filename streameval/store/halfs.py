"""float16 -> float32 with the CPU's own conversion (x86's F16C): ten times numpy's loop.

numpy converts float16 a value at a time (~0.8 ns a value, through float64: ``reading.upcast``),
as long as reading the store chunk; LLVM's ``fpext half to float`` is one F16C instruction for
eight values (0.3 against 3.2 ms for 2,048 x 2,048 values).  numba has no float16 type, so the
kernel reads the values' bits (uint16) and widens them by an intrinsic.  Without F16C, LLVM would
call a runtime helper numba does not link: the kernel is used only where numba compiles for a
CPU that has it (``AVAILABLE``).  Exact either way: every float16 is a float32.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba as nb
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _compiles_f16c() -> bool:
    """Whether the kernels numba compiles here may use F16C: the CPU features numba targets
    (NUMBA_CPU_FEATURES where set, as with NUMBA_CPU_NAME=generic for a cache portable between
    machines, which targets none; else this CPU's) include it.  The host's alone is not enough: a
    generic target without F16C made the widening a call numba cannot link, and the process
    crashed.  llvmlite raises where it cannot tell this CPU's features: then no."""
    features = nb.config.CPU_FEATURES
    if features is None:
        try:
            features = llvm.get_host_cpu_features().flatten()
        except RuntimeError:
            return False
    return "+f16c" in features.split(",")


AVAILABLE = _compiles_f16c()


@intrinsic
def _widened(typingctx, bits):
    """The float32 of the float16 whose bits are ``bits``."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@nb.njit(nogil=True, cache=True)
def widen(bits, out):
    """out[k] = the float32 of the float16 whose bits are bits[k] (flat arrays)."""
    for k in range(bits.shape[0]):
        out[k] = _widened(bits[k])
