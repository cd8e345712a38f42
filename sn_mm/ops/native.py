"""SN's C++ CPU kernels (``csrc/``): found or built when first needed.

The wheel is pure Python and carries the kernels' sources. The first call
that needs them (an SN layer on a CPU tensor, or :func:`native_status`)
takes, in this order:

1. ``SN_MM_NO_EXT=1``: none; SN runs on PyTorch ops on CPUs, as asked.
2. ``sn_mm._ext``, built at install when asked
   (``SN_MM_BUILD_EXT=1 pip install --no-build-isolation .``).
3. The kernels compiled against the running torch with
   ``torch.utils.cpp_extension.load`` into torch's extensions cache
   (``$TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``), in a
   folder named by a key of the torch and Python versions, the compiler and
   its version, the flags and the sources: built once (about a minute on
   two cores, logged with its time), then loaded from the cache. ``$CXX``
   picks the compiler (``c++`` otherwise); ``$MAX_JOBS`` the parallel jobs.

Whatever stops the kernels (no compiler, no ninja, a failed build, a built
library that does not load) gives one warning that names the cause and what
fixes it; SN then runs on PyTorch ops on CPUs, which compute the same, more
slowly. :func:`native_status` says which path SN takes and why.
"""
import glob
import hashlib
import importlib
import importlib.util
import os
import os.path as osp
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from typing import NamedTuple, Optional

import torch

from .native_flags import CFLAGS, CSRC, LDFLAGS, sources

NO_EXT_ENV = 'SN_MM_NO_EXT'
FIX = ('install a C++ compiler with OpenMP (GCC 11 or later: apt install '
       'g++; or clang 14 or later with libomp-dev, CXX=clang++) and ninja '
       '(pip install ninja), or build at install with SN_MM_BUILD_EXT=1 '
       'pip install --no-build-isolation sn_mm; SN_MM_NO_EXT=1 silences '
       'this')


class NativeStatus(NamedTuple):
    """Where SN's CPU kernels come from in this process.

    ``origin``: ``'prebuilt'`` (``sn_mm._ext``), ``'built'`` (compiled by
    this process), ``'cached'`` (compiled earlier, loaded from the cache),
    ``'disabled'`` (``SN_MM_NO_EXT=1``) or ``'failed'``; ``path``: the
    library loaded; ``reason``: why SN takes that path, in words.
    """
    available: bool
    origin: str
    path: Optional[str]
    reason: str


_status: Optional[NativeStatus] = None


def native_status() -> NativeStatus:
    """Find, load or build the kernels (once per process) and say how SN
    runs on CPUs."""
    global _status
    if _status is None:
        status = _load()
        if status.available:
            torch.ops.sn_mm.cpu_isa()  # a bad $SN_MM_CPU_ISA fails here
        elif status.origin == 'failed':
            warnings.warn(
                f'sn_mm: SN runs on PyTorch ops on CPUs, more slowly: '
                f'{status.reason}',
                RuntimeWarning,
                stacklevel=3)
        _status = status
    return _status


def native_available() -> bool:
    """Whether SN's C++ CPU kernels run in this process (loading or building
    them on the first call)."""
    # (SN's route asks on every CPU call: the cached status, no more.)
    return (_status or native_status()).available


def _load() -> NativeStatus:
    if os.environ.get(NO_EXT_ENV) == '1':
        return NativeStatus(False, 'disabled', None,
                            f'{NO_EXT_ENV}=1 turns the C++ kernels off')
    stale = None
    if importlib.util.find_spec('sn_mm._ext') is not None:
        try:
            module = importlib.import_module('sn_mm._ext')
            return NativeStatus(True, 'prebuilt', module.__file__,
                                'sn_mm._ext, built at install')
        except (ImportError, OSError) as err:
            # e.g. torch upgraded after the build: compile for this one.
            stale = f'the prebuilt sn_mm._ext does not load ({err})'
    status = _build()
    if stale is not None:
        status = status._replace(reason=f'{status.reason}; {stale}')
    return status


def compiler() -> str:
    """The C++ compiler a build uses: ``$CXX``, else ``c++`` (as torch)."""
    return os.environ.get('CXX') or 'c++'


