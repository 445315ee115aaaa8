//! `hetgnn partition`: split a graph for data-parallel training (owners per
//! node) or raf training (relations per partition), and report the edge cut,
//! replication, balance, time and peak memory (`report.json`, the same
//! fields for every method).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use graphs::partition::{self, Manifest, Method, PartitionReport};
use graphs::LoadOptions;

use crate::bar;

/// Options of `hetgnn partition`.
#[derive(clap::Args, Debug)]
pub struct PartitionArgs {
    /// The graph directory.
    #[arg(long)]
    pub data: PathBuf,
    /// Number of partitions (one per machine).
    #[arg(long)]
    pub parts: usize,
    /// How to assign owners: metis (edge cut, balanced types, edges and
    /// splits), random, meta (by relation, for raf), block-row or
    /// block-row-random (equal blocks of METIS or shuffled order per type, for
    /// full-graph training), bytegnn (ByteGNN: K-hop blocks around the
    /// labelled nodes, placed for cross edges and train/valid/test balance),
    /// or streaming in O(nodes) memory: spring (CATGNN), hdrf or dbh
    /// (vertex-cut baselines).
    #[arg(long, default_value = "metis")]
    pub method: Method,
    /// SPRING: the clustering pass's volume bound, as a fraction of one
    /// partition's share of the volume (2|E| / parts).
    #[arg(long, default_value_t = 0.1)]
    pub spring_tau: f64,
    /// SPRING: what dealing clusters to partitions balances: nodes (the
    /// paper's) or multi (nodes of every type, training nodes and edges together).
    #[arg(long, default_value = "nodes")]
    pub spring_balance: String,
    /// SPRING: restreaming passes after LPT (0: the paper's algorithm), each
    /// moving nodes to the partition holding most of their neighbours within
    /// the node-balance bound; 2·parts bytes more per node.
    #[arg(long, default_value_t = 0)]
    pub spring_refine: usize,
    /// ByteGNN: hops of the BFS that grows a block around each labelled
    /// node, the model's depth [default: 2].
    #[arg(long)]
    pub bytegnn_hops: Option<usize>,
    /// ByteGNN: weight in 0..=1 of the per-type node and edge terms in the
    /// balance score, for heterogeneous graphs (the train/valid/test terms
    /// get the rest); above 0 they also cap every node type and the edges
    /// at 1.05 × the mean, as far as blocks allow [default: 0].
    #[arg(long)]
    pub bytegnn_type_weight: Option<f64>,
    /// ByteGNN: strength in 0..=1 of the balance term of the score (1: the
    /// paper's, 0 at 5% over the mean; lower leaves the balance to the caps
    /// and weighs cross edges more) [default: 1].
    #[arg(long)]
    pub bytegnn_balance_weight: Option<f64>,
    /// ByteGNN: clusters of neighbouring blocks per partition, placed whole
    /// (0: blocks one by one, as in the paper) [default: 32].
    #[arg(long)]
    pub bytegnn_clusters: Option<usize>,
    /// ByteGNN: refinement sweeps after placement, each moving every block
    /// to the partition it shares most edges with, within the caps (0: none,
    /// as in the paper) [default: 10].
    #[arg(long)]
    pub bytegnn_passes: Option<usize>,
    /// ByteGNN: how blocks are placed: `metis` (METIS over the block graph)
    /// or `greedy` (the paper's Algorithm 2, fixed: less memory, a higher
    /// cut on small graphs) [default: metis].
    #[arg(long)]
    pub bytegnn_place: Option<partition::bytegnn::Placement>,
    /// ByteGNN: the sampler's fanouts per hop, seeds outward, which the
    /// last step places nodes for (hops past the list take the last)
    /// [default: 25,20, training's].
    #[arg(long, value_delimiter = ',')]
    pub bytegnn_fanouts: Option<Vec<usize>>,
    /// ByteGNN: weights of train, valid and test nodes as seeds in the last
    /// step, which moves nodes to the partitions whose seeds' sampled
    /// neighbourhoods read them, and seeds to where what they read is
    /// (0,0,0: no such step, as in the paper) [default: 1,0.1,0.1].
    #[arg(long, value_delimiter = ',')]
    pub bytegnn_seed_weights: Option<Vec<f64>>,
    /// Second level (DistDGLv2): trainers per partition, each taking the seeds
    /// of a sub-partition of its machine's nodes.
    #[arg(long, default_value_t = 1)]
    pub trainers: usize,
    /// Meta-partitioning: the model's depth (the metatree's).
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Meta-partitioning and bytegnn: without reverse relations (as training
    /// with --no-reverse-edges): the metatree, or the blocks' BFS, follows
    /// the stored relations' direction only.
    #[arg(long)]
    pub no_reverse_edges: bool,
    /// Meta-partitioning: build the metatree from these metapaths (one per line,
    /// relation names from the target outward) instead of BFS over every relation.
    #[arg(long)]
    pub metapaths: Option<PathBuf>,
    /// Partitioner seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace the output directory if it exists.
    #[arg(long)]
    pub force: bool,
    /// Keep halo nodes' feature rows in each partition too (owners-based methods).
    #[arg(long)]
    pub halo_features: bool,
}

/// Runs `hetgnn partition`.
pub fn run(args: &PartitionArgs) -> Result<()> {
    let mut inputs = vec![("--data", args.data.as_path())];
    inputs.extend(args.metapaths.as_deref().map(|p| ("--metapaths", p)));
    crate::output::check(
        &[crate::output::Output {
            flag: "--out",
            path: &args.out,
            kind: crate::output::Kind::Dir,
        }],
        args.force,
        &inputs,
    )?;
    anyhow::ensure!(
        args.metapaths.is_none() || args.method == Method::Meta,
        "--metapaths applies to --method meta"
    );
    let bytegnn = bytegnn_options(args)?;
    if args.method == Method::Meta {
        return run_meta(args);
    }
    graphs::memory::track_anon();
    let start = Instant::now();
    if args.method.streams() {
        anyhow::ensure!(
            args.trainers == 1,
            "--trainers applies to metis and random partitions"
        );
        let balance = match args.spring_balance.as_str() {
            "multi" => partition::spring::Balance::Multi,
            "nodes" => partition::spring::Balance::Nodes,
            other => anyhow::bail!("--spring-balance: '{other}' is not multi or nodes"),
        };
        let spring = partition::spring::Spring {
            tau_fraction: args.spring_tau,
            balance,
            refine: args.spring_refine,
            ..Default::default()
        };
        // Neither step loads the graph: memory is bounded by the node count.
        let a = partition::assign_streaming(&args.data, args.parts, args.method, args.seed, spring)
            .with_context(|| format!("streaming the edges of {}", args.data.display()))?;
        let assigned = start.elapsed().as_secs_f64();
        let opts = partition::WriteOptions {
            overwrite: args.force,
            halo_features: args.halo_features,
            graph_sha256: Some(
                graphs::fingerprint::content(&args.data)
                    .with_context(|| format!("reading {}", args.data.display()))?,
            ),
        };
        let manifest =
            partition::write_streaming(&args.data, &a, &args.out, &opts, &mut bar::Bars::new())
                .with_context(|| format!("writing partitions to {}", args.out.display()))?;
        let counts: Vec<u64> =
            manifest
                .info
                .iter()
                .fold(vec![0u64; manifest.node_types.len()], |mut acc, p| {
                    acc.iter_mut().zip(&p.core).for_each(|(a, c)| *a += c);
                    acc
                });
        sayln!(
            "{}: {} partitions ({}), edge cut {} of {}",
            manifest.graph,
            manifest.parts,
            manifest.method,
            manifest.edge_cut,
            manifest.total_edges
        );
        sayln!("assigned in {assigned:.1}s");
        finish(
            PartitionReport::of_nodes(&manifest, &counts),
            start,
            &args.out,
        )?;
        sayln!(
            "wrote {} partitions to {}",
            manifest.parts,
            args.out.display()
        );
        return Ok(());
    }
    let g = graphs::load(
        &args.data,
        &LoadOptions {
            mmap_features: true,
            reverse_edges: false,
        },
    )
    .with_context(|| format!("loading {}", args.data.display()))?;
    let a = match &bytegnn {
        Some(b) => partition::assign_two_level_with(
            &g,
            args.parts,
            args.trainers,
            args.method,
            b,
            args.seed,
        ),
        None => partition::assign_two_level(&g, args.parts, args.trainers, args.method, args.seed),
    }
    .context("assigning owners")?;
    let assigned = start.elapsed().as_secs_f64();
    let opts = partition::WriteOptions {
        overwrite: args.force,
        halo_features: args.halo_features,
        graph_sha256: Some(
            graphs::fingerprint::content(&args.data)
                .with_context(|| format!("reading {}", args.data.display()))?,
        ),
    };
    let manifest = partition::write_with(&g, &a, &args.out, &opts, &mut bar::Bars::new())
        .with_context(|| format!("writing partitions to {}", args.out.display()))?;
    print_report(&manifest, &g);
    let counts: Vec<u64> = g.node_types().iter().map(|t| u64::from(t.count)).collect();
    let report = PartitionReport::of_nodes(&manifest, &counts);
    sayln!("assigned in {assigned:.1}s");
    finish(report, start, &args.out)?;
    sayln!(
        "wrote {} partitions to {}",
        manifest.parts,
        args.out.display()
    );
    Ok(())
}

/// `--method bytegnn`'s options (`None` for other methods, which refuse them).
fn bytegnn_options(args: &PartitionArgs) -> Result<Option<partition::bytegnn::ByteGnn>> {
    if args.method != Method::Bytegnn {
        let given = [
            ("--bytegnn-hops", args.bytegnn_hops.is_some()),
            ("--bytegnn-type-weight", args.bytegnn_type_weight.is_some()),
            ("--bytegnn-passes", args.bytegnn_passes.is_some()),
            (
                "--bytegnn-balance-weight",
                args.bytegnn_balance_weight.is_some(),
            ),
            ("--bytegnn-clusters", args.bytegnn_clusters.is_some()),
            ("--bytegnn-place", args.bytegnn_place.is_some()),
            ("--bytegnn-fanouts", args.bytegnn_fanouts.is_some()),
            (
                "--bytegnn-seed-weights",
                args.bytegnn_seed_weights.is_some(),
            ),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, on)| *on) {
            anyhow::bail!("{flag} applies to --method bytegnn, not {}", args.method);
        }
        return Ok(None);
    }
    let d = partition::bytegnn::ByteGnn::DEFAULT;
    let b = partition::bytegnn::ByteGnn {
        hops: args.bytegnn_hops.unwrap_or(d.hops),
        reverse: !args.no_reverse_edges,
        type_weight: args.bytegnn_type_weight.unwrap_or(d.type_weight),
        balance_weight: args.bytegnn_balance_weight.unwrap_or(d.balance_weight),
        clusters: args.bytegnn_clusters.unwrap_or(d.clusters),
        passes: args.bytegnn_passes.unwrap_or(d.passes),
        place: args.bytegnn_place.unwrap_or(d.place),
        fanouts: match &args.bytegnn_fanouts {
            Some(list) => partition::bytegnn::Fanouts::new(list).context("--bytegnn-fanouts")?,
            None => d.fanouts,
        },
        seed_weights: match args.bytegnn_seed_weights.as_deref() {
            Some(&[train, valid, test]) => [train, valid, test],
            Some(other) => anyhow::bail!(
                "--bytegnn-seed-weights takes three values (train, valid, test), got {}",
                other.len()
            ),
            None => d.seed_weights,
        },
    };
    b.validate()?;
    Ok(Some(b))
}

