// SN's CPU kernels: the full-size passes over a contiguous (N, C, L) input,
// one pass each and parallel over its N x C rows, and the reductions of the
// (N, C) statistics between them. The glue (softmax, BN statistics and their
// all-reduce, ratio gradients) stays in sn_mm/ops/sn_function.py, and
// sn_mm/ops/torch_kernels.py holds the PyTorch version of every kernel here.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

// The extension is built without -march flags so that it runs on any x86-64;
// GCC's target clones add AVX2 and AVX-512 versions of the kernels, picked at
// load time for the CPU at hand.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__)
#define SN_ISA_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SN_ISA_CLONES
#endif
#define SN_INLINE __attribute__((always_inline)) inline

namespace {

// ---------------------------------------------------------------- checks --

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu(), name, ": expected a CPU tensor");
  TORCH_CHECK(x.dim() == 3, name, ": expected (N, C, L), got ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), name, ": expected a contiguous tensor");
}

void check_vector(const at::Tensor& v, int64_t size, at::ScalarType dtype,
                  const char* name, const char* what) {
  TORCH_CHECK(v.device().is_cpu() && v.is_contiguous() &&
                  v.numel() == size && v.scalar_type() == dtype,
              name, ": ", what, " must be a contiguous CPU tensor of ", size,
              " elements of type ", dtype, ", got ", v.sizes(), " ",
              v.scalar_type());
}

// Rows per task: enough work per task to amortise scheduling.
int64_t grain(int64_t length) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(length, 1));
}

// ------------------------------------------------------------ row sums --
// Row sums run in `Lanes` independent partial sums, which the compiler turns
// into SIMD adds (one accumulator would serialise on its latency). Short rows
// (RoI features: 7 x 7) take one vector's worth, so that little time goes to
// folding the lanes together; long rows take several vectors.
constexpr int64_t kShortRow = 128;

template <int Lanes, typename T>
SN_INLINE T fold(T* acc) {
  for (int width = Lanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  return acc[0];
}

template <int Lanes, typename T>
SN_INLINE T row_sum(const T* __restrict__ x, int64_t n) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) acc[k] += x[i + k];
  T tail = 0;
  for (; i < n; ++i) tail += x[i];
  return fold<Lanes>(acc) + tail;
}

// sum of (x - shift): summing deviations from a value of the row (its first)
// keeps the partial sums small when |mean| >> std, so the mean keeps the
// precision of the data instead of that of the sum.
template <int Lanes, typename T>
SN_INLINE T row_sum_shifted(const T* __restrict__ x, int64_t n, T shift) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) acc[k] += x[i + k] - shift;
  T tail = 0;
  for (; i < n; ++i) tail += x[i] - shift;
  return fold<Lanes>(acc) + tail;
}

template <int Lanes, typename T>
SN_INLINE T row_sq_dev(const T* __restrict__ x, int64_t n, T m) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) {
      const T d = x[i + k] - m;
      acc[k] += d * d;
    }
  T tail = 0;
  for (; i < n; ++i) tail += (x[i] - m) * (x[i] - m);
  return fold<Lanes>(acc) + tail;
}

// sum of a * (b - m): centred on the row mean m, so that an input far from
// zero (|mean| >> std) loses nothing to cancellation.
template <int Lanes, typename T>
SN_INLINE T row_dot_centred(const T* __restrict__ a, const T* __restrict__ b,
                            int64_t n, T m) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) acc[k] += a[i + k] * (b[i + k] - m);
  T tail = 0;
  for (; i < n; ++i) tail += a[i] * (b[i] - m);
  return fold<Lanes>(acc) + tail;
}

// --------------------------------------------------------------- kernels --
// Each kernel takes its arguments as one struct and a range of rows (or, for
// the reductions, of samples n).

template <typename T>
struct MomentsArgs {
  const T* x;
  T* mean;
  T* var;
  int64_t length;
  T divisor;
};

