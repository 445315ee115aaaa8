//! Degree statistics of a relation, for `inspect` and the generator's checks.

use crate::csr::Csr;

/// Summary of the row degrees of a CSR.
#[derive(Clone, Debug, PartialEq)]
pub struct DegreeStats {
    /// Smallest degree.
    pub min: u64,
    /// Mean degree.
    pub mean: f64,
    /// Median degree.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest degree.
    pub max: u64,
    /// Rows with degree zero.
    pub zeros: u64,
    /// Share of all edges held by the top 1% of rows (1.0 = all of them).
    pub top1_share: f64,
}

impl DegreeStats {
    /// Computes the statistics of `csr`'s rows.
    pub fn of(csr: &Csr) -> DegreeStats {
        let n = csr.num_rows();
        if n == 0 {
            return DegreeStats {
                min: 0,
                mean: 0.0,
                p50: 0,
                p99: 0,
                max: 0,
                zeros: 0,
                top1_share: 0.0,
            };
        }
        let mut d: Vec<u64> = csr.offsets().windows(2).map(|w| w[1] - w[0]).collect();
        d.sort_unstable();
        let total: u64 = d.iter().sum();
        let q = |p: f64| d[((n - 1) as f64 * p).round() as usize];
        let top = n.div_ceil(100);
        let top_sum: u64 = d[n - top..].iter().sum();
        DegreeStats {
            min: d[0],
            mean: total as f64 / n as f64,
            p50: q(0.5),
            p99: q(0.99),
            max: d[n - 1],
            zeros: d.iter().take_while(|&&x| x == 0).count() as u64,
            top1_share: if total == 0 {
                0.0
            } else {
                top_sum as f64 / total as f64
            },
        }
    }
}
