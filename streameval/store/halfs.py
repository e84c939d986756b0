"""float16 -> float32 with the CPU's own conversion (x86's F16C): ten times numpy's loop.

numpy converts float16 a value at a time (~0.8 ns a value, through float64: ``reading.upcast``),
as long as reading the store chunk; LLVM's ``fpext half to float`` is one F16C instruction for
eight values (0.3 against 3.2 ms for 2,048 x 2,048 values).  numba has no float16 type, so the
kernel reads the values' bits (uint16) and widens them by an intrinsic.  Without F16C, LLVM would
call a runtime helper numba does not link: the kernel is used only where the CPU has it
(``AVAILABLE``).  Exact either way: every float16 is a float32.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba as nb
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _has_f16c() -> bool:
    """Whether this CPU converts float16 by F16C (llvmlite raises where it cannot tell: then no)."""
    try:
        return "f16c" in llvm.get_host_cpu_features()
    except RuntimeError:
        return False


AVAILABLE = _has_f16c()


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
