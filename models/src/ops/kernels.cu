// Native CUDA kernels of the custom ops in this folder, compiled with NVRTC
// at first use (see cuda.rs). Each kernel does the arithmetic of its CPU twin
// in the same order with round-to-nearest intrinsics (no fused multiply-add),
// so a GPU result has the CPU result's bits.

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// out[r, :] = sum over p in offsets[r]..offsets[r+1] of w * x[idx[p], :], in
// edge order, where w = weights[r] when per_row, else weights[idx[p]].
// One block walks a row (grid-stride over rows), its threads the columns.
template <typename T>
__device__ void gather_rows(const T* x, const u32* offsets, const u32* idx, const double* weights, u32 per_row,
                            T* out, u32 rows, u32 h) {
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u32 a = offsets[r], b = offsets[r + 1];
        for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
            T acc = 0;
            for (u32 p = a; p < b; ++p) {
                const u32 s = idx[p];
                const T w = (T)weights[per_row ? r : s];
                acc = add_rn(acc, mul_rn(w, x[(size_t)s * h + j]));
            }
            out[(size_t)r * h + j] = acc;
        }
    }
}

extern "C" __global__ void gather_rows_f32(const float* x, const u32* offsets, const u32* idx, const double* weights,
                                           u32 per_row, float* out, u32 rows, u32 h) {
    gather_rows<float>(x, offsets, idx, weights, per_row, out, rows, h);
}

extern "C" __global__ void gather_rows_f64(const double* x, const u32* offsets, const u32* idx, const double* weights,
                                           u32 per_row, double* out, u32 rows, u32 h) {
    gather_rows<double>(x, offsets, idx, weights, per_row, out, rows, h);
}

// graphs::rng: SplitMix64's finaliser and the counter stream's draw.
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Mask value of column j of a row whose counter stream is keyed by `key`:
// draw j (counter j + 1) as a uniform double, rounded to float, against p.
__device__ __forceinline__ float mask_value(u64 key, u32 j, float p, float scale) {
    const u64 bits = mix64(key + (u64)(j + 1) * 0x9E3779B97F4A7C15ull);
    const double u = (double)(bits >> 11) * (1.0 / 9007199254740992.0);
    return (float)u < p ? 0.0f : scale;
}

template <typename T>
__device__ void dropout_fwd(const T* x, const u64* row_keys, float p, float scale, u32 relu, T* out, u32 rows, u32 cols) {
    const size_t n = (size_t)rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const u32 r = (u32)(i / cols), j = (u32)(i % cols);
        T v = x[i];
        if (relu && !(v > (T)0)) v = (T)0;
        out[i] = mul_rn(v, (T)mask_value(row_keys[r], j, p, scale));
    }
}

template <typename T>
__device__ void dropout_bwd(const T* g, const T* x, const u64* row_keys, float p, float scale, u32 relu, T* out, u32 rows,
                            u32 cols) {
    const size_t n = (size_t)rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const u32 r = (u32)(i / cols), j = (u32)(i % cols);
        const T v = mul_rn(g[i], (T)mask_value(row_keys[r], j, p, scale));
        out[i] = relu ? mul_rn(v, x[i] >= (T)0 ? (T)1 : (T)0) : v;
    }
}

extern "C" __global__ void dropout_fwd_f32(const float* x, const u64* keys, float p, float scale, u32 relu, float* out,
                                           u32 rows, u32 cols) {
    dropout_fwd<float>(x, keys, p, scale, relu, out, rows, cols);
}

extern "C" __global__ void dropout_fwd_f64(const double* x, const u64* keys, float p, float scale, u32 relu,
                                           double* out, u32 rows, u32 cols) {
    dropout_fwd<double>(x, keys, p, scale, relu, out, rows, cols);
}

extern "C" __global__ void dropout_bwd_f32(const float* g, const float* x, const u64* keys, float p, float scale,
                                           u32 relu, float* out, u32 rows, u32 cols) {
    dropout_bwd<float>(g, x, keys, p, scale, relu, out, rows, cols);
}

extern "C" __global__ void dropout_bwd_f64(const double* g, const double* x, const u64* keys, float p, float scale,
                                           u32 relu, double* out, u32 rows, u32 cols) {
    dropout_bwd<double>(g, x, keys, p, scale, relu, out, rows, cols);
}

