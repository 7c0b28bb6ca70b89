// Canonical-order attention for the torch backend's exact mode (see specdec_torch/attention_kernel.py).
//
// Every query's keys are one sequence in position order: the slots [lo, hi) of its row's cache
// slot, then up to E further slots (its tree path). Its scores, softmax and weighted sum of values
// are computed in an order fixed by that sequence and the head size alone, so a query's result is
// a function of its own query vector and keys, whatever shares the call: other queries, other rows,
// the size of the cache, the number of threads (each query is computed by one thread).
//
// Vectors are GCC/Clang vector extensions of 16 floats (the compiler lowers them to the machine's
// SIMD width); head sizes that are not a multiple of 16 take the scalar path.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kLanes = 16;
constexpr int64_t kBlock = 8;  // queries of one (row, key/value head) computed together
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef uint32_t vu __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef uint16_t vh __attribute__((vector_size(kLanes * sizeof(uint16_t))));

inline float scalar(const float* p) { return *p; }
inline float scalar(const at::BFloat16* p) {
  uint32_t bits = static_cast<uint32_t>(p->x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline float scalar(const at::Half* p) { return static_cast<float>(*p); }

inline vf vload(const float* p) {
  vf out;
  std::memcpy(&out, p, sizeof(out));
  return out;
}
inline vf vload(const at::BFloat16* p) {
  vh half;
  std::memcpy(&half, p, sizeof(half));
  vu bits = __builtin_convertvector(half, vu) << 16;
  vf out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline vf vload(const at::Half* p) {
  vf out;
  for (int l = 0; l < kLanes; ++l) out[l] = static_cast<float>(p[l]);
  return out;
}

inline float hsum(vf x) {  // a fixed pairwise order
  float a[kLanes];
  std::memcpy(a, &x, sizeof(a));
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) a[l] += a[l + width];
  }
  return a[0];
}

#if defined(__clang__)
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, vi{__VA_ARGS__})
#endif

