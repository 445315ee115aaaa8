//! Cache size allocation (Heta §6): each node type gets a share of the budget
//! proportional to (its total visits) × (its miss penalty), or to its visits
//! alone for the hotness-only policy; within a type the most-visited rows are
//! cached. A type that cannot use its share (every visited row fits) gives the
//! rest back to the others, which share it in the same proportions.

pub use crate::config::CachePolicy;

/// What allocation needs to know of one cacheable node type.
#[derive(Clone, Debug, PartialEq)]
pub struct Demand {
    /// Visits of all the type's rows in pre-sampling.
    pub visits: u64,
    /// Rows visited at least once (more is never worth caching).
    pub visited_rows: u64,
    /// Cache bytes one row takes (learnable rows: value, moments and step count).
    pub row_bytes: u64,
    /// Seconds a miss costs per cached byte.
    pub penalty: f64,
}

/// Rows to cache per type (same order as `demands`) within `budget` bytes.
pub fn allocate(policy: CachePolicy, budget: u64, demands: &[Demand]) -> Vec<u64> {
    let weight = |d: &Demand| match policy {
        CachePolicy::MissPenalty => d.visits as f64 * d.penalty.max(0.0),
        CachePolicy::Hotness => d.visits as f64,
        CachePolicy::None => 0.0,
    };
    let mut rows = vec![0u64; demands.len()];
    let mut open: Vec<usize> = (0..demands.len())
        .filter(|&i| {
            weight(&demands[i]) > 0.0 && demands[i].row_bytes > 0 && demands[i].visited_rows > 0
        })
        .collect();
    let mut left = budget;
    // Water-filling: at most one round per type, as each round either fills a type or ends.
    while !open.is_empty() && left > 0 {
        let total: f64 = open.iter().map(|&i| weight(&demands[i])).sum();
        // The relative nudge keeps exact quotients (3/4 of 40 000) from rounding down a byte.
        let share =
            |i: usize| (left as f64 * (weight(&demands[i]) / total) * (1.0 + 1e-12)).floor() as u64;
        let full: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| share(i) >= demands[i].visited_rows * demands[i].row_bytes)
            .collect();
        if full.is_empty() {
            for &i in &open {
                rows[i] = share(i) / demands[i].row_bytes;
            }
            break;
        }
        for &i in &full {
            rows[i] = demands[i].visited_rows;
            left -= demands[i].visited_rows * demands[i].row_bytes;
        }
        open.retain(|i| !full.contains(i));
    }
    // Rounding never takes more than the budget: should it, the largest share gives a row back.
    while rows
        .iter()
        .zip(demands)
        .map(|(r, d)| r * d.row_bytes)
        .sum::<u64>()
        > budget
    {
        let Some(i) = (0..rows.len())
            .filter(|&i| rows[i] > 0)
            .max_by_key(|&i| rows[i] * demands[i].row_bytes)
        else {
            break;
        };
        rows[i] -= 1;
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(visits: u64, visited_rows: u64, row_bytes: u64, penalty: f64) -> Demand {
        Demand {
            visits,
            visited_rows,
            row_bytes,
            penalty,
        }
    }

    #[test]
    fn shares_follow_visits_times_penalty() {
        // Equal visits; type 1's misses cost three times as much per byte.
        let types = [d(1000, 10_000, 100, 1e-9), d(1000, 10_000, 100, 3e-9)];
        let rows = allocate(CachePolicy::MissPenalty, 40_000, &types);
        assert_eq!(
            rows,
            vec![100, 300],
            "a quarter and three quarters of 400 rows"
        );
        assert_eq!(
            allocate(CachePolicy::Hotness, 40_000, &types),
            vec![200, 200],
            "hotness ignores the penalty"
        );
        assert_eq!(allocate(CachePolicy::None, 40_000, &types), vec![0, 0]);
        // Visits count as much as the penalty.
        let types = [d(3000, 10_000, 100, 1e-9), d(1000, 10_000, 100, 1e-9)];
        assert_eq!(
            allocate(CachePolicy::MissPenalty, 40_000, &types),
            vec![300, 100]
        );
    }

    #[test]
    fn a_type_that_fits_whole_gives_the_rest_to_the_others() {
        // Type 0 would get half, but only 50 of its rows were ever visited.
        let types = [
            d(5000, 50, 100, 1e-9),
            d(5000, 10_000, 100, 1e-9),
            d(2500, 10_000, 200, 1e-9),
        ];
        let rows = allocate(CachePolicy::MissPenalty, 100_000, &types);
        assert_eq!(rows[0], 50);
        // 95 000 bytes left, split 2:1 by weight: 63 333 and 31 666 bytes.
        assert_eq!(rows[1..], [633, 158]);
        // Enough for everything: every visited row is cached.
        assert_eq!(
            allocate(CachePolicy::Hotness, u64::MAX / 2, &types),
            vec![50, 10_000, 10_000]
        );
    }

    #[test]
    fn the_budget_is_never_exceeded() {
        let mut x = 12345u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let n = 1 + next() % 5;
            let types: Vec<Demand> = (0..n)
                .map(|_| {
                    d(
                        next() % 100_000,
                        next() % 5000,
                        1 + next() % 3000,
                        (next() % 1000) as f64 * 1e-12,
                    )
                })
                .collect();
            let budget = next() % 20_000_000;
            for policy in [CachePolicy::MissPenalty, CachePolicy::Hotness] {
                let rows = allocate(policy, budget, &types);
                let used: u64 = rows.iter().zip(&types).map(|(r, t)| r * t.row_bytes).sum();
                assert!(used <= budget, "{used} > {budget} for {types:?}");
                assert!(rows.iter().zip(&types).all(|(r, t)| *r <= t.visited_rows));
                // Nothing useful is left out: either the budget is (nearly) used or every visited row is in.
                let all_in = rows.iter().zip(&types).all(|(r, t)| {
                    *r == t.visited_rows
                        || t.visits == 0
                        || (policy == CachePolicy::MissPenalty && t.penalty == 0.0)
                });
                let slack: u64 = types.iter().map(|t| t.row_bytes + 1).sum();
                assert!(
                    all_in || budget - used <= slack,
                    "{} bytes unused of {budget}",
                    budget - used
                );
            }
        }
    }
}