/// Adds the time and peak memory to `report`, prints its summary (the same
/// lines for every method) and writes it beside the manifest.
fn finish(mut report: PartitionReport, start: Instant, out: &std::path::Path) -> Result<()> {
    report.seconds = start.elapsed().as_secs_f64();
    report.peak_memory_bytes = graphs::memory::peak_rss_bytes();
    report.peak_anon_bytes = graphs::memory::peak_anon_bytes();
    let balance: Vec<String> = report
        .balance
        .iter()
        .map(|(k, v)| format!("{k} {v:.3}"))
        .collect();
    sayln!(
        "{} ({}): edge cut {} of {} ({:.1}%), replication factor {:.3}, boundary nodes {}",
        report.method,
        report.kind,
        report.edge_cut,
        report.total_edges,
        100.0 * report.edge_cut as f64 / report.total_edges.max(1) as f64,
        report.replication_factor,
        report.boundary_nodes.iter().sum::<u64>()
    );
    sayln!("balance (max/mean): {}", balance.join(", "));
    if !report.split_balance.is_empty() {
        let splits: Vec<String> = ["train", "valid", "test"]
            .iter()
            .filter_map(|s| report.split_balance.get(*s).map(|v| format!("{s} {v:.3}")))
            .collect();
        sayln!("split balance (max/mean): {}", splits.join(", "));
    }
    let by_type: Vec<String> = report
        .replication_by_type
        .iter()
        .map(|(k, v)| format!("{k} {v:.3}"))
        .collect();
    sayln!("replication by type: {}", by_type.join(", "));
    let mib = |b: Option<u64>| {
        b.map_or("unknown".into(), |b| {
            format!("{:.0} MiB", b as f64 / (1 << 20) as f64)
        })
    };
    sayln!(
        "{:.1}s, peak memory {} (anonymous {})",
        report.seconds,
        mib(report.peak_memory_bytes),
        mib(report.peak_anon_bytes)
    );
    report
        .write(out)
        .with_context(|| format!("writing the report into {}", out.display()))?;
    Ok(())
}

