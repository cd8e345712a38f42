// SN's full-size passes over the data, one pass each, parallel over the
// N x C rows of a contiguous (N, C, L) tensor. The per-row statistics and the
// rest of the analytic forward/backward stay in sn_mm/ops/sn_function.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <vector>

namespace {

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu(), name, ": expected a CPU tensor");
  TORCH_CHECK(x.dim() == 3, name, ": expected (N, C, L), got ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), name, ": expected a contiguous tensor");
}

// Rows per task: enough work per task to amortise scheduling.
int64_t grain(int64_t length) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(length, 1));
}

// Sums over a row in kLanes independent partial sums: the compiler turns
// them into SIMD adds (a single accumulator would serialise on its latency).
constexpr int kLanes = 16;

template <typename T>
inline double row_sum(const T* __restrict__ x, int64_t n) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k];
  double total = 0;
  for (int k = 0; k < kLanes; ++k) total += acc[k];
  for (; i < n; ++i) total += x[i];
  return total;
}

template <typename T>
inline double row_sq_dev(const T* __restrict__ x, int64_t n, T m) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const T d = x[i + k] - m;
      acc[k] += d * d;
    }
  double total = 0;
  for (int k = 0; k < kLanes; ++k) total += acc[k];
  for (; i < n; ++i) total += double(x[i] - m) * (x[i] - m);
  return total;
}

template <typename T>
inline double row_dot(const T* __restrict__ a, const T* __restrict__ b,
                      int64_t n) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += a[i + k] * b[i + k];
  double total = 0;
  for (int k = 0; k < kLanes; ++k) total += acc[k];
  for (; i < n; ++i) total += double(a[i]) * b[i];
  return total;
}

}  // namespace

// Per-row mean and variance (two passes over a row that is in cache:
// numerically as good as PyTorch's var_mean, without a full-size temporary).
std::vector<at::Tensor> row_moments(const at::Tensor& x, int64_t correction) {
  check_rows(x, "row_moments");
  const int64_t rows = x.size(0) * x.size(1), length = x.size(2);
  auto mean = at::empty({x.size(0), x.size(1)}, x.options());
  auto var = at::empty_like(mean);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_moments", [&] {
    const scalar_t* px = x.data_ptr<scalar_t>();
    scalar_t* pm = mean.data_ptr<scalar_t>();
    scalar_t* pv = var.data_ptr<scalar_t>();
    const double divisor = std::max<int64_t>(length - correction, 1);
    at::parallel_for(0, rows, grain(length), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = px + r * length;
        const double m = row_sum(row, length) / length;
        // Second pass over a row still in cache: exact centring.
        const double ss = row_sq_dev(row, length, static_cast<scalar_t>(m));
        pm[r] = static_cast<scalar_t>(m);
        pv[r] = static_cast<scalar_t>(ss / divisor);
      }
    });
  });
  return {mean, var};
}

// y = x * scale + shift, scale and shift per row.
at::Tensor row_affine(const at::Tensor& x, const at::Tensor& scale,
                      const at::Tensor& shift) {
  check_rows(x, "row_affine");
  const int64_t rows = x.size(0) * x.size(1), length = x.size(2);
  auto y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_affine", [&] {
    const scalar_t* px = x.data_ptr<scalar_t>();
    const scalar_t* ps = scale.data_ptr<scalar_t>();
    const scalar_t* pb = shift.data_ptr<scalar_t>();
    scalar_t* py = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain(length), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t s = ps[r], b = pb[r];
        const scalar_t* __restrict__ row = px + r * length;
        scalar_t* __restrict__ out = py + r * length;
        for (int64_t i = 0; i < length; ++i) out[i] = row[i] * s + b;
      }
    });
  });
  return y;
}

// Per-row sum of g and of g * x.
std::vector<at::Tensor> row_grad_sums(const at::Tensor& g,
                                      const at::Tensor& x) {
  check_rows(x, "row_grad_sums");
  check_rows(g, "row_grad_sums");
  const int64_t rows = x.size(0) * x.size(1), length = x.size(2);
  auto s1 = at::empty({x.size(0), x.size(1)}, x.options());
  auto s2 = at::empty_like(s1);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_grad_sums", [&] {
    const scalar_t* px = x.data_ptr<scalar_t>();
    const scalar_t* pg = g.data_ptr<scalar_t>();
    scalar_t* p1 = s1.data_ptr<scalar_t>();
    scalar_t* p2 = s2.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain(length), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* xr = px + r * length;
        const scalar_t* gr = pg + r * length;
        const double a = row_sum(gr, length);
        const double b = row_dot(gr, xr, length);
        p1[r] = static_cast<scalar_t>(a);
        p2[r] = static_cast<scalar_t>(b);
      }
    });
  });
  return {s1, s2};
}

// dx = g * scale + a * x + b, scale, a and b per row.
at::Tensor row_input_grad(const at::Tensor& g, const at::Tensor& x,
                          const at::Tensor& scale, const at::Tensor& a,
                          const at::Tensor& b) {
  check_rows(x, "row_input_grad");
  check_rows(g, "row_input_grad");
  const int64_t rows = x.size(0) * x.size(1), length = x.size(2);
  auto dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_input_grad", [&] {
    const scalar_t* px = x.data_ptr<scalar_t>();
    const scalar_t* pg = g.data_ptr<scalar_t>();
    const scalar_t* ps = scale.data_ptr<scalar_t>();
    const scalar_t* pa = a.data_ptr<scalar_t>();
    const scalar_t* pb = b.data_ptr<scalar_t>();
    scalar_t* pd = dx.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain(length), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t s = ps[r], ar = pa[r], br = pb[r];
        const scalar_t* __restrict__ xr = px + r * length;
        const scalar_t* __restrict__ gr = pg + r * length;
        scalar_t* __restrict__ out = pd + r * length;
        for (int64_t i = 0; i < length; ++i)
          out[i] = gr[i] * s + ar * xr[i] + br;
      }
    });
  });
  return dx;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "SN row kernels (CPU)";
  m.def("row_moments", &row_moments, "per-row mean and variance");
  m.def("row_affine", &row_affine, "x * scale + shift per row");
  m.def("row_grad_sums", &row_grad_sums, "per-row sums of g and g * x");
  m.def("row_input_grad", &row_input_grad, "g * scale + a * x + b per row");
}