// Per row: mean, then the squared deviations from it while the row is still
// in cache (exact centring, no full-size temporary).
template <int Lanes, typename T>
SN_INLINE void moments_rows(const MomentsArgs<T>& a, int64_t begin,
                            int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* row = a.x + r * a.length;
    const T m = row[0] + row_sum_shifted<Lanes>(row, a.length, row[0]) /
                             static_cast<T>(a.length);
    a.mean[r] = m;
    a.var[r] = row_sq_dev<Lanes>(row, a.length, m) / a.divisor;
  }
}

template <typename T>
SN_INLINE void moments_kernel(const MomentsArgs<T>& a, int64_t begin,
                              int64_t end) {
  if (a.length < kShortRow)
    moments_rows<8>(a, begin, end);
  else
    moments_rows<32>(a, begin, end);
}

template <typename T>
struct GradSumsArgs {
  const T* g;
  const T* x;
  const T* mean_in;
  T* sum_g;
  T* sum_gxc;
  int64_t length;
};

template <typename T>
SN_INLINE void grad_sums_kernel(const GradSumsArgs<T>& a, int64_t begin,
                                int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* g = a.g + r * a.length;
    const T* x = a.x + r * a.length;
    const T m = a.mean_in[r];
    if (a.length < kShortRow) {
      a.sum_g[r] = row_sum<8>(g, a.length);
      a.sum_gxc[r] = row_dot_centred<8>(g, x, a.length, m);
    } else {
      a.sum_g[r] = row_sum<32>(g, a.length);
      a.sum_gxc[r] = row_dot_centred<32>(g, x, a.length, m);
    }
  }
}

template <typename T>
struct NormalizeArgs {
  const T *x, *mean_in, *var_in, *mu_n, *var_n, *mu_c, *var_c, *weight,
      *bias;
  T wm_in, wv_in, eps;
  T *y, *mu, *rstd;
  int64_t channels, length;
};

// Per row (n, c): mix the statistics, mu = wm_in * mean_in + mu_n + mu_c and
// likewise the variance, then y = (x - mu) * scale + bias with
// scale = weight / sqrt(var + eps) (x - mu first: x * scale - mu * scale
// would cancel when |mu| >> std). Keeps mu and 1 / sqrt(var + eps).
template <typename T>
SN_INLINE void normalize_kernel(const NormalizeArgs<T>& a, int64_t begin,
                                int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t n = r / a.channels, c = r % a.channels;
    const T mu = a.wm_in * a.mean_in[r] + a.mu_n[n] + a.mu_c[c];
    const T var = a.wv_in * a.var_in[r] + a.var_n[n] + a.var_c[c];
    const T rstd = T(1) / std::sqrt(var + a.eps);
    const T s = a.weight[c] * rstd, b = a.bias[c];
    a.mu[r] = mu;
    a.rstd[r] = rstd;
    const T* __restrict__ row = a.x + r * a.length;
    T* __restrict__ out = a.y + r * a.length;
    for (int64_t i = 0; i < a.length; ++i) out[i] = (row[i] - mu) * s + b;
  }
}

template <typename T>
struct InputGradArgs {
  const T *g, *x, *sum_g, *sum_gxc, *mu, *rstd, *weight, *mean_in, *dvar_n,
      *dmean_n, *center_n, *dvar_c, *dmean_c, *center_c;
  T wm_in, wv_in, two_over_divisor;
  T* dx;
  int64_t channels, length;
};