fn print_report(m: &Manifest, g: &graphs::HetGraph) {
    sayln!(
        "{}: {} partitions ({}), edge cut {} of {} ({:.1}%)",
        m.graph,
        m.parts,
        m.method,
        m.edge_cut,
        m.total_edges,
        100.0 * m.edge_cut as f64 / m.total_edges.max(1) as f64
    );
    let types: Vec<&str> = g.node_types().iter().map(|t| t.name.as_str()).collect();
    say!("{:>5} {:>10}", "part", "edges");
    for t in &types {
        say!(" {:>18}", format!("{t} core/halo"));
    }
    sayln!(" {:>20}", "train/valid/test");
    for (k, p) in m.info.iter().enumerate() {
        say!("{k:>5} {:>10}", p.edges);
        for (c, h) in p.core.iter().zip(&p.halo) {
            say!(" {:>18}", format!("{c}/{h}"));
        }
        sayln!(
            " {:>20}",
            format!("{}/{}/{}", p.splits[0], p.splits[1], p.splits[2])
        );
    }
    if m.trainers > 1 {
        sayln!(
            "second level: {} trainers per partition; train/valid/test seeds per trainer:",
            m.trainers
        );
        for (k, p) in m.info.iter().enumerate() {
            let per: Vec<String> = p
                .trainer_splits
                .iter()
                .map(|s| format!("{}/{}/{}", s[0], s[1], s[2]))
                .collect();
            sayln!("{k:>5} {}", per.join("  "));
        }
    }
}

