//! `HETGNN_PROFILE=<stem>`: a sampling profile of the host's threads while
//! `hetgnn train` runs (builds with `--features profile`, as
//! `scripts/gpu-pack.sh` makes them): `<stem>.svg`, a flame graph, and
//! `<stem>.txt`, each thread group's busiest functions. On a GPU machine
//! with no profiler of its own, this shows where a step's host time goes.

/// A running profile, written out when dropped; nothing when not asked for.
pub struct HostProfile {
    #[cfg(feature = "profile")]
    run: Option<(pprof::ProfilerGuard<'static>, std::path::PathBuf)>,
    /// The wall-time sampler's stop flag and thread.
    #[cfg(feature = "profile")]
    wall: Option<(
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<()>,
    )>,
}

impl HostProfile {
    /// Starts sampling when `HETGNN_PROFILE` names an output stem.
    pub fn start() -> HostProfile {
        let stem = std::env::var_os("HETGNN_PROFILE").filter(|s| !s.is_empty());
        #[cfg(feature = "profile")]
        {
            let wall =
                stem.is_some() && std::env::var("HETGNN_PROFILE_WALL").is_ok_and(|v| v == "1");
            // 250 Hz: enough samples over a minute's run, little overhead.
            // Names match by substring: "libc.so", not "libc" (libcuda). In
            // wall mode the timer all but stops (1 Hz) and nothing is left
            // out: a blocked thread's newest frame is in libc or the driver.
            let builder = match wall {
                true => pprof::ProfilerGuardBuilder::default().frequency(1),
                false => pprof::ProfilerGuardBuilder::default()
                    .frequency(250)
                    .blocklist(&["libc.so", "libgcc", "libpthread", "vdso"]),
            };
            let run = stem.and_then(|s| match builder.build() {
                Ok(g) => Some((g, std::path::PathBuf::from(s))),
                Err(e) => {
                    eprintln!("warning: HETGNN_PROFILE: the profiler did not start: {e}");
                    None
                }
            });
            let wall = (wall && run.is_some()).then(wall_sampler);
            HostProfile { run, wall }
        }
        #[cfg(not(feature = "profile"))]
        {
            if stem.is_some() {
                eprintln!("warning: HETGNN_PROFILE is set, but this build has no profiler (build with --features profile)");
            }
            HostProfile {}
        }
    }

    /// Stops sampling and writes the profile (when one runs).
    pub fn finish(self) {}
}

#[cfg(feature = "profile")]
impl Drop for HostProfile {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.wall.take() {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = thread.join();
        }
        let Some((guard, stem)) = self.run.take() else {
            return;
        };
        if let Err(e) = write(&guard, &stem) {
            eprintln!("warning: HETGNN_PROFILE: {e}");
        }
    }
}

/// Signals the calling thread 250 times a second, for the profiler's handler to record where it is.
#[cfg(feature = "profile")]
fn wall_sampler() -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // SAFETY: gettid and getpid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(4));
            // SAFETY: signals one thread of this process with SIGPROF, whose handler the profiler installed (with SA_RESTART).
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGPROF) };
        }
    });
    (stop, thread)
}

#[cfg(feature = "profile")]
fn write(guard: &pprof::ProfilerGuard<'static>, stem: &std::path::Path) -> anyhow::Result<()> {
    use std::collections::{BTreeMap, HashSet};
    use std::io::Write;
    let report = guard.report().build()?;
    report.flamegraph(std::fs::File::create(stem.with_extension("svg"))?)?;
    // Per thread (rayon's and the prefetchers' share one name), busiest first.
    type Counts = BTreeMap<String, i64>;
    let mut threads: BTreeMap<u64, (String, i64, Counts, Counts)> = BTreeMap::new();
    for (frames, &n) in &report.data {
        let t = threads
            .entry(frames.thread_id)
            .or_insert_with(|| (frames.thread_name.clone(), 0, Counts::new(), Counts::new()));
        let n = n as i64;
        t.1 += n;
        let names: Vec<String> = frames.frames.iter().flatten().map(|s| s.name()).collect();
        if let Some(leaf) = names.first() {
            *t.3.entry(leaf.clone()).or_default() += n;
        }
        // Inclusive: once per sample, however often a function recurs in its stack.
        for name in names.into_iter().collect::<HashSet<_>>() {
            *t.2.entry(name).or_default() += n;
        }
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(stem.with_extension("txt"))?);
    let mut order: Vec<_> = threads.into_iter().collect();
    order.sort_by_key(|(_, t)| -t.1);
    let all: i64 = order.iter().map(|(_, t)| t.1).sum();
    writeln!(out, "{all} samples at 250 Hz (of CPU time; with HETGNN_PROFILE_WALL=1, of the training thread's wall time) over {} threads", order.len())?;
    for (id, (name, total, inclusive, own)) in order.into_iter().take(12) {
        writeln!(out, "== thread {id} ({name:?}): {total} samples")?;
        for (what, counts, top) in [
            (
                "inclusive (frames in nearly every sample left out)",
                inclusive,
                70,
            ),
            ("self", own, 30),
        ] {
            let mut v: Vec<_> = counts
                .into_iter()
                .filter(|&(_, n)| what == "self" || n * 100 < total * 97)
                .collect();
            v.sort_by_key(|(_, n)| -n);
            writeln!(out, "  -- {what}")?;
            for (f, n) in v.into_iter().take(top) {
                writeln!(
                    out,
                    "  {:6} {:5.1}%  {}",
                    n,
                    100.0 * n as f64 / total.max(1) as f64,
                    f.chars().take(160).collect::<String>()
                )?;
            }
        }
    }
    Ok(())
}