// out = x + b, b broadcast over the rows of x: [rows, cols].
template <typename T>
__device__ void add_bias(const T* x, const T* b, T* out, u32 rows, u32 cols) {
    const size_t n = (size_t)rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = add_rn(x[i], b[i % cols]);
    }
}

extern "C" __global__ void add_bias_f32(const float* x, const float* b, float* out, u32 rows, u32 cols) {
    add_bias<float>(x, b, out, rows, cols);
}

extern "C" __global__ void add_bias_f64(const double* x, const double* b, double* out, u32 rows, u32 cols) {
    add_bias<double>(x, b, out, rows, cols);
}

// Column sums in two passes, bias.rs's order: column_partials sums each
// block of block_rows rows in order from zero (a thread per block and column,
// neighbouring threads on neighbouring columns), then column_sums adds the
// blocks' sums in order from zero.
template <typename T>
__device__ void column_partials(const T* g, T* out, u32 rows, u32 cols, u32 block_rows) {
    const size_t n = (size_t)((rows + block_rows - 1) / block_rows) * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t b = i / cols, j = i % cols;
        const size_t start = b * block_rows, end = start + block_rows < rows ? start + block_rows : rows;
        T acc = 0;
        for (size_t r = start; r < end; ++r) acc = add_rn(acc, g[r * cols + j]);
        out[i] = acc;
    }
}

extern "C" __global__ void column_partials_f32(const float* g, float* out, u32 rows, u32 cols, u32 block_rows) {
    column_partials<float>(g, out, rows, cols, block_rows);
}

extern "C" __global__ void column_partials_f64(const double* g, double* out, u32 rows, u32 cols, u32 block_rows) {
    column_partials<double>(g, out, rows, cols, block_rows);
}

// out[j] = sum over rows r of g[r, j], rows in order from zero: one thread per
// column, neighbouring threads reading neighbouring columns of a row.
template <typename T>
__device__ void column_sums(const T* g, T* out, u32 rows, u32 cols) {
    const u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    T acc = 0;
    for (u32 r = 0; r < rows; ++r) acc = add_rn(acc, g[(size_t)r * cols + j]);
    out[j] = acc;
}

extern "C" __global__ void column_sums_f32(const float* g, float* out, u32 rows, u32 cols) {
    column_sums<float>(g, out, rows, cols);
}

extern "C" __global__ void column_sums_f64(const double* g, double* out, u32 rows, u32 cols) {
    column_sums<double>(g, out, rows, cols);
}

// Attention over a CSR (attention.rs), in double whatever T is. Scores are
// leaky(el[u, k] + er[v, k]); each destination's softmax takes the max, then
// the sum of exp(s - max), then exp(s - max) / sum, in edge order, as the
// CPU does. (exp may differ from the CPU's in the last bit.)
__device__ __forceinline__ double leaky(double x, double slope) { return x > 0.0 ? x : __dmul_rn(slope, x); }

// Max and normaliser of destination v's scores for head k.
template <typename T>
__device__ void softmax_stats(const T* el, double erv, const u32* sources, u32 a, u32 b, u32 heads, u32 k, double slope,
                              double* m_out, double* z_out) {
    double m = __longlong_as_double(0xfff0000000000000ull);  // -infinity
    for (u32 p = a; p < b; ++p) m = fmax(m, leaky(__dadd_rn((double)el[(size_t)sources[p] * heads + k], erv), slope));
    double z = 0.0;
    for (u32 p = a; p < b; ++p) {
        const double s = leaky(__dadd_rn((double)el[(size_t)sources[p] * heads + k], erv), slope);
        z = __dadd_rn(z, exp(__dsub_rn(s, m)));
    }
    *m_out = m;
    *z_out = z;
}

// out[v, k, :] = sum over edges of alpha · values[u, k, :]: a block per
// destination, its threads over (head, column).
template <typename T>
__device__ void attention_fwd(const T* values, const T* el, const T* er, const u32* offsets, const u32* sources,
                              double slope, T* out, u32 n_dst, u32 heads, u32 width) {
    for (u32 v = blockIdx.x; v < n_dst; v += gridDim.x) {
        const u32 a = offsets[v], b = offsets[v + 1];
        for (u32 t = threadIdx.x; t < heads * width; t += blockDim.x) {
            const u32 k = t / width, j = t % width;
            const double erv = (double)er[(size_t)v * heads + k];
            double m, z;
            softmax_stats(el, erv, sources, a, b, heads, k, slope, &m, &z);
            double acc = 0.0;
            for (u32 p = a; p < b; ++p) {
                const u32 u = sources[p];
                const double s = leaky(__dadd_rn((double)el[(size_t)u * heads + k], erv), slope);
                const double alpha = __ddiv_rn(exp(__dsub_rn(s, m)), z);
                acc = __dadd_rn(acc, __dmul_rn(alpha, (double)values[((size_t)u * heads + k) * width + j]));
            }
            out[((size_t)v * heads + k) * width + j] = (T)acc;
        }
    }
}

