// Closes the region row_kernels_target.h opened (clang's attribute push;
// GCC's target pragma holds to the end of the file).
#if defined(__clang__)
#pragma clang attribute pop
#endif
