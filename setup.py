import os
import sys
from setuptools import find_packages, setup


def read_version():
    scope = {}
    with open('sn_mm/version.py') as f:
        exec(f.read(), scope)
    return scope['__version__']


def extensions():
    """The native CPU kernels of SN (sn_mm._ext). SN_MM_NO_EXT=1 skips them;
    sn_mm then runs the same computation in plain PyTorch."""
    if os.environ.get('SN_MM_NO_EXT') == '1':
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension
    ext = CppExtension(
        'sn_mm._ext',
        ['sn_mm/ops/csrc/sn_kernels.cpp'] + [
            f'sn_mm/ops/csrc/row_kernels_{isa}.cpp'
            for isa in ('avx512', 'avx2', 'baseline')
        ],
        # -fno-math-errno: sqrt sets no errno, so loops with it vectorise;
        # -Wno-psabi: vectors pass by value only between inlined functions.
        extra_compile_args=[
            '-O3', '-fopenmp', '-fno-math-errno', '-Wno-psabi'
        ],
        extra_link_args=['-fopenmp'])

    class OptionalBuildExtension(BuildExtension):
        """A compiler that cannot build the kernels (an unusual platform)
        leaves sn_mm installable: SN then runs on the reference on CPUs,
        as with SN_MM_NO_EXT=1."""

        def run(self):
            try:
                super().run()
            except Exception as err:  # any compiler or linker failure
                print(
                    f'WARNING: sn_mm: the C++ kernels did not build '
                    f'({type(err).__name__}: {err}); SN runs on PyTorch '
                    'ops on CPUs (tests/test_native_kernels.py says so)',
                    file=sys.stderr)

    return [ext], {'build_ext': OptionalBuildExtension}


ext_modules, cmdclass = extensions()
setup(
    name='sn_mm',
    version=read_version(),
    description='Switchable Normalization (SN, SyncSN) for OpenMMLab',
    packages=find_packages(exclude=('tests', 'configs', 'tools')),
    package_data={'sn_mm': ['ops/csrc/*.cpp', 'ops/csrc/*.h']},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    python_requires='>=3.8',
    license='Apache-2.0',
)