/// `--method meta`: Heta's partitioning by relations, with its report.
fn run_meta(args: &PartitionArgs) -> Result<()> {
    anyhow::ensure!(args.trainers == 1, "--trainers applies to metis and random partitions; meta-partitions replicate instead when --parts exceeds the sub-metatrees");
    anyhow::ensure!(
        !args.halo_features,
        "--halo-features applies to partitions by owner; meta-partitions hold whole relations"
    );
    graphs::memory::track_anon();
    let start = Instant::now();
    let opts = LoadOptions {
        mmap_features: true,
        reverse_edges: !args.no_reverse_edges,
    };
    let g = graphs::load(&args.data, &opts)
        .with_context(|| format!("loading {}", args.data.display()))?;
    let paths = match &args.metapaths {
        Some(p) => {
            let text =
                graphs::input::read_text(p).with_context(|| format!("reading {}", p.display()))?;
            Some(
                partition::meta::parse_metapaths(&text, &g, args.layers)
                    .with_context(|| format!("in {}", p.display()))?,
            )
        }
        None => None,
    };
    let content = graphs::fingerprint::content(&args.data)
        .with_context(|| format!("reading {}", args.data.display()))?;
    let opts = partition::meta::MetaOptions {
        layers: args.layers,
        parts: args.parts,
        metapaths: paths.as_deref(),
        graph_sha256: Some(&content),
        overwrite: args.force,
    };
    let m = partition::meta::write_metapaths(&g, &opts, &args.out, &mut bar::Bars::new())
        .with_context(|| format!("writing meta-partitions to {}", args.out.display()))?;
    let total: u64 = m.info.iter().map(|p| p.load).sum();
    sayln!(
        "{}: {} meta-partitions for a {}-layer model (reverse relations {})",
        m.graph,
        m.parts,
        m.layers,
        if m.reverse_edges {
            "included"
        } else {
            "excluded"
        }
    );
    if !m.metapaths.is_empty() {
        let paths: Vec<String> = m.metapaths.iter().map(|p| p.join(" <- ")).collect();
        sayln!(
            "metatree from {} metapath(s): {}",
            paths.len(),
            paths.join("; ")
        );
    }
    for (k, p) in m.info.iter().enumerate() {
        let replica = if p.replica[1] > 1 {
            format!(
                ", replica {} of {} (splits the target nodes)",
                p.replica[0] + 1,
                p.replica[1]
            )
        } else {
            String::new()
        };
        let reducer = if p.reducer {
            "; the reducer's (computes the target nodes' own rows)"
        } else {
            ""
        };
        sayln!(
            "part {k}: sub-metatrees via {}{replica}{reducer}; load {} ({:.1}% of all)",
            p.subtrees.join(", "),
            p.load,
            100.0 * p.load as f64 / total.max(1) as f64
        );
        sayln!("  relations: {}", p.relations.join(" "));
        let nodes: Vec<String> = p.nodes.iter().map(|(t, n)| format!("{t} {n}")).collect();
        sayln!(
            "  nodes: {}; edges: {}; boundary nodes: {} (target only)",
            nodes.join(", "),
            p.edges.values().sum::<u64>(),
            p.boundary_nodes
        );
    }
    let loads: Vec<u64> = m.info.iter().map(|p| p.load).collect();
    let mean = total as f64 / loads.len().max(1) as f64;
    sayln!(
        "load balance (max/mean) {:.3}",
        *loads.iter().max().unwrap_or(&0) as f64 / mean.max(1.0)
    );
    let counts = g
        .node_types()
        .iter()
        .map(|t| (t.name.clone(), u64::from(t.count)))
        .collect();
    let edges = g.relations().iter().map(|r| r.num_edges() as u64).sum();
    finish(
        PartitionReport::of_relations(&m, &counts, edges),
        start,
        &args.out,
    )?;
    sayln!(
        "wrote {} meta-partitions to {}",
        m.parts,
        args.out.display()
    );
    Ok(())
}
