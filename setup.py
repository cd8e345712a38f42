import os
import shutil
import sys
from setuptools import find_packages, setup

# What OpenMMLab's `mim` reads from an installed package (<package>/.mim/):
# `mim search` the model index, `mim train`/`mim test` the configs and tools.
MIM_FILES = ('configs', 'tools', 'model-index.yml')


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
        [
            f'sn_mm/ops/csrc/{name}.cpp'
            for name in ('sn_operator', 'sn_host', 'sn_forward', 'sn_backward',
                         'cpu_isa')
        ] + [
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


def add_mim_extension():
    """Copy the configs, tools and model index under sn_mm/.mim for a
    regular install or wheel, as mmdet does. An editable install gets none:
    mim looks for them in site-packages, where an editable install has no
    package folder; there the checkout's tools/ and configs/ are run."""
    if not any(
            cmd in sys.argv
            for cmd in ('install', 'bdist_wheel', 'build', 'build_py')):
        return
    root = os.path.dirname(os.path.abspath(__file__))
    mim_dir = os.path.join(root, 'sn_mm', '.mim')
    shutil.rmtree(mim_dir, ignore_errors=True)
    os.makedirs(mim_dir)
    for name in MIM_FILES:
        source, target = (os.path.join(root,
                                       name), os.path.join(mim_dir, name))
        if os.path.isdir(source):
            shutil.copytree(
                source,
                target,
                ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copyfile(source, target)


add_mim_extension()
ext_modules, cmdclass = extensions()
setup(
    name='sn_mm',
    version=read_version(),
    description='Switchable Normalization (SN, SyncSN) for OpenMMLab',
    packages=find_packages(exclude=('tests', 'configs', 'tools')),
    package_data={
        'sn_mm': [
            'ops/csrc/*.cpp', 'ops/csrc/*.h', '.mim/model-index.yml',
            '.mim/configs/**/*.py', '.mim/configs/**/*.yml', '.mim/tools/*',
            '.mim/tools/**/*'
        ]
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    # Tested on Python 3.8 (torch 2.1.2) and 3.11 (torch 2.14.1); torch
    # 2.1 to 2.14 (docs/get_started.md#supported-versions).
    python_requires='>=3.8',
    classifiers=[
        'Programming Language :: Python :: 3.8',
        'Programming Language :: Python :: 3.9',
        'Programming Language :: Python :: 3.10',
        'Programming Language :: Python :: 3.11',
    ],
    license='Apache-2.0',
)