// dx = g * scale + a * (x - mean_in) + b per row, a and b from the gradients
// of the row's IN mean and variance (the formulas of input_grad in
// sn_mm/ops/torch_kernels.py).
template <typename T>
SN_INLINE void input_grad_kernel(const InputGradArgs<T>& a, int64_t begin,
                                 int64_t end) {
  const T inv_length = T(1) / static_cast<T>(a.length);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t n = r / a.channels, c = r % a.channels;
    const T rstd = a.rstd[r], s = a.weight[c] * rstd, m = a.mean_in[r];
    const T centred = a.sum_gxc[r] - (a.mu[r] - m) * a.sum_g[r];
    const T d_mu = -s * a.sum_g[r];
    const T d_var = T(-0.5) * s * rstd * rstd * centred;
    const T d_var_in = a.dvar_n[n] + a.dvar_c[c] + a.wv_in * d_var;
    const T d_mean_in = a.dmean_n[n] + a.dmean_c[c] + a.wm_in * d_mu +
                        T(2) * (m - a.center_n[n]) * a.dvar_n[n] +
                        T(2) * (m - a.center_c[c]) * a.dvar_c[c];
    const T coef_x = d_var_in * a.two_over_divisor;
    const T shift = d_mean_in * inv_length;
    const T* __restrict__ xr = a.x + r * a.length;
    const T* __restrict__ gr = a.g + r * a.length;
    T* __restrict__ out = a.dx + r * a.length;
    for (int64_t i = 0; i < a.length; ++i)
      out[i] = gr[i] * s + coef_x * (xr[i] - m) + shift;
  }
}

// One cloned entry point per kernel and dtype (target clones cannot be
// templates); everything they call is inlined into each ISA version.
#define SN_CLONED(kernel, Args, T)                                    \
  SN_ISA_CLONES void kernel##_##T(const Args<T>& a, int64_t begin,    \
                                  int64_t end) {                      \
    kernel##_kernel(a, begin, end);                                   \
  }                                                                   \
  void run(const Args<T>& a, int64_t begin, int64_t end) {            \
    kernel##_##T(a, begin, end);                                      \
  }
SN_CLONED(moments, MomentsArgs, float)
SN_CLONED(moments, MomentsArgs, double)
SN_CLONED(grad_sums, GradSumsArgs, float)
SN_CLONED(grad_sums, GradSumsArgs, double)
SN_CLONED(normalize, NormalizeArgs, float)
SN_CLONED(normalize, NormalizeArgs, double)
SN_CLONED(input_grad, InputGradArgs, float)
SN_CLONED(input_grad, InputGradArgs, double)
#undef SN_CLONED

template <typename Args>
void run_rows(const Args& args, int64_t rows, int64_t length) {
  at::parallel_for(0, rows, grain(length), [&](int64_t begin, int64_t end) {
    run(args, begin, end);
  });
}

// Sums over the samples n of an (N, C) computation: each task adds its
// block of samples into its own `width` partial sums in double, which are
// then added up. `fn(n, acc)` handles sample n, adding into acc[0, width).
template <typename Fn>
std::vector<double> sum_over_samples(int64_t samples, int64_t width,
                                     const Fn& fn) {
  const int64_t tasks = std::max<int64_t>(
      1, std::min<int64_t>(at::get_num_threads(), samples));
  std::vector<double> partial(tasks * width, 0.0);
  const int64_t per_task = (samples + tasks - 1) / tasks;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t end = std::min(samples, (t + 1) * per_task);
      for (int64_t n = t * per_task; n < end; ++n)
        fn(n, partial.data() + t * width);
    }
  });
  std::vector<double> total(width, 0.0);
  for (int64_t t = 0; t < tasks; ++t)
    for (int64_t i = 0; i < width; ++i) total[i] += partial[t * width + i];
  return total;
}

}  // namespace

// Per-row mean and variance, the variance's divisor L - correction.
std::vector<at::Tensor> row_moments(const at::Tensor& x, int64_t correction) {
  check_rows(x, "row_moments");
  const int64_t rows = x.size(0) * x.size(1), length = x.size(2);
  auto mean = at::empty({x.size(0), x.size(1)}, x.options());
  auto var = at::empty_like(mean);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_moments", [&] {
    MomentsArgs<scalar_t> args{
        x.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(),
        var.data_ptr<scalar_t>(), length,
        static_cast<scalar_t>(std::max<int64_t>(length - correction, 1))};
    run_rows(args, rows, length);
  });
  return {mean, var};
}