// Backward, destination pass: a thread per (v, k) writes each edge's
// attention alpha_e[e, k] and score gradient dpre_e[e, k], and d(er)[v, k].
template <typename T>
__device__ void attention_bwd_dst(const T* values, const T* el, const T* er, const T* g, const u32* offsets,
                                  const u32* sources, double slope, double* alpha_e, double* dpre_e, T* der, u32 n_dst,
                                  u32 heads, u32 width) {
    const size_t n = (size_t)n_dst * heads;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const u32 v = (u32)(i / heads), k = (u32)(i % heads);
        const u32 a = offsets[v], b = offsets[v + 1];
        const double erv = (double)er[i];
        double m, z;
        softmax_stats(el, erv, sources, a, b, heads, k, slope, &m, &z);
        const T* gk = g + i * width;
        double dot = 0.0;
        for (u32 p = a; p < b; ++p) {
            const u32 u = sources[p];
            const double s = leaky(__dadd_rn((double)el[(size_t)u * heads + k], erv), slope);
            const double alpha = __ddiv_rn(exp(__dsub_rn(s, m)), z);
            const T* row = values + ((size_t)u * heads + k) * width;
            double da = 0.0;
            for (u32 j = 0; j < width; ++j) da = __dadd_rn(da, __dmul_rn((double)row[j], (double)gk[j]));
            alpha_e[(size_t)p * heads + k] = alpha;
            dpre_e[(size_t)p * heads + k] = da;
            dot = __dadd_rn(dot, __dmul_rn(alpha, da));
        }
        double d_er = 0.0;
        for (u32 p = a; p < b; ++p) {
            const size_t e = (size_t)p * heads + k;
            const double ds = __dmul_rn(alpha_e[e], __dsub_rn(dpre_e[e], dot));
            const double pre = __dadd_rn((double)el[(size_t)sources[p] * heads + k], erv);
            const double dp = pre > 0.0 ? ds : __dmul_rn(ds, slope);
            dpre_e[e] = dp;
            d_er = __dadd_rn(d_er, dp);
        }
        der[i] = (T)d_er;
    }
}

// Backward, source pass: a block per source u sums its out-edges in the
// transposed CSR's order: d(values)[u, k, :] and d(el)[u, k].
template <typename T>
__device__ void attention_bwd_src(const T* g, const double* alpha_e, const double* dpre_e, const u32* t_offsets,
                                  const u32* t_dsts, const u32* t_edges, T* dv, T* del, u32 n_src, u32 heads, u32 width) {
    for (u32 u = blockIdx.x; u < n_src; u += gridDim.x) {
        const u32 a = t_offsets[u], b = t_offsets[u + 1];
        for (u32 t = threadIdx.x; t < heads * width; t += blockDim.x) {
            const u32 k = t / width, j = t % width;
            double acc = 0.0;
            for (u32 q = a; q < b; ++q) {
                const double alpha = alpha_e[(size_t)t_edges[q] * heads + k];
                acc = __dadd_rn(acc, __dmul_rn(alpha, (double)g[((size_t)t_dsts[q] * heads + k) * width + j]));
            }
            dv[((size_t)u * heads + k) * width + j] = (T)acc;
        }
        for (u32 k = threadIdx.x; k < heads; k += blockDim.x) {
            double acc = 0.0;
            for (u32 q = a; q < b; ++q) acc = __dadd_rn(acc, dpre_e[(size_t)t_edges[q] * heads + k]);
            del[(size_t)u * heads + k] = (T)acc;
        }
    }
}

