// SN's CPU row kernels for AVX-512 (F, VL, BW, DQ) with AVX2 and FMA, which
// sn_host.cpp runs only where the CPU has them.
#include "row_kernels.h"

#ifdef SN_X86
#define SN_ISA avx512
#define SN_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"
#define SN_REGISTER_BYTES 64
#include "row_kernels_impl.h"
#endif