// LN and BN statistics from the IN moments (Eq. 5), in the stable form:
// per sample n, mean_ln = mean_c(mean_in) and var_ln = mean_c(var_in) +
// mean_c((mean_in - mean_ln)^2); per channel c, mean_c = mean_n(mean_in) and
// m2_c = sum_n(var_in) + sum_n((mean_in - mean_c)^2), the BN variance times
// the number of samples. Algebraically the released mean(var_in +
// mean_in^2) - mean^2, without its cancellation when |mean| >> std.
std::vector<at::Tensor> moment_reductions(const at::Tensor& mean_in,
                                          const at::Tensor& var_in) {
  TORCH_CHECK(mean_in.dim() == 2, "moment_reductions: expected (N, C)");
  const int64_t samples = mean_in.size(0), channels = mean_in.size(1);
  check_vector(mean_in, samples * channels, mean_in.scalar_type(),
               "moment_reductions", "mean_in");
  check_vector(var_in, samples * channels, mean_in.scalar_type(),
               "moment_reductions", "var_in");
  auto ln_mean = at::empty({samples, 1}, mean_in.options());
  auto ln_var = at::empty_like(ln_mean);
  auto bn_mean = at::empty({channels}, mean_in.options());
  auto bn_m2 = at::empty_like(bn_mean);
  AT_DISPATCH_FLOATING_TYPES(mean_in.scalar_type(), "moment_reductions", [&] {
    const scalar_t* pm = mean_in.data_ptr<scalar_t>();
    const scalar_t* pv = var_in.data_ptr<scalar_t>();
    scalar_t* plm = ln_mean.data_ptr<scalar_t>();
    scalar_t* plv = ln_var.data_ptr<scalar_t>();
    // Pass 1: per sample the LN statistics (its row is in cache twice);
    // per channel the sums of mean_in and var_in.
    const auto cols = sum_over_samples(
        samples, 2 * channels, [&](int64_t n, double* col) {
          const scalar_t* m = pm + n * channels;
          const scalar_t* v = pv + n * channels;
          double row_mean = 0, row_var = 0;
          for (int64_t c = 0; c < channels; ++c) {
            row_mean += m[c];
            row_var += v[c];
            col[c] += m[c];
            col[channels + c] += v[c];
          }
          row_mean /= channels;
          double dev = 0;
          for (int64_t c = 0; c < channels; ++c)
            dev += (m[c] - row_mean) * (m[c] - row_mean);
          plm[n] = static_cast<scalar_t>(row_mean);
          plv[n] = static_cast<scalar_t>((row_var + dev) / channels);
        });
    std::vector<double> centre(channels, 0.0);
    if (samples > 0)
      for (int64_t c = 0; c < channels; ++c) centre[c] = cols[c] / samples;
    // Pass 2: squared deviations of mean_in about the channel means.
    const auto devs = sum_over_samples(
        samples, channels, [&](int64_t n, double* col) {
          const scalar_t* m = pm + n * channels;
          for (int64_t c = 0; c < channels; ++c) {
            const double d = m[c] - centre[c];
            col[c] += d * d;
          }
        });
    scalar_t* pbm = bn_mean.data_ptr<scalar_t>();
    scalar_t* pb2 = bn_m2.data_ptr<scalar_t>();
    for (int64_t c = 0; c < channels; ++c) {
      pbm[c] = static_cast<scalar_t>(centre[c]);
      pb2[c] = static_cast<scalar_t>(cols[channels + c] + devs[c]);
    }
  });
  return {ln_mean, ln_var, bn_mean, bn_m2};
}