#define ATTENTION_KERNELS(T, S)                                                                                        \
    extern "C" __global__ void attention_fwd_##S(const T* values, const T* el, const T* er, const u32* offsets,        \
                                                 const u32* sources, double slope, T* out, u32 n_dst, u32 heads,       \
                                                 u32 width) {                                                          \
        attention_fwd<T>(values, el, er, offsets, sources, slope, out, n_dst, heads, width);                           \
    }                                                                                                                  \
    extern "C" __global__ void attention_bwd_dst_##S(const T* values, const T* el, const T* er, const T* g,            \
                                                     const u32* offsets, const u32* sources, double slope,             \
                                                     double* alpha_e, double* dpre_e, T* der, u32 n_dst, u32 heads,    \
                                                     u32 width) {                                                      \
        attention_bwd_dst<T>(values, el, er, g, offsets, sources, slope, alpha_e, dpre_e, der, n_dst, heads, width);   \
    }                                                                                                                  \
    extern "C" __global__ void attention_bwd_src_##S(const T* g, const double* alpha_e, const double* dpre_e,          \
                                                     const u32* t_offsets, const u32* t_dsts, const u32* t_edges,      \
                                                     T* dv, T* del, u32 n_src, u32 heads, u32 width) {                 \
        attention_bwd_src<T>(g, alpha_e, dpre_e, t_offsets, t_dsts, t_edges, dv, del, n_src, heads, width);            \
    }

ATTENTION_KERNELS(float, f32)
ATTENTION_KERNELS(double, f64)

// Log-sum-exp attention partials (lse_attention.rs), in double. Scores are
// e_u = q[v, h, :] · k[u, h, :]; weights exp(e_u - max), in edge order.
template <typename T>
__device__ double dot_rows(const T* a, const T* b, u32 n) {
    double acc = 0.0;
    for (u32 i = 0; i < n; ++i) acc = __dadd_rn(acc, __dmul_rn((double)a[i], (double)b[i]));
    return acc;
}

// Max score of destination v's edges for head h (-infinity without edges).
template <typename T>
__device__ double lse_max(const T* q, const T* k, const u32* sources, u32 a, u32 b, u32 v, u32 h, u32 heads, u32 dk) {
    double m = __longlong_as_double(0xfff0000000000000ull);  // -infinity
    const T* qv = q + ((size_t)v * heads + h) * dk;
    for (u32 p = a; p < b; ++p) m = fmax(m, dot_rows(qv, k + ((size_t)sources[p] * heads + h) * dk, dk));
    return m;
}

// Packed partial [n_dst, H, 2 + D]: a block per destination, its threads over (head, packed column).
template <typename T>
__device__ void lse_fwd(const T* q, const T* k, const T* values, const u32* offsets, const u32* sources, double empty_max,
                        T* out, u32 n_dst, u32 heads, u32 dk, u32 dv) {
    const u32 gw = 2 + dv;
    for (u32 v = blockIdx.x; v < n_dst; v += gridDim.x) {
        const u32 a = offsets[v], b = offsets[v + 1];
        for (u32 t = threadIdx.x; t < heads * gw; t += blockDim.x) {
            const u32 h = t / gw, c = t % gw;
            const double m = lse_max(q, k, sources, a, b, v, h, heads, dk);
            double acc = 0.0;
            if (c == 0) {
                acc = a == b ? empty_max : m;
            } else {
                const T* qv = q + ((size_t)v * heads + h) * dk;
                for (u32 p = a; p < b; ++p) {
                    const u32 u = sources[p];
                    const double w = exp(__dsub_rn(dot_rows(qv, k + ((size_t)u * heads + h) * dk, dk), m));
                    acc = __dadd_rn(acc, c == 1 ? w : __dmul_rn(w, (double)values[((size_t)u * heads + h) * dv + (c - 2)]));
                }
            }
            out[((size_t)v * heads + h) * gw + c] = (T)acc;
        }
    }
}

// Backward, destination pass: a thread per (v, h) writes each edge's score
// gradient de_e and weight w_e, and d(q)[v, h, :].
template <typename T>
__device__ void lse_bwd_dst(const T* q, const T* k, const T* values, const T* g, const u32* offsets, const u32* sources,
                            double* de_e, double* w_e, T* dq, u32 n_dst, u32 heads, u32 dk, u32 dv) {
    const u32 gw = 2 + dv;
    const size_t n = (size_t)n_dst * heads;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const u32 v = (u32)(i / heads), h = (u32)(i % heads);
        const u32 a = offsets[v], b = offsets[v + 1];
        const double m = lse_max(q, k, sources, a, b, v, h, heads, dk);
        const T* qv = q + i * dk;
        const double gs = (double)g[i * gw + 1];
        const T* gm = g + i * gw + 2;
        for (u32 p = a; p < b; ++p) {
            const u32 u = sources[p];
            const double w = exp(__dsub_rn(dot_rows(qv, k + ((size_t)u * heads + h) * dk, dk), m));
            const double dw = __dadd_rn(gs, dot_rows(gm, values + ((size_t)u * heads + h) * dv, dv));
            de_e[(size_t)p * heads + h] = __dmul_rn(w, dw);
            w_e[(size_t)p * heads + h] = w;
        }
        // Each column of d(q) sums the edges in order, as the CPU's row-at-a-time loop does.
        for (u32 x = 0; x < dk; ++x) {
            double acc = 0.0;
            for (u32 p = a; p < b; ++p) {
                acc = __dadd_rn(acc, __dmul_rn(de_e[(size_t)p * heads + h], (double)k[((size_t)sources[p] * heads + h) * dk + x]));
            }
            dq[i * dk + x] = (T)acc;
        }
    }
}

