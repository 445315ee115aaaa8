//! The machine's CPU use, from `/proc/stat`: for the report's `cpu_util`
//! and for the DAG sampling launcher's decisions.

/// The machine's CPU use between two readings of `/proc/stat` (where
/// there is none, the process's own CPU time over the cores).
pub struct CpuMeter {
    last: Option<(u64, u64)>,
    util: f64,
}

impl Default for CpuMeter {
    fn default() -> Self {
        CpuMeter {
            last: busy_total(),
            util: 0.0,
        }
    }
}

impl CpuMeter {
    /// Percent busy since the last reading that moved (readings closer
    /// together than the kernel's tick keep the last figure).
    pub fn read(&mut self) -> f64 {
        let now = busy_total();
        if let (Some((b0, t0)), Some((b1, t1))) = (self.last, now) {
            if t1 > t0 {
                self.util = 100.0 * (b1.saturating_sub(b0)) as f64 / (t1 - t0) as f64;
                self.last = now;
            }
        }
        self.util
    }
}

/// Busy and total time of every core, in the kernel's ticks.
fn busy_total() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let total: u64 = v.iter().take(8).sum();
    Some((total - idle, total))
}

/// The machine's CPU use over a span: a reading at its start, one at its end.
pub struct CpuSpan {
    start: Option<(u64, u64)>,
}

impl CpuSpan {
    /// Starts the span now.
    pub fn start() -> CpuSpan {
        CpuSpan {
            start: busy_total(),
        }
    }

    /// The share of the machine's cores busy since the start (0 to 1; 0 where unknown).
    pub fn util(&self) -> f64 {
        match (self.start, busy_total()) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                b1.saturating_sub(b0) as f64 / (t1 - t0) as f64
            }
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_meter_reads_a_share() {
        let mut c = CpuMeter::default();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed().as_millis() < 30 {
            x = x.wrapping_add(1);
        }
        std::hint::black_box(x);
        let u = c.read();
        assert!((0.0..=100.0).contains(&u), "{u}");
        let s = CpuSpan::start();
        assert!((0.0..=1.0).contains(&s.util()));
    }
}
