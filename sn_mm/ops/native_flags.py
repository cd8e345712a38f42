"""How SN's C++ CPU kernels compile, for both builds: on first use
(native.py) and at install (setup.py, which cannot import torch-dependent
modules). Imports nothing but the standard library."""
import glob
import os.path as osp

# -fno-math-errno: sqrt sets no errno, so loops with it vectorise;
# -Wno-psabi: vectors pass by value only between inlined functions.
CFLAGS = ('-O3', '-fopenmp', '-fno-math-errno', '-Wno-psabi')
LDFLAGS = ('-fopenmp', )
CSRC = osp.join(osp.dirname(osp.abspath(__file__)), 'csrc')


def sources(csrc: str = CSRC) -> list:
    """The C++ files the kernels build from."""
    return sorted(glob.glob(osp.join(csrc, '*.cpp')))
