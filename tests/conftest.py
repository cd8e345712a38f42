import os

import torch

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors.
# Triton reads this when a kernel is defined, so it is set before any test
# imports sn_mm's Triton kernels.
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
