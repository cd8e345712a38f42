"""Compiles SN's Triton kernels for NVIDIA GPUs without one: Triton lowers
them to PTX and its bundled ptxas assembles a cubin, so type and lowering
errors that Triton's interpreter lets through show up here. Run as a script
(tests/test_triton_kernels.py does) without TRITON_INTERPRET set; prints one
line per kernel, length and architecture."""
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sn_mm.ops import triton_kernels

KERNELS = ('_moments_kernel', '_normalize_kernel', '_grad_sums_kernel',
           '_input_grad_kernel')
FLOATS = ('divisor', 'eps', 'two_over_divisor')


def signature_of(kernel, constexprs, floats=FLOATS, pointer_types=None):
    """Triton's signature for ``kernel``: constexprs as given, pointers
    float32 unless ``pointer_types`` names them, ``floats`` as fp32 scalars,
    other arguments int32."""
    pointer_types = pointer_types or {}
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = 'constexpr'
        elif name.endswith('_ptr'):
            signature[name] = pointer_types.get(name, '*fp32')
        elif name in floats:
            signature[name] = 'fp32'
        else:
            signature[name] = 'i32'
    return signature


def compile_source(kernel, signature, constexprs, arch):
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget('cuda', arch, 32))


def compile_kernel(kernel, length, arch):
    rows, block = triton_kernels._config(length)
    constexprs = {'ROWS': rows, 'BLOCK': block}
    signature = signature_of(kernel, constexprs)
    if length == 1:  # Triton specialises an integer argument equal to 1
        signature['length'] = 'constexpr'
        constexprs['length'] = 1
    return compile_source(kernel, signature, constexprs, arch)


def main():
    cases = [(length, 90) for length in (1, 49, 60800)] + [(49, 80)]
    for name in KERNELS:
        for length, arch in cases:
            compiled = compile_kernel(getattr(triton_kernels, name), length,
                                      arch)
            print(f'{name} length={length} sm_{arch} '
                  f'cubin={len(compiled.asm["cubin"])}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
