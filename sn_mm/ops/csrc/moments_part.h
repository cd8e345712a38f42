// The count, mean and sum of squared deviations (M2) of a part of some
// values, and Chan's formula that combines two parts (in double): the row
// kernels combine a long row's chunks with it (row_kernels_impl.h,
// chunked_rows). It has internal linkage, so that each instruction set's
// kernels compile their own copy and none is shared with code that runs on
// another set.
#pragma once

namespace sn_mm_rows {
namespace {

struct MomentsPart {
  double count = 0, mean = 0, m2 = 0;
};

inline MomentsPart combined(const MomentsPart& a, const MomentsPart& b) {
  if (a.count == 0) return b;
  if (b.count == 0) return a;
  const double count = a.count + b.count, d = b.mean - a.mean;
  return {count, a.mean + d * b.count / count,
          a.m2 + b.m2 + d * d * a.count * b.count / count};
}

}  // namespace
}  // namespace sn_mm_rows