def _compiler_identity(cxx_path: str) -> str:
    try:
        out = subprocess.run([cxx_path, '--version'],
                             capture_output=True,
                             text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return cxx_path
    return out.splitlines()[0] if out else cxx_path


def build_key(cxx_identity: str) -> str:
    """What a built library depends on, hashed: torch, Python, the
    compiler, the flags and every source and header."""
    digest = hashlib.sha256()
    for part in (torch.__version__, sys.version, cxx_identity, *CFLAGS,
                 *LDFLAGS):
        digest.update(part.encode() + b'\0')
    for path in sorted(glob.glob(osp.join(CSRC, '*'))):
        digest.update(osp.basename(path).encode() + b'\0')
        with open(path, 'rb') as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def extensions_dir() -> str:
    """torch's extensions cache: ``$TORCH_EXTENSIONS_DIR``, else
    ``$XDG_CACHE_HOME/torch_extensions`` (``~/.cache`` by default)."""
    root = os.environ.get('TORCH_EXTENSIONS_DIR')
    if root:
        return root
    cache = os.environ.get('XDG_CACHE_HOME') or osp.expanduser('~/.cache')
    return osp.join(cache, 'torch_extensions')


def _build() -> NativeStatus:
    from torch.utils import cpp_extension
    cxx = compiler()
    cxx_path = shutil.which(cxx)
    if cxx_path is None:
        return NativeStatus(
            False, 'failed', None,
            f'no C++ compiler to build the kernels: {cxx!r} (CXX) is not '
            f'found; {FIX}')
    if not cpp_extension.is_ninja_available():
        return NativeStatus(
            False, 'failed', None,
            f'ninja, which torch builds extensions with, is not found; '
            f'{FIX}')
    identity = _compiler_identity(cxx_path)
    name = f'sn_mm_cpu_{build_key(identity)}'
    folder = osp.join(extensions_dir(), name)
    library = osp.join(folder, f'{name}.so')
    cached = osp.exists(library)
    if not cached:
        _log(f'sn_mm: compiling SN\'s C++ CPU kernels for torch '
             f'{torch.__version__} with {identity} into {folder} (once for '
             f'this torch, compiler and source; about a minute on two '
             f'cores)')
    start = time.perf_counter()
    try:
        os.makedirs(folder, exist_ok=True)
        with warnings.catch_warnings():
            # torch's note on a compiler other than the one it was built
            # with: GCC and clang build the kernels alike (tested).
            warnings.simplefilter('ignore', UserWarning)
            cpp_extension.load(
                name,
                _sources_in(folder),
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                build_directory=folder,
                is_python_module=False,
                verbose=os.environ.get('SN_MM_VERBOSE_BUILD') == '1')
    except Exception as err:  # compiler, linker or loader: all named
        text = str(err).strip().splitlines()
        detail = '\n'.join(_error_lines(text)) or type(err).__name__
        what = ('does not load' if osp.exists(library) else 'did not build')
        return NativeStatus(
            False, 'failed', None,
            f'the C++ kernels {what} with {identity} in {folder}:\n'
            f'{detail}\n(SN_MM_VERBOSE_BUILD=1 prints the whole build); '
            f'{FIX}')
    seconds = time.perf_counter() - start
    if cached:
        return NativeStatus(True, 'cached', library,
                            f'built earlier with {identity}, cached')
    _log(f'sn_mm: built SN\'s C++ CPU kernels in {seconds:.1f} s')
    return NativeStatus(True, 'built', library,
                        f'built with {identity} in {seconds:.1f} s')


def _sources_in(folder: str) -> list:
    """The kernels' sources, copied once into the build ``folder``, which
    its name ties to their content. torch writes the paths it is given into
    the folder's build.ninja, and ninja rebuilds every object whose command
    changed: built from their own paths, two installs of one sn_mm (a
    checkout and a wheel, or a copy) sharing a cache would each rebuild it
    after the other."""
    copy = osp.join(folder, 'src')
    if not osp.isdir(copy):
        staging = tempfile.mkdtemp(dir=folder)
        for path in glob.glob(osp.join(CSRC, '*')):
            shutil.copy2(path, staging)  # (mtimes kept: objects stay newer)
        try:
            os.rename(staging, copy)
        except OSError:  # another process put its copy there first
            shutil.rmtree(staging, ignore_errors=True)
    return sources(copy)


def _error_lines(lines, keep=12):
    """The lines of a build's output that say what failed (the compiler's
    errors first), at most ``keep``."""
    errors = [line for line in lines if 'error' in line.lower()]
    return (errors or lines)[:keep]


def _log(message: str) -> None:
    # mmengine's current logger: the runner's log file and the console
    # during training, the console otherwise.
    from mmengine.logging import print_log
    print_log(message, logger='current')