// Sums of 16 vectors, one per lane: out[l] = the sum of x[l]'s lanes, by the same tree of
// additions (lane m with m + 8, then + 4, + 2, + 1) for every l.
inline vf transpose_sum(vf* x) {
  vf w[8], y[4], z[2];
  for (int i = 0; i < 8; ++i) {
    w[i] = SHUFFLE(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SHUFFLE(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; ++i) {
    y[i] = SHUFFLE(w[2 * i], w[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           SHUFFLE(w[2 * i], w[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
  for (int i = 0; i < 2; ++i) {
    z[i] = SHUFFLE(y[2 * i], y[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           SHUFFLE(y[2 * i], y[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  }
  return SHUFFLE(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         SHUFFLE(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// exp(x) for x <= 0 (scores minus their maximum), lane by lane: Cephes' single-precision
// polynomial; every element takes the same operations.
inline vf vexp(vf x) {
  x = x < -87.0f ? vf{} - 87.0f : x;
  // n = round(x * log2 e): truncation toward zero of x * log2 e - 0.5 (<= 0) is its ceiling,
  // so x * log2 e - n lies in (-0.5, 0.5]
  const vi n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);
  const vf nf = __builtin_convertvector(n, vf);
  vf r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  vf p = vf{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  vi e = (n + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

struct Args {
  int64_t batch, heads, n, dim, kv_heads, group, most;
  const int64_t *slot_of, *lo, *hi, *extra, *extra_count;
  int64_t ks0, ks1, ks2, vs0, vs1, vs2;
  float scale;
};

inline int64_t round_up(int64_t x) { return ((x + kLanes - 1) / kLanes) * kLanes; }

// One (row, key/value head, block of up to kBlock queries). kChunks: the head size in vectors of 16
// (4 or 8, the fast path), or 0 for any head size (scalar loops, the same orders of summation).
template <typename T, int kChunks>
void attend_block(const Args& a, const T* q, const T* k, const T* v, T* o, int64_t b, int64_t h, int64_t first,
                  int64_t last) {
  const int64_t dim = a.dim, group = a.group, rows = last - first;
  const T* kbase = k + a.slot_of[b] * a.ks0 + h * a.ks1;
  const T* vbase = v + a.slot_of[b] * a.vs0 + h * a.vs1;
  int64_t counts[kBlock], offsets[kBlock], widths[kBlock], total = 0;
  const int64_t lo0 = a.lo[b * a.n + first];
  int64_t shared = INT64_MAX;  // sequence positions [0, shared) are the same slots for every query
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = b * a.n + first + r;
    counts[r] = a.hi[row] - a.lo[row] + a.extra_count[row];
    widths[r] = round_up(counts[r]);
    offsets[r] = total;
    total += group * widths[r];
    shared = a.lo[row] == lo0 ? std::min(shared, a.hi[row] - lo0) : 0;
  }
  shared = (shared / kLanes) * kLanes;
  auto key_slot = [&](int64_t r, int64_t j) -> int64_t {
    const int64_t row = b * a.n + first + r, ranged = a.hi[row] - a.lo[row];
    return j < ranged ? a.lo[row] + j : a.extra[row * a.most + (j - ranged)];
  };
  std::vector<float> scores(total, 0.0f), qf(rows * group * dim), kf(kLanes * dim), vf_buf(shared * dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const T* src = q + ((b * a.heads + h * group + g) * a.n + first + r) * dim;
      for (int64_t d = 0; d < dim; ++d) qf[(r * group + g) * dim + d] = scalar(src + d);
    }
  }
  // 1. scores, 16 positions of a query's sequence at a time (keys converted once per group of
  // positions the block shares); lane l of a group holds position j + l
  auto convert_keys = [&](int64_t r, int64_t j) {
    for (int64_t l = 0; l < kLanes; ++l) {
      float* dst = &kf[l * dim];
      if (j + l >= counts[r]) {
        std::fill(dst, dst + dim, 0.0f);
      } else {
        const T* key = kbase + key_slot(r, j + l) * a.ks2;
        for (int64_t d = 0; d < dim; ++d) dst[d] = scalar(key + d);
      }
    }
  };
  auto score_group = [&](int64_t r, int64_t j) {
    for (int64_t g = 0; g < group; ++g) {
      const float* qrow = &qf[(r * group + g) * dim];
      float* dst = &scores[offsets[r] + g * widths[r] + j];
      if (kChunks > 0) {
        vf lanes[kLanes] = {};
        for (int c = 0; c < kChunks; ++c) {
          const vf qc = vload(qrow + c * kLanes);
          for (int l = 0; l < kLanes; ++l) lanes[l] += qc * vload(&kf[l * dim + c * kLanes]);
        }
        const vf out = transpose_sum(lanes) * a.scale;
        std::memcpy(dst, &out, sizeof(out));
      } else {
        for (int l = 0; l < kLanes; ++l) {
          float lanes[kLanes] = {0.0f};
          for (int64_t d = 0; d < dim; ++d) lanes[d % kLanes] += qrow[d] * kf[l * dim + d];
          float sum = 0.0f;
          for (int m = 0; m < kLanes; ++m) sum += lanes[m];
          dst[l] = sum * a.scale;
        }
      }
    }
  };
  for (int64_t j = 0; j < shared; j += kLanes) {
    convert_keys(0, j);
    for (int64_t r = 0; r < rows; ++r) score_group(r, j);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = shared; j < counts[r]; j += kLanes) {
      convert_keys(r, j);
      score_group(r, j);
    }
  }
  // 2. softmax weights (unnormalised) and their sums, by vectors of 16 positions in sequence order
  std::vector<float> totals(rows * group);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      float* s = &scores[offsets[r] + g * widths[r]];
      vf tops = vf{} - INFINITY;  // the maximum is exact in any order
      int64_t j0 = 0;
      for (; j0 + kLanes <= counts[r]; j0 += kLanes) {
        const vf x = vload(s + j0);
        tops = x > tops ? x : tops;
      }
      float top = -INFINITY;
      for (int l = 0; l < kLanes; ++l) top = tops[l] > top ? tops[l] : top;
      for (; j0 < counts[r]; ++j0) top = s[j0] > top ? s[j0] : top;
      vf sums = {};
      for (int64_t j = 0; j < widths[r]; j += kLanes) {
        vf e = vexp(vload(s + j) - top);
        for (int l = 0; l < kLanes; ++l) e[l] = j + l < counts[r] ? e[l] : 0.0f;
        std::memcpy(s + j, &e, sizeof(e));
        sums += e;
      }
      totals[r * group + g] = hsum(sums);
    }
  }
  // 3. weighted values, in sequence order: per query head, the shared positions (values converted
  // once for the block), then the query's own
  for (int64_t j = 0; j < shared; ++j) {
    const T* value = vbase + (lo0 + j) * a.vs2;
    for (int64_t d = 0; d < dim; ++d) vf_buf[j * dim + d] = scalar(value + d);
  }
  std::vector<float> vrow(dim), acc(dim);
  auto finish = [&](int64_t index, const float* x) {  // index = r * group + g
    const int64_t r = index / group, g = index % group;
    T* dst = o + ((b * a.n + first + r) * a.heads + h * group + g) * dim;
    const float inverse = 1.0f / totals[index];
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(x[d] * inverse);
  };
  auto own_value = [&](int64_t r, int64_t j) -> const float* {
    const T* src = vbase + key_slot(r, j) * a.vs2;
    for (int64_t d = 0; d < dim; ++d) vrow[d] = scalar(src + d);
    return vrow.data();
  };
  const int64_t heads_here = rows * group;
  if (kChunks > 0) {
    constexpr int kTogether = 4;  // query heads accumulated side by side (independent chains)
    for (int64_t first_head = 0; first_head < heads_here; first_head += kTogether) {
      const int together = static_cast<int>(std::min<int64_t>(kTogether, heads_here - first_head));
      vf sum[kTogether][kChunks > 0 ? kChunks : 1] = {};
      const float* w[kTogether];
      for (int t = 0; t < together; ++t) {
        const int64_t r = (first_head + t) / group, g = (first_head + t) % group;
        w[t] = &scores[offsets[r] + g * widths[r]];
      }
      for (int64_t j = 0; j < shared; ++j) {
        const float* value = &vf_buf[j * dim];
        vf vc[kChunks > 0 ? kChunks : 1];
        for (int c = 0; c < kChunks; ++c) vc[c] = vload(value + c * kLanes);
        for (int t = 0; t < together; ++t) {
          for (int c = 0; c < kChunks; ++c) sum[t][c] += w[t][j] * vc[c];
        }
      }
      for (int t = 0; t < together; ++t) {
        const int64_t r = (first_head + t) / group;
        for (int64_t j = shared; j < counts[r]; ++j) {
          const float* value = own_value(r, j);
          for (int c = 0; c < kChunks; ++c) sum[t][c] += w[t][j] * vload(value + c * kLanes);
        }
        float out[kChunks > 0 ? kChunks * kLanes : 1];
        std::memcpy(out, sum[t], sizeof(out));
        finish(first_head + t, out);
      }
    }
  } else {
    for (int64_t index = 0; index < heads_here; ++index) {
      const int64_t r = index / group, g = index % group;
      const float* w = &scores[offsets[r] + g * widths[r]];
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < counts[r]; ++j) {
        const float* value = j < shared ? &vf_buf[j * dim] : own_value(r, j);
        for (int64_t d = 0; d < dim; ++d) acc[d] += w[j] * value[d];
      }
      finish(index, acc.data());
    }
  }
}

template <typename T>
void attend(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values, const Args& a,
            at::Tensor& out) {
  const T* q = query.data_ptr<T>();
  const T* k = keys.data_ptr<T>();
  const T* v = values.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int64_t blocks = (a.n + kBlock - 1) / kBlock, tasks = a.batch * a.kv_heads * blocks;
  int64_t keys_total = 0;
  for (int64_t r = 0; r < a.batch * a.n; ++r) keys_total += a.hi[r] - a.lo[r] + a.extra_count[r];
  const int64_t work = std::max<int64_t>(1, keys_total * a.group * a.dim / std::max<int64_t>(1, tasks / a.kv_heads));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 19) / work);
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (a.kv_heads * blocks), h = (task / blocks) % a.kv_heads, block = task % blocks;
      const int64_t first = block * kBlock, last = std::min(a.n, first + kBlock);
      if (a.dim == 64) {
        attend_block<T, 4>(a, q, k, v, o, b, h, first, last);
      } else if (a.dim == 128) {
        attend_block<T, 8>(a, q, k, v, o, b, h, first, last);
      } else {
        attend_block<T, 0>(a, q, k, v, o, b, h, first, last);
      }
    }
  });
}

}  // namespace

at::Tensor exact_attention(at::Tensor query, at::Tensor keys, at::Tensor values, at::Tensor row_slots,
                           at::Tensor lo, at::Tensor hi, at::Tensor extra, at::Tensor extra_count, double scale) {
  TORCH_CHECK(query.dim() == 4 && keys.dim() == 4 && values.dim() == 4, "query, keys, values must be 4-D");
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1, "keys and values need a contiguous last dim");
  TORCH_CHECK(query.scalar_type() == keys.scalar_type() && keys.scalar_type() == values.scalar_type(),
              "query, keys and values must share a dtype");
  TORCH_CHECK(query.device().is_cpu(), "exact_attention runs on the CPU");
  query = query.contiguous();
  row_slots = row_slots.to(at::kLong).contiguous();
  lo = lo.to(at::kLong).contiguous();
  hi = hi.to(at::kLong).contiguous();
  extra = extra.to(at::kLong).contiguous();
  extra_count = extra_count.to(at::kLong).contiguous();
  Args a;
  a.batch = query.size(0);
  a.heads = query.size(1);
  a.n = query.size(2);
  a.dim = query.size(3);
  a.kv_heads = keys.size(1);
  a.group = a.heads / a.kv_heads;
  a.most = extra.size(2);
  a.slot_of = row_slots.data_ptr<int64_t>();
  a.lo = lo.data_ptr<int64_t>();
  a.hi = hi.data_ptr<int64_t>();
  a.extra = extra.data_ptr<int64_t>();
  a.extra_count = extra_count.data_ptr<int64_t>();
  a.ks0 = keys.stride(0);
  a.ks1 = keys.stride(1);
  a.ks2 = keys.stride(2);
  a.vs0 = values.stride(0);
  a.vs1 = values.stride(1);
  a.vs2 = values.stride(2);
  a.scale = static_cast<float>(scale);
  auto out = at::empty({a.batch, a.n, a.heads * a.dim}, query.options());
  switch (query.scalar_type()) {
    case at::kBFloat16: attend<at::BFloat16>(query, keys, values, a, out); break;
    case at::kHalf: attend<at::Half>(query, keys, values, a, out); break;
    case at::kFloat: attend<float>(query, keys, values, a, out); break;
    default: TORCH_CHECK(false, "exact_attention takes bfloat16, float16 or float32");
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("exact_attention", &exact_attention); }