// Mixes the statistics and normalises: see normalize_kernel.
std::vector<at::Tensor> normalize(
    const at::Tensor& x, const at::Tensor& mean_in, const at::Tensor& var_in,
    double wm_in, double wv_in, const at::Tensor& mu_n,
    const at::Tensor& var_n, const at::Tensor& mu_c, const at::Tensor& var_c,
    const at::Tensor& weight, const at::Tensor& bias, double eps) {
  check_rows(x, "normalize");
  const int64_t samples = x.size(0), channels = x.size(1),
                length = x.size(2), rows = samples * channels;
  const auto dtype = x.scalar_type();
  check_vector(mean_in, rows, dtype, "normalize", "mean_in");
  check_vector(var_in, rows, dtype, "normalize", "var_in");
  check_vector(mu_n, samples, dtype, "normalize", "mu_n");
  check_vector(var_n, samples, dtype, "normalize", "var_n");
  check_vector(mu_c, channels, dtype, "normalize", "mu_c");
  check_vector(var_c, channels, dtype, "normalize", "var_c");
  check_vector(weight, channels, dtype, "normalize", "weight");
  check_vector(bias, channels, dtype, "normalize", "bias");
  auto y = at::empty_like(x);
  auto mu = at::empty({samples, channels}, x.options());
  auto rstd = at::empty_like(mu);
  AT_DISPATCH_FLOATING_TYPES(dtype, "normalize", [&] {
    NormalizeArgs<scalar_t> args{
        x.data_ptr<scalar_t>(),      mean_in.data_ptr<scalar_t>(),
        var_in.data_ptr<scalar_t>(), mu_n.data_ptr<scalar_t>(),
        var_n.data_ptr<scalar_t>(),  mu_c.data_ptr<scalar_t>(),
        var_c.data_ptr<scalar_t>(),  weight.data_ptr<scalar_t>(),
        bias.data_ptr<scalar_t>(),   static_cast<scalar_t>(wm_in),
        static_cast<scalar_t>(wv_in), static_cast<scalar_t>(eps),
        y.data_ptr<scalar_t>(),      mu.data_ptr<scalar_t>(),
        rstd.data_ptr<scalar_t>(),   channels,
        length};
    run_rows(args, rows, length);
  });
  return {y, mu, rstd};
}

// Per-row sum of g and of g * (x - mean_in).
std::vector<at::Tensor> row_grad_sums(const at::Tensor& g, const at::Tensor& x,
                                      const at::Tensor& mean_in) {
  check_rows(x, "row_grad_sums");
  check_rows(g, "row_grad_sums");
  TORCH_CHECK(g.sizes() == x.sizes() && g.scalar_type() == x.scalar_type(),
              "row_grad_sums: the gradient does not match the input");
  const int64_t rows = x.size(0) * x.size(1), length = x.size(2);
  check_vector(mean_in, rows, x.scalar_type(), "row_grad_sums", "mean_in");
  auto sum_g = at::empty({x.size(0), x.size(1)}, x.options());
  auto sum_gxc = at::empty_like(sum_g);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_grad_sums", [&] {
    GradSumsArgs<scalar_t> args{
        g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
        mean_in.data_ptr<scalar_t>(), sum_g.data_ptr<scalar_t>(),
        sum_gxc.data_ptr<scalar_t>(), length};
    run_rows(args, rows, length);
  });
  return {sum_g, sum_gxc};
}

