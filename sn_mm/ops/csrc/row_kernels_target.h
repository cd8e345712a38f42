// Opens a region compiled for the instruction set SN_TARGET names (in
// GCC's and clang's target-attribute spelling) and includes the kernels in
// it; row_kernels_target_end.h closes it. GCC takes a target pragma for the
// rest of the file; clang applies the target attribute to every function
// declared in the region, lambdas included.
#ifndef SN_TARGET
#error "define SN_TARGET before including this file"
#endif
#define SN_PRAGMA(text) _Pragma(#text)
#if defined(__clang__)
#define SN_TARGET_REGION(isa)                                  \
  SN_PRAGMA(clang attribute push(__attribute__((target(isa))), \
                                 apply_to = function))
#else
#define SN_TARGET_REGION(isa) SN_PRAGMA(GCC target(isa))
#endif
SN_TARGET_REGION(SN_TARGET)
#include "reduction_kernels_impl.h"
