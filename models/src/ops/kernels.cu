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

// out[j] = sum over rows r of g[r, j], rows in order from zero (the CPU's
// order): one thread per column, neighbouring threads reading neighbouring
// columns of a row.
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
