// Switchable Whitening's full-size passes as operators (sn_mm::sw_moments,
// sw_apply, sw_products), CPU only, without autograd: SW's Python side
// (sn_mm/models/switchable_whitening.py) composes them, with the small
// c x c computations between them in PyTorch ops.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <tuple>

#include "sn_host.h"

using namespace sn_mm_cpu;

namespace {

// Rows (B, c, L), contiguous, of a dtype the kernels have.
void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(
      t.dim() == 3 && t.is_contiguous() &&
          (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble),
      "sn_mm::sw_*: ", name,
      " must be contiguous float32 or float64 rows (B, c, L), got ", t.sizes(),
      " ", t.scalar_type());
}

// A (B, c, ...) companion of rows x, contiguous, of x's dtype.
void check_fits(const at::Tensor& t, const at::Tensor& x, at::IntArrayRef tail,
                const char* name) {
  std::vector<int64_t> shape{x.size(0)};
  shape.insert(shape.end(), tail.begin(), tail.end());
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape) && t.is_contiguous() &&
                  t.scalar_type() == x.scalar_type(),
              "sn_mm::sw_*: ", name, " must be contiguous ", shape, " ",
              x.scalar_type(), ", got ", t.sizes(), " ", t.scalar_type());
}

// Blocks per task: about 32K values each.
template <typename Args>
void run_blocks(const Args& a, int64_t blocks) {
  const int64_t per =
      std::max<int64_t>(1, 32768 / std::max<int64_t>(a.c * a.length, 1));
  at::parallel_for(0, blocks, per,
                   [&](int64_t b0, int64_t b1) { run(a, b0, b1); });
}

std::tuple<at::Tensor, at::Tensor> sw_moments(const at::Tensor& x) {
  check_rows(x, "x");
  TORCH_CHECK(x.size(2) > 0 || x.size(0) * x.size(1) == 0,
              "sn_mm::sw_moments: rows of no values have no moments");
  const int64_t c = x.size(1);
  auto mean = at::empty({x.size(0), c}, x.options());
  auto cov = at::empty({x.size(0), c, c}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sw_moments", [&] {
    run_blocks(SwMomentsArgs<scalar_t>{x.data_ptr<scalar_t>(), c, x.size(2),
                                       mean.data_ptr<scalar_t>(),
                                       cov.data_ptr<scalar_t>()},
               x.size(0));
  });
  return {mean, cov};
}

at::Tensor sw_apply(const at::Tensor& m1, const at::Tensor& in1,
                    const OptTensor& shift1, const OptTensor& m2,
                    const OptTensor& in2, const OptTensor& shift2,
                    const OptTensor& bias) {
  check_rows(in1, "in1");
  const int64_t c = in1.size(1);
  TORCH_CHECK(m2.has_value() == in2.has_value() &&
                  m2.has_value() == shift2.has_value(),
              "sn_mm::sw_apply: m2, in2 and shift2 go together");
  check_fits(m1, in1, {c, c}, "m1");
  if (shift1) check_fits(*shift1, in1, {c}, "shift1");
  if (m2) {
    check_fits(*m2, in1, {c, c}, "m2");
    TORCH_CHECK(in2->sizes() == in1.sizes(), "sn_mm::sw_apply: in2 ",
                in2->sizes(), " must have in1's shape ", in1.sizes());
    check_rows(*in2, "in2");
    check_fits(*shift2, in1, {c}, "shift2");
  }
  if (bias) check_fits(*bias, in1, {c}, "bias");
  auto out = at::empty_like(in1);
  AT_DISPATCH_FLOATING_TYPES(in1.scalar_type(), "sw_apply", [&] {
    auto ptr = [](const OptTensor& t) {
      return t ? t->data_ptr<scalar_t>() : nullptr;
    };
    run_blocks(SwApplyArgs<scalar_t>{m1.data_ptr<scalar_t>(),
                                     in1.data_ptr<scalar_t>(), ptr(shift1),
                                     ptr(m2), ptr(in2), ptr(shift2), ptr(bias),
                                     c, in1.size(2), out.data_ptr<scalar_t>()},
               in1.size(0));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> sw_products(const at::Tensor& g,
                                               const at::Tensor& x,
                                               const at::Tensor& shift) {
  check_rows(g, "g");
  check_rows(x, "x");
  TORCH_CHECK(g.sizes() == x.sizes() && g.scalar_type() == x.scalar_type(),
              "sn_mm::sw_products: g ", g.sizes(), " and x ", x.sizes(),
              " must have one shape and dtype");
  const int64_t c = x.size(1);
  check_fits(shift, x, {c}, "shift");
  auto out = at::empty({x.size(0), c, c}, x.options());
  auto g_sum = at::empty({x.size(0), c}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sw_products", [&] {
    run_blocks(SwProductsArgs<scalar_t>{g.data_ptr<scalar_t>(),
                                        x.data_ptr<scalar_t>(),
                                        shift.data_ptr<scalar_t>(), c,
                                        x.size(2), out.data_ptr<scalar_t>(),
                                        g_sum.data_ptr<scalar_t>()},
               x.size(0));
  });
  return {out, g_sum};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sn_mm, m) {
  m.def("sw_moments(Tensor x) -> (Tensor, Tensor)");
  m.def(
      "sw_apply(Tensor m1, Tensor in1, Tensor? shift1, Tensor? m2, "
      "Tensor? in2, Tensor? shift2, Tensor? bias) -> Tensor");
  m.def("sw_products(Tensor g, Tensor x, Tensor shift) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sn_mm, CPU, m) {
  m.impl("sw_moments", &sw_moments);
  m.impl("sw_apply", &sw_apply);
  m.impl("sw_products", &sw_products);
}
