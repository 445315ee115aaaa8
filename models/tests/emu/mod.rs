//! Runs CUDA kernels on the CPU: a `.cu` file compiled as plain C++ with a
//! small shim standing in for CUDA's built-ins (`threadIdx`, the `__*_rn`
//! intrinsics, `__umul64hi`, ...), each (block, thread) pair of a launch run
//! one after the other.
//!
//! That gives exactly what the GPU computes for kernels that use no shared
//! memory, atomics or barriers (each thread's work depends only on its block
//! and thread index), bar the last bit of `exp`. Needs a C++ compiler
//! (`$CXX`, else `c++`); without one, [`Emu::build`] says so and returns `None`.

use std::path::Path;

const SHIM: &str = r#"
#include <cmath>
#include <cstring>
struct EmuDim3 { unsigned x, y, z; };
// Per thread: the tests run launches on several threads at once.
static thread_local EmuDim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __longlong_as_double(unsigned long long v) { double d; std::memcpy(&d, &v, sizeof d); return d; }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
struct float4 { float x, y, z, w; };
using std::exp;
using std::fmax;
extern "C" void emu_set(unsigned grid, unsigned block, unsigned bx, unsigned tx) {
    gridDim.x = grid; blockDim.x = block; blockIdx.x = bx; threadIdx.x = tx;
}
"#;

/// A `.cu` file's kernels compiled for the host, and the shim's index setter.
pub struct Emu {
    lib: libloading::Library,
    _dir: tempfile::TempDir,
}

impl Emu {
    /// Compiles `source` for the host; `None` (said on stderr) without a C++ compiler.
    pub fn build(source: &Path) -> Option<Emu> {
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("shim.h"), SHIM).unwrap();
        let lib = dir.path().join("libkernels.so");
        // No contraction into fused multiply-adds, as the kernels' `_rn` intrinsics promise.
        let out = std::process::Command::new(&cxx)
            .args([
                "-std=c++14",
                "-O1",
                "-ffp-contract=off",
                "-fno-fast-math",
                "-fPIC",
                "-shared",
                "-include",
            ])
            .arg(dir.path().join("shim.h"))
            .args(["-x", "c++"])
            .arg(source)
            .arg("-o")
            .arg(&lib)
            .output();
        match out {
            Err(e) => {
                eprintln!(
                    "skipped: no C++ compiler ({cxx}: {e}); the CUDA kernels were not emulated"
                );
                None
            }
            Ok(o) => {
                assert!(
                    o.status.success(),
                    "{} does not compile for the host:\n{}",
                    source.display(),
                    String::from_utf8_lossy(&o.stderr)
                );
                // SAFETY: a library we just built, with no initialisers beyond the shim's statics.
                let lib = unsafe { libloading::Library::new(&lib) }.unwrap();
                Some(Emu { lib, _dir: dir })
            }
        }
    }

    /// The kernel `name`, typed `F` (which must match its C signature).
    pub fn kernel<F: Copy>(&self, name: &str) -> F {
        // SAFETY: callers give the signature the kernel declares in its file.
        unsafe {
            *self
                .lib
                .get::<F>(name.as_bytes())
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    }

    /// Runs `launch` once per (block, thread) of a `grid` × `block` launch.
    pub fn launch(&self, grid: u32, block: u32, launch: impl Fn()) {
        let set: unsafe extern "C" fn(u32, u32, u32, u32) = self.kernel("emu_set");
        for b in 0..grid {
            for t in 0..block {
                // SAFETY: sets four of this thread's statics.
                unsafe { set(grid, block, b, t) };
                launch();
            }
        }
    }
}