// Backward, source pass: a block per source u, its threads over (head, column of k then of values).
template <typename T>
__device__ void lse_bwd_src(const T* q, const T* g, const double* de_e, const double* w_e, const u32* t_offsets,
                            const u32* t_dsts, const u32* t_edges, T* dk_out, T* dv_out, u32 n_src, u32 heads, u32 dk,
                            u32 dv) {
    const u32 gw = 2 + dv, cols = dk + dv;
    for (u32 u = blockIdx.x; u < n_src; u += gridDim.x) {
        const u32 a = t_offsets[u], b = t_offsets[u + 1];
        for (u32 t = threadIdx.x; t < heads * cols; t += blockDim.x) {
            const u32 h = t / cols, c = t % cols;
            double acc = 0.0;
            for (u32 r = a; r < b; ++r) {
                const size_t v = t_dsts[r], e = (size_t)t_edges[r] * heads + h;
                acc = __dadd_rn(acc, c < dk ? __dmul_rn(de_e[e], (double)q[(v * heads + h) * dk + c])
                                            : __dmul_rn(w_e[e], (double)g[(v * heads + h) * gw + 2 + (c - dk)]));
            }
            if (c < dk) {
                dk_out[((size_t)u * heads + h) * dk + c] = (T)acc;
            } else {
                dv_out[((size_t)u * heads + h) * dv + (c - dk)] = (T)acc;
            }
        }
    }
}

#define LSE_KERNELS(T, S)                                                                                              \
    extern "C" __global__ void lse_fwd_##S(const T* q, const T* k, const T* values, const u32* offsets,                \
                                           const u32* sources, double empty_max, T* out, u32 n_dst, u32 heads, u32 dk, \
                                           u32 dv) {                                                                   \
        lse_fwd<T>(q, k, values, offsets, sources, empty_max, out, n_dst, heads, dk, dv);                             \
    }                                                                                                                  \
    extern "C" __global__ void lse_bwd_dst_##S(const T* q, const T* k, const T* values, const T* g,                    \
                                               const u32* offsets, const u32* sources, double* de_e, double* w_e,      \
                                               T* dq, u32 n_dst, u32 heads, u32 dk, u32 dv) {                          \
        lse_bwd_dst<T>(q, k, values, g, offsets, sources, de_e, w_e, dq, n_dst, heads, dk, dv);                        \
    }                                                                                                                  \
    extern "C" __global__ void lse_bwd_src_##S(const T* q, const T* g, const double* de_e, const double* w_e,          \
                                               const u32* t_offsets, const u32* t_dsts, const u32* t_edges,            \
                                               T* dk_out, T* dv_out, u32 n_src, u32 heads, u32 dk, u32 dv) {           \
        lse_bwd_src<T>(q, g, de_e, w_e, t_offsets, t_dsts, t_edges, dk_out, dv_out, n_src, heads, dk, dv);             \
    }

LSE_KERNELS(float, f32)
LSE_KERNELS(double, f64)

