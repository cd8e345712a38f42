// SN's CPU row kernels for AVX2 and FMA, which sn_host.cpp runs only where
// the CPU has them.
#include "row_kernels.h"

#ifdef SN_X86
#define SN_ISA avx2
#define SN_TARGET "avx2,fma"
#define SN_REGISTER_BYTES 32
#include "row_kernels_impl.h"
#endif
