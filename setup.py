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


def read_requirements(name):
    with open(os.path.join('requirements', name)) as f:
        return [
            line.split('#')[0].strip() for line in f
            if line.split('#')[0].strip()
        ]


def extensions():
    """The C++ CPU kernels built at install, only when SN_MM_BUILD_EXT=1
    asks (against the installed torch, so with --no-build-isolation).
    Otherwise the wheel is pure Python and sn_mm builds them against the
    running torch when first needed (sn_mm/ops/native.py)."""
    if os.environ.get('SN_MM_BUILD_EXT') != '1':
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        sys.exit('SN_MM_BUILD_EXT=1 builds the kernels against the '
                 'installed torch, which this build environment lacks: '
                 'install with pip install --no-build-isolation')
    sys.path.insert(0, os.path.join('sn_mm', 'ops'))
    # native.py's flags and sources, so that both builds compile the same
    from native_flags import CFLAGS, LDFLAGS, sources
    ext = CppExtension(
        'sn_mm._ext', [
            os.path.relpath(path)
            for path in sources(os.path.join('sn_mm', 'ops', 'csrc'))
        ],
        extra_compile_args=list(CFLAGS),
        extra_link_args=list(LDFLAGS))
    return [ext], {'build_ext': BuildExtension}


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
    # What `import sn_mm` needs. The OpenMMLab packages are installed as
    # mmdet's guide installs them (mim: mmcv's prebuilt wheels), so they are
    # the `mim` extra, and sn_mm checks their versions at import.
    install_requires=read_requirements('install.txt'),
    extras_require={'mim': read_requirements('mminstall.txt')},
    # Tested on Python 3.8 (torch 2.1.2) and 3.11 (torch 2.14.1) in CI, 3.12
    # (torch 2.14.1) by hand (docs/get_started.md#supported-versions); torch
    # 2.1 to 2.14 (docs/get_started.md#supported-versions).
    python_requires='>=3.8',
    classifiers=[
        'Programming Language :: Python :: 3.8',
        'Programming Language :: Python :: 3.9',
        'Programming Language :: Python :: 3.10',
        'Programming Language :: Python :: 3.11',
        'Programming Language :: Python :: 3.12',
    ],
    license='Apache-2.0',
)
