//! `hetgnn inspect`: validates a graph directory and prints what is in it.

use std::path::Path;

use anyhow::Context;
use graphs::stats::DegreeStats;
use graphs::{load, LoadOptions};

pub fn run(dir: &Path, reverse_edges: bool) -> anyhow::Result<()> {
    let g = load(
        dir,
        &LoadOptions {
            mmap_features: true,
            reverse_edges,
        },
    )
    .with_context(|| format!("{} is not a valid graph directory", dir.display()))?;
    let target = g.node_type(g.target());
    sayln!("graph {}  ({})", g.name(), dir.display());
    sayln!("target {}  ({} classes)", target.name, g.num_classes());
    sayln!();
    sayln!("node types");
    for t in g.node_types() {
        let features = match &t.features {
            Some(f) => format!("features {:>5}", f.dim()),
            None => "featureless (learnable embedding)".to_string(),
        };
        say!("  {:<20} {:>12} nodes  {features}", t.name, t.count);
        if let (Some(labels), Some(s)) = (&t.labels, &t.splits) {
            let labelled = labels.iter().filter(|&&l| l >= 0).count();
            say!(
                "  labelled {labelled}  train {} valid {} test {}",
                s.train.len(),
                s.valid.len(),
                s.test.len()
            );
        }
        sayln!();
    }
    sayln!();
    sayln!(
        "relations (degree: min / mean / p50 / p99 / max, share of edges on the top 1% of nodes)"
    );
    for r in g.relations() {
        let (src, dst) = (&g.node_type(r.src).name, &g.node_type(r.dst).name);
        sayln!(
            "  {}  {} edges{}",
            r.canonical(),
            r.num_edges(),
            if r.reverse_of.is_some() {
                "  (added reverse)"
            } else {
                ""
            }
        );
        for (what, ty, stats) in [
            ("in ", dst, DegreeStats::of(r.in_csr())),
            ("out", src, DegreeStats::of(r.out_csr())),
        ] {
            sayln!(
                "    {what}-degree of {ty:<16} {} / {:.2} / {} / {} / {}  top1% {:.1}%  zero-degree {}",
                stats.min,
                stats.mean,
                stats.p50,
                stats.p99,
                stats.max,
                stats.top1_share * 100.0,
                stats.zeros
            );
        }
    }
    sayln!();
    sayln!("metagraph");
    for line in g.metagraph().to_string().lines() {
        sayln!("  {line}");
    }
    Ok(())
}