// From the row sums of the output gradient (sum_gxc = sum g * (x - mean_in)):
// the gradients of weight and bias, and the sums over c (per n) and over n
// (per c) of the gradients of the mixed mean and variance, d_mu = -scale *
// sum_g and d_var = -scale * rstd^2 / 2 * sum g * (x - mu), plus three dot
// products for the ratio gradients: d_mu with the LN and the BN mean, each
// less the row's IN mean (a shift common to all terms, which the softmax
// gradient ignores, and which keeps large offsets from cancelling), and
// d_var with the IN variance.
std::vector<at::Tensor> grad_reductions(
    const at::Tensor& sum_g, const at::Tensor& sum_gxc, const at::Tensor& mu,
    const at::Tensor& rstd, const at::Tensor& weight,
    const at::Tensor& mean_in, const at::Tensor& var_in,
    const at::Tensor& mean_ln, const at::Tensor& mean_c) {
  TORCH_CHECK(sum_g.dim() == 2, "grad_reductions: expected (N, C)");
  const int64_t samples = sum_g.size(0), channels = sum_g.size(1),
                rows = samples * channels;
  const auto dtype = sum_g.scalar_type();
  for (const auto* t : {&sum_g, &sum_gxc, &mu, &rstd, &mean_in, &var_in})
    check_vector(*t, rows, dtype, "grad_reductions", "an (N, C) statistic");
  check_vector(weight, channels, dtype, "grad_reductions", "weight");
  check_vector(mean_ln, samples, dtype, "grad_reductions", "mean_ln");
  check_vector(mean_c, channels, dtype, "grad_reductions", "mean_c");
  auto opts = sum_g.options();
  auto d_mu_n = at::empty({samples, 1}, opts);
  auto d_var_n = at::empty_like(d_mu_n);
  std::vector<at::Tensor> per_c;
  for (int i = 0; i < 4; ++i) per_c.push_back(at::empty({channels}, opts));
  auto dots = at::empty({3}, opts);
  AT_DISPATCH_FLOATING_TYPES(dtype, "grad_reductions", [&] {
    const scalar_t* s1 = sum_g.data_ptr<scalar_t>();
    const scalar_t* s2 = sum_gxc.data_ptr<scalar_t>();
    const scalar_t* pmu = mu.data_ptr<scalar_t>();
    const scalar_t* pr = rstd.data_ptr<scalar_t>();
    const scalar_t* pw = weight.data_ptr<scalar_t>();
    const scalar_t* pmi = mean_in.data_ptr<scalar_t>();
    const scalar_t* pvi = var_in.data_ptr<scalar_t>();
    const scalar_t* pml = mean_ln.data_ptr<scalar_t>();
    const scalar_t* pmc = mean_c.data_ptr<scalar_t>();
    scalar_t* pdmn = d_mu_n.data_ptr<scalar_t>();
    scalar_t* pdvn = d_var_n.data_ptr<scalar_t>();
    // Accumulated over n: grad_weight, grad_bias, d_mu_c and d_var_c per
    // channel, then the three dot products.
    const auto cols = sum_over_samples(
        samples, 4 * channels + 3, [&](int64_t n, double* acc) {
          double row_mu = 0, row_var = 0, dot_ln = 0, dot_bn = 0, dot_var = 0;
          for (int64_t c = 0; c < channels; ++c) {
            const int64_t r = n * channels + c;
            const double centred =
                s2[r] - (double(pmu[r]) - double(pmi[r])) * s1[r];
            const double scale = double(pw[c]) * pr[r];
            const double d_mu = -scale * s1[r];
            const double d_var = -0.5 * scale * pr[r] * pr[r] * centred;
            acc[c] += centred * pr[r];
            acc[channels + c] += s1[r];
            acc[2 * channels + c] += d_mu;
            acc[3 * channels + c] += d_var;
            row_mu += d_mu;
            row_var += d_var;
            dot_ln += d_mu * (double(pml[n]) - double(pmi[r]));
            dot_bn += d_mu * (double(pmc[c]) - double(pmi[r]));
            dot_var += d_var * pvi[r];
          }
          pdmn[n] = static_cast<scalar_t>(row_mu);
          pdvn[n] = static_cast<scalar_t>(row_var);
          acc[4 * channels] += dot_ln;
          acc[4 * channels + 1] += dot_bn;
          acc[4 * channels + 2] += dot_var;
        });
    for (int i = 0; i < 4; ++i) {
      scalar_t* out = per_c[i].data_ptr<scalar_t>();
      for (int64_t c = 0; c < channels; ++c)
        out[c] = static_cast<scalar_t>(cols[i * channels + c]);
    }
    scalar_t* pd = dots.data_ptr<scalar_t>();
    for (int i = 0; i < 3; ++i)
      pd[i] = static_cast<scalar_t>(cols[4 * channels + i]);
  });
  // grad_weight, grad_bias, d_mu_n, d_var_n, d_mu_c, d_var_c, the dots
  return {per_c[0], per_c[1], d_mu_n, d_var_n, per_c[2], per_c[3], dots};
}

