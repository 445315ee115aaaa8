// Neighbour sampling on the device: the picks of graphs::sampler (one
// relation's draws for a list of destinations, `Sampler::pick`), bit for bit.
// Every draw is a pure function of the layer's key and the destination, so a
// thread per destination draws exactly what the CPU sampler's loop draws.
//
// Two launches per relation and hop: `pick_counts` sizes each destination's
// picks, the host (or a scan) turns the counts into offsets, and
// `pick_neighbors` writes the picks (launched by sampling.rs). Checked on
// the CPU by models/tests/sampling_emulation.rs.

typedef unsigned int u32;
typedef unsigned long long u64;

// The largest fanout `pick_neighbors` draws (a thread's positions live in a
// local array); larger fanouts stay on the CPU sampler.
#define PICK_MAX_FANOUT 64

#define GOLDEN 0x9E3779B97F4A7C15ull

// graphs::rng::mix64: SplitMix64's finaliser.
__device__ __forceinline__ u64 pick_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// graphs::rng::key(&[a, b]).
__device__ __forceinline__ u64 pick_key(u64 a, u64 b) {
    u64 h = 0x6A09E667F3BCC909ull;
    h = pick_mix64(h ^ (a * GOLDEN)) + GOLDEN;
    h = pick_mix64(h ^ (b * GOLDEN)) + GOLDEN;
    return h;
}

// graphs::rng::CounterRng::below(n) on the stream of `key`, `*ctr` draws in:
// Lemire's multiply, with rejection below 2^64 mod n.
__device__ __forceinline__ u64 pick_below(u64 key, u64* ctr, u64 n) {
    *ctr += 1;
    u64 x = pick_mix64(key + *ctr * GOLDEN);
    u64 lo = x * n;
    if (lo < n) {
        const u64 threshold = (0ull - n) % n;
        while (lo < threshold) {
            *ctr += 1;
            x = pick_mix64(key + *ctr * GOLDEN);
            lo = x * n;
        }
    }
    return __umul64hi(x, n);
}

// counts[i] = min(in-degree of nodes[i], fanout); `offsets` is the
// relation's in-CSR (rows by destination id).
extern "C" __global__ void pick_counts(const u64* offsets, const u32* nodes, u32* counts, u32 n, u32 fanout) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const u32 v = nodes[i];
        const u64 d = offsets[v + 1] - offsets[v];
        counts[i] = d < fanout ? (u32)d : fanout;
    }
}

// picks[out[i]..out[i + 1]] = the picks of nodes[i] (out: pick_counts'
// counts, summed): every in-neighbour when there are at most `fanout`, else
// `fanout` of them drawn without replacement by Floyd's algorithm on the
// stream of key(base, node) (base: the relation's layer key), in CSR order.
// fanout <= PICK_MAX_FANOUT.
extern "C" __global__ void pick_neighbors(const u64* offsets, const u32* indices, const u32* nodes, const u32* out,
                                          u64 base, u32 n, u32 fanout, u32* picks) {
    if (fanout > PICK_MAX_FANOUT) return;  // refused by the host; nothing is written past a thread's array
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const u32 v = nodes[i];
        const u64 a = offsets[v], d = offsets[v + 1] - a;
        u32* o = picks + out[i];
        if (d <= fanout) {
            for (u64 k = 0; k < d; ++k) o[k] = indices[a + k];
            continue;
        }
        // Floyd: for j in d - fanout .. d, draw t in 0..=j; take t unless
        // taken already, then j (which nothing before could take).
        u32 chosen[PICK_MAX_FANOUT];
        const u64 key = pick_key(base, (u64)v);
        u64 ctr = 0;
        u32 m = 0;
        for (u64 j = d - fanout; j < d; ++j) {
            const u32 t = (u32)pick_below(key, &ctr, j + 1);
            bool taken = false;
            for (u32 q = 0; q < m; ++q) taken |= chosen[q] == t;
            chosen[m++] = taken ? (u32)j : t;
        }
        // In CSR order: an insertion sort of at most PICK_MAX_FANOUT positions.
        for (u32 p = 1; p < m; ++p) {
            const u32 x = chosen[p];
            u32 q = p;
            while (q > 0 && chosen[q - 1] > x) {
                chosen[q] = chosen[q - 1];
                --q;
            }
            chosen[q] = x;
        }
        for (u32 q = 0; q < m; ++q) o[q] = indices[a + chosen[q]];
    }
}