// Sparse Adam in place: row slots[r] of data, m and v takes gradient row r of
// g. The row's step count after this update is t = steps[slots[r]] + 1 and
// its bias corrections are bc[2t] = 1 - b1^t and bc[2t + 1] = 1 - b2^t, a
// table by step count (t is clamped to bc_len - 1 for safety; the host keeps
// the table longer than any count). The arithmetic is embedding.rs's adam_row
// in its order: m and v in f32, the step in f64. ob1 = 1 - b1 and ob2 = 1 - b2
// as f32. Slots are distinct, so no two blocks write one row. One block walks
// a row (grid-stride over rows), its threads the columns. The step counts are
// read here and bumped by bump_steps_u32 after it (no barrier needed).
extern "C" __global__ void sparse_adam_f32(float* data, float* m, float* v, const u32* steps, const u32* slots,
                                           const float* g, const double* bc, u32 bc_len, float b1, float ob1, float b2,
                                           float ob2, double lr, double eps, u32 rows, u32 cols) {
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u32 slot = slots[r];
        const size_t s = (size_t)slot * cols;
        const u32 t = steps[slot] + 1 < bc_len ? steps[slot] + 1 : bc_len - 1;
        const double bc1 = bc[2 * (size_t)t], bc2 = bc[2 * (size_t)t + 1];
        for (u32 j = threadIdx.x; j < cols; j += blockDim.x) {
            const float gj = g[(size_t)r * cols + j];
            const float mj = add_rn(mul_rn(b1, m[s + j]), mul_rn(ob1, gj));
            const float vj = add_rn(mul_rn(b2, v[s + j]), mul_rn(mul_rn(ob2, gj), gj));
            m[s + j] = mj;
            v[s + j] = vj;
            const double mhat = __ddiv_rn((double)mj, bc1);
            const double vhat = __ddiv_rn((double)vj, bc2);
            const double step = __ddiv_rn(mul_rn(lr, mhat), add_rn(sqrt(vhat), eps));
            data[s + j] = add_rn(data[s + j], -(float)step);
        }
    }
}

// Dense Adam in place on one f32 parameter of n elements: p, m and v take
// gradient g in one launch, with the arithmetic of the candle ops optim.rs
// runs elsewhere, in their order: each product with a scalar is candle's
// affine map x * a + 0 in f32 (the + 0 included: it turns -0 into +0), the
// scalars rounded to f32 by the host: ob1 = 1 - b1, ob2 = 1 - b2, ibc1 =
// 1 / (1 - b1^t), ibc2 = 1 / (1 - b2^t), eps, lr. A thread per element,
// grid-stride.
extern "C" __global__ void dense_adam_f32(float* p, float* m, float* v, const float* g, u32 n, float b1, float ob1,
                                          float b2, float ob2, float ibc1, float ibc2, float eps, float lr) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i];
        const float mi = __fadd_rn(__fadd_rn(__fmul_rn(m[i], b1), 0.0f), __fadd_rn(__fmul_rn(gi, ob1), 0.0f));
        const float vi =
            __fadd_rn(__fadd_rn(__fmul_rn(v[i], b2), 0.0f), __fadd_rn(__fmul_rn(__fmul_rn(gi, gi), ob2), 0.0f));
        m[i] = mi;
        v[i] = vi;
        const float mh = __fadd_rn(__fmul_rn(mi, ibc1), 0.0f);
        const float vh = __fadd_rn(__fmul_rn(vi, ibc2), 0.0f);
        const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vh), 1.0f), eps);
        const float u = __fadd_rn(__fmul_rn(__fdiv_rn(mh, den), lr), 0.0f);
        p[i] = __fsub_rn(p[i], u);
    }
}

// The step counts of the rows sparse_adam_f32 just updated, bumped (clamped
// as it clamps them). A thread per row, grid-stride.
extern "C" __global__ void bump_steps_u32(u32* steps, const u32* slots, u32 bc_len, u32 rows) {
    for (u32 r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
        const u32 slot = slots[r];
        steps[slot] = steps[slot] + 1 < bc_len ? steps[slot] + 1 : bc_len - 1;
    }
}

// out[r, :] = x[idx[r], :]: a warp per row (grid-stride over rows), its lanes
// over the columns, as 16-byte vectors when vec (cols a multiple of 4 and x
// 16-byte aligned), so a batch's rows move at the memory's pace.
extern "C" __global__ void take_rows_f32(const float* x, const u32* idx, float* out, u32 vec, u32 rows, u32 cols) {
    const u32 lane = threadIdx.x % 32;
    const u32 warps = gridDim.x * (blockDim.x / 32);
    for (u32 r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
        const size_t s = (size_t)idx[r] * cols, o = (size_t)r * cols;
        if (vec) {
            const float4* xs = (const float4*)(x + s);
            float4* os = (float4*)(out + o);
            for (u32 j = lane; j < cols / 4; j += 32) os[j] = xs[j];
        } else {
            for (u32 j = lane; j < cols; j += 32) out[o + j] = x[s + j];
        }
    }
}