// Input gradient: see input_grad_kernel. dvar_* and dmean_* are the
// gradients reaching each row's IN variance and mean through the LN (per n)
// and BN (per c) statistics, before the deviation terms 2 * (mean_in -
// center) * dvar that input_grad_kernel adds.
at::Tensor input_grad(const at::Tensor& g, const at::Tensor& x,
                      const at::Tensor& sum_g, const at::Tensor& sum_gxc,
                      const at::Tensor& mu, const at::Tensor& rstd,
                      const at::Tensor& weight, const at::Tensor& mean_in,
                      double wm_in, double wv_in, const at::Tensor& dvar_n,
                      const at::Tensor& dmean_n, const at::Tensor& center_n,
                      const at::Tensor& dvar_c, const at::Tensor& dmean_c,
                      const at::Tensor& center_c, int64_t correction) {
  check_rows(x, "input_grad");
  check_rows(g, "input_grad");
  TORCH_CHECK(g.sizes() == x.sizes() && g.scalar_type() == x.scalar_type(),
              "input_grad: the gradient does not match the input");
  const int64_t samples = x.size(0), channels = x.size(1),
                length = x.size(2), rows = samples * channels;
  const auto dtype = x.scalar_type();
  for (const auto* t : {&sum_g, &sum_gxc, &mu, &rstd, &mean_in})
    check_vector(*t, rows, dtype, "input_grad", "an (N, C) statistic");
  check_vector(weight, channels, dtype, "input_grad", "weight");
  check_vector(dvar_n, samples, dtype, "input_grad", "dvar_n");
  check_vector(dmean_n, samples, dtype, "input_grad", "dmean_n");
  check_vector(center_n, samples, dtype, "input_grad", "center_n");
  check_vector(dvar_c, channels, dtype, "input_grad", "dvar_c");
  check_vector(dmean_c, channels, dtype, "input_grad", "dmean_c");
  check_vector(center_c, channels, dtype, "input_grad", "center_c");
  auto dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(dtype, "input_grad", [&] {
    InputGradArgs<scalar_t> args{
        g.data_ptr<scalar_t>(),        x.data_ptr<scalar_t>(),
        sum_g.data_ptr<scalar_t>(),    sum_gxc.data_ptr<scalar_t>(),
        mu.data_ptr<scalar_t>(),       rstd.data_ptr<scalar_t>(),
        weight.data_ptr<scalar_t>(),   mean_in.data_ptr<scalar_t>(),
        dvar_n.data_ptr<scalar_t>(),   dmean_n.data_ptr<scalar_t>(),
        center_n.data_ptr<scalar_t>(), dvar_c.data_ptr<scalar_t>(),
        dmean_c.data_ptr<scalar_t>(),  center_c.data_ptr<scalar_t>(),
        static_cast<scalar_t>(wm_in),  static_cast<scalar_t>(wv_in),
        static_cast<scalar_t>(2.0 / std::max<int64_t>(length - correction, 1)),
        dx.data_ptr<scalar_t>(),       channels,
        length};
    run_rows(args, rows, length);
  });
  return dx;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "SN kernels (CPU)";
  m.def("row_moments", &row_moments, "per-row mean and variance");
  m.def("moment_reductions", &moment_reductions,
        "LN and BN statistics from the IN moments");
  m.def("normalize", &normalize, "mix the statistics and normalise");
  m.def("row_grad_sums", &row_grad_sums,
        "per-row sums of g and g * (x - mean_in)");
  m.def("grad_reductions", &grad_reductions,
        "affine gradients and sums of the statistics' gradients");
  m.def("input_grad", &input_grad, "the input gradient");
}
