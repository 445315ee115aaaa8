//! Partitioning: owners, halo completeness, the written directory, and
//! distributed sampling that stitches owners' picks into the exact blocks the
//! whole-graph sampler produces.

use std::path::Path;

mod common;
use common::read_all;

use graphs::partition::{self, Method, PartitionReport, PartitionSet};
use graphs::sampler::epoch_batches;
use graphs::{HetGraph, LoadOptions, NoProgress, RelationFilter, Sampler};

fn mag(dir: &Path) -> HetGraph {
    let gdir = dir.join("g");
    graphs::generate::generate(
        graphs::generate::Like::Mag,
        0.002,
        3,
        &gdir,
        false,
        &mut NoProgress,
    )
    .unwrap();
    graphs::load(
        &gdir,
        &LoadOptions {
            mmap_features: false,
            reverse_edges: false,
        },
    )
    .unwrap()
}

fn write(g: &HetGraph, dir: &Path, parts: usize, method: Method) -> PartitionSet {
    let a = partition::assign(g, parts, method, 7).unwrap();
    let out = dir.join(format!("{method}{parts}"));
    partition::write(g, &a, &out, false, &mut NoProgress).unwrap();
    PartitionSet::open(&out).unwrap()
}

#[test]
fn metis_cuts_fewer_edges_than_random_and_balances_every_type_and_split() {
    let tmp = tempfile::tempdir().unwrap();
    let g = mag(tmp.path());
    let m = write(&g, tmp.path(), 3, Method::Metis).manifest;
    let r = write(&g, tmp.path(), 3, Method::Random).manifest;
    assert_eq!(m.total_edges, r.total_edges);
    assert!(
        m.edge_cut * 10 < r.edge_cut * 8,
        "metis cut {} vs random {}",
        m.edge_cut,
        r.edge_cut
    );
    for t in 0..g.node_types().len() {
        let b = m.balance(|p| p.core[t]);
        assert!(b < 1.15, "type {t} balance {b}");
        let total: u64 = m.info.iter().map(|p| p.core[t]).sum();
        assert_eq!(total, u64::from(g.node_types()[t].count));
    }
    for s in 0..3 {
        let b = m.balance(|p| p.splits[s]);
        assert!(b < 1.15, "split {s} balance {b}");
    }
}

#[test]
fn partitions_hold_full_neighborhoods_of_core_nodes_and_only_core_features() {
    let tmp = tempfile::tempdir().unwrap();
    let g = mag(tmp.path());
    let set = write(&g, tmp.path(), 3, Method::Metis);
    let opts = LoadOptions {
        mmap_features: true,
        reverse_edges: true,
    };
    let mut full = graphs::load(&tmp.path().join("g"), &opts).unwrap();
    full.add_reverse_relations().ok();
    for k in 0..3 {
        let p = set.load_part(k, &opts).unwrap();
        assert_eq!(p.relations().len(), full.relations().len());
        for (r, (pr, fr)) in p.relations().iter().zip(full.relations()).enumerate() {
            for v in 0..fr.in_csr().num_rows() as u32 {
                if set.owners[fr.dst.index()][v as usize] as usize == k {
                    assert_eq!(
                        pr.in_csr().neighbors(v),
                        fr.in_csr().neighbors(v),
                        "relation {r} node {v}"
                    );
                }
            }
        }
        for (t, (pt, ft)) in p.node_types().iter().zip(full.node_types()).enumerate() {
            let (Some(pf), Some(ff)) = (&pt.features, &ft.features) else {
                continue;
            };
            for v in 0..ft.count as usize {
                if set.owners[t][v] as usize == k {
                    assert_eq!(pf.row(v), ff.row(v));
                } else {
                    assert!(
                        pf.row(v).iter().all(|&x| x == 0.0),
                        "non-core rows are holes"
                    );
                }
            }
        }
    }
    // Halo counts in the manifest are consistent with the stored edges.
    assert!(set
        .manifest
        .info
        .iter()
        .all(|p| p.halo.iter().sum::<u64>() > 0));
}

#[test]
#[allow(clippy::needless_range_loop)]
fn distributed_sampling_equals_whole_graph_sampling() {
    let tmp = tempfile::tempdir().unwrap();
    let g = mag(tmp.path());
    for method in [Method::Metis, Method::Random] {
        let set = write(&g, tmp.path(), 3, method);
        let opts = LoadOptions {
            mmap_features: true,
            reverse_edges: true,
        };
        let full = graphs::load(&tmp.path().join("g"), &opts).unwrap();
        let parts: Vec<HetGraph> = (0..3).map(|k| set.load_part(k, &opts).unwrap()).collect();
        // Every partition carries the target's label sets whole.
        for p in &parts {
            assert_eq!(p.target_label_sets(), full.target_label_sets());
        }
        let fanouts = [4, 3];
        let mut whole = Sampler::new(&full, &fanouts, 11).unwrap();
        let mut owners_samplers: Vec<Sampler> = parts
            .iter()
            .map(|p| Sampler::new(p, &fanouts, 11).unwrap())
            .collect();
        let (_, splits) = full.target_labels();
        let batches = epoch_batches(&splits.train, 64, 11, 1);
        for (step, batch) in batches.iter().take(3).enumerate() {
            for k in 0..3 {
                let seeds: Vec<u32> = batch
                    .iter()
                    .copied()
                    .filter(|&v| set.owners[full.target().index()][v as usize] as usize == k)
                    .collect();
                let want = whole.sample(1, step as u64, &seeds).unwrap();
                let mut me = Sampler::new(&parts[k], &fanouts, 11).unwrap();
                let owners = &set.owners;
                let got = me
                    .sample_with(
                        1,
                        step as u64,
                        &seeds,
                        &RelationFilter::All,
                        |t, v| owners[t][v as usize] as usize == k,
                        |layer, fanout, away| {
                            let mut out = Vec::new();
                            for (t, nodes) in away.iter().enumerate() {
                                // Ask each owner for its nodes, then put the answers back in request order.
                                let mut per_owner: Vec<(Vec<usize>, Vec<graphs::RelationPicks>)> =
                                    Vec::new();
                                for (o, sampler) in owners_samplers.iter_mut().enumerate() {
                                    let idx: Vec<usize> = (0..nodes.len())
                                        .filter(|&i| owners[t][nodes[i] as usize] as usize == o)
                                        .collect();
                                    let ask: Vec<u32> = idx.iter().map(|&i| nodes[i]).collect();
                                    let ans = sampler.pick(
                                        1,
                                        step as u64,
                                        layer,
                                        fanout,
                                        graphs::NodeTypeId(t as u32),
                                        &ask,
                                        &RelationFilter::All,
                                        &graphs::link::NoExclusion,
                                    )?;
                                    per_owner.push((idx, ans));
                                }
                                let n_rel = per_owner[0].1.len();
                                let mut merged = Vec::new();
                                for r in 0..n_rel {
                                    let mut lists = vec![Vec::new(); nodes.len()];
                                    for (idx, ans) in &per_owner {
                                        let p = &ans[r];
                                        for (j, &i) in idx.iter().enumerate() {
                                            lists[i] = p.picks
                                                [p.offsets[j] as usize..p.offsets[j + 1] as usize]
                                                .to_vec();
                                        }
                                    }
                                    let mut offsets = vec![0u32];
                                    let mut picks = Vec::new();
                                    for l in lists {
                                        picks.extend(l);
                                        offsets.push(picks.len() as u32);
                                    }
                                    merged.push(graphs::RelationPicks {
                                        relation: per_owner[0].1[r].relation,
                                        offsets,
                                        picks,
                                    });
                                }
                                out.push(merged);
                            }
                            Ok::<_, graphs::GraphError>(out)
                        },
                    )
                    .unwrap();
                assert_eq!(got, want, "{method} step {step} partition {k}");
            }
        }
    }
}

/// Rewrites `dir`'s manifest as directories written before seals were
/// (no `seal`, no `files`), and returns its text.
fn unseal(dir: &Path) -> String {
    let mpath = dir.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mpath).unwrap()).unwrap();
    let obj = m.as_object_mut().unwrap();
    obj.remove("seal");
    obj.remove("files");
    let text = m.to_string();
    std::fs::write(&mpath, &text).unwrap();
    text
}

#[test]
fn bad_partition_directories_are_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let g = mag(tmp.path());
    let set = write(&g, tmp.path(), 2, Method::Random);
    let dir = set.part_dir(0).parent().unwrap().to_path_buf();
    assert!(partition::assign(&g, 0, Method::Random, 0).is_err());
    let err = PartitionSet::open(tmp.path()).err().unwrap().to_string();
    assert!(err.contains("manifest.json"), "{err}");
    // A trainer count whose product with the parts overflows is refused, not
    // wrapped (in a manifest without a seal, as directories written before seals).
    let mpath = dir.join("manifest.json");
    let good = unseal(&dir);
    let mut m: serde_json::Value = serde_json::from_str(&good).unwrap();
    m["trainers"] = serde_json::json!(1u64 << 63);
    std::fs::write(&mpath, m.to_string()).unwrap();
    let err = PartitionSet::open(&dir).err().unwrap().to_string();
    assert!(
        err.contains("manifest.json")
            && err.contains("trainers = 9223372036854775808 out of range"),
        "{err}"
    );
    std::fs::write(&mpath, good).unwrap();
    let owners = dir.join("owners").join("paper.npy");
    let mut bytes = std::fs::read(&owners).unwrap();
    let n = bytes.len();
    bytes[n - 8..].copy_from_slice(&9i64.to_le_bytes());
    std::fs::write(&owners, &bytes).unwrap();
    let err = PartitionSet::open(&dir).err().unwrap().to_string();
    assert!(
        err.contains("paper.npy") && err.contains("owner 9"),
        "{err}"
    );
}

#[test]
fn the_second_level_splits_each_partitions_seeds_between_its_trainers() {
    let tmp = tempfile::tempdir().unwrap();
    let g = mag(tmp.path());
    for method in [Method::Metis, Method::Random] {
        let a = partition::assign_two_level(&g, 2, 3, method, 5).unwrap();
        let out = tmp.path().join(format!("{method}-2x3"));
        let m = partition::write(&g, &a, &out, false, &mut NoProgress).unwrap();
        assert_eq!(m.trainers, 3);
        let set = PartitionSet::open(&out).unwrap();
        assert_eq!(set.trainer_of, a.trainer_of);
        let (_, splits) = g.target_labels();
        for (k, p) in m.info.iter().enumerate() {
            assert_eq!(p.trainer_splits.len(), 3);
            let per: Vec<u64> = p.trainer_splits.iter().map(|s| s[0]).collect();
            assert_eq!(
                per.iter().sum::<u64>(),
                p.splits[0],
                "partition {k}: every owned seed has one trainer"
            );
            let mean = p.splits[0] as f64 / 3.0;
            assert!(
                per.iter().all(|&c| (c as f64) < mean * 1.25),
                "{method} partition {k}: {per:?}"
            );
        }
        assert!(splits.train.iter().all(|&v| a.trainer_of[v as usize] < 3));
    }
    assert!(partition::assign_two_level(&g, 2, 0, Method::Metis, 0).is_err());
    // Without trainers.npy (directories written before it, so without seals
    // too): fine for one trainer per partition, named otherwise.
    let one = write(&g, tmp.path(), 2, Method::Random);
    let root = one.part_dir(0).parent().unwrap().to_path_buf();
    unseal(&root);
    std::fs::remove_file(root.join("trainers.npy")).unwrap();
    assert!(PartitionSet::open(&root).unwrap().trainer_of.is_empty());
    let two = tmp.path().join("metis-2x3");
    unseal(&two);
    std::fs::remove_file(two.join("trainers.npy")).unwrap();
    let err = PartitionSet::open(&two).err().unwrap().to_string();
    assert!(err.contains("trainers.npy"), "{err}");
}

#[test]
fn meta_partitions_hold_whole_relations_and_load_as_graphs() {
    let tmp = tempfile::tempdir().unwrap();
    mag(tmp.path());
    let opts = LoadOptions {
        mmap_features: true,
        reverse_edges: true,
    };
    let g = graphs::load(&tmp.path().join("g"), &opts).unwrap();
    let out = tmp.path().join("meta");
    let m = partition::meta::write(&g, 2, 2, &out, false, &mut NoProgress).unwrap();
    assert_eq!((m.parts, m.layers, m.method.as_str()), (2, 2, "meta"));
    let target = g.node_type(g.target()).count as u64;
    for (k, p) in m.info.iter().enumerate() {
        assert_eq!(p.boundary_nodes, target);
        assert_eq!(
            p.nodes["paper"], target,
            "every partition holds all target nodes"
        );
        let part = graphs::load(&out.join(format!("part{k}")), &opts).unwrap();
        // A relation has data there iff the partition holds it or its reverse (stored once, as the original).
        let base = |r: usize| g.relations()[r].reverse_of.map_or(r, |o| o.0 as usize);
        let held: Vec<usize> = (0..g.relations().len())
            .filter(|&r| {
                p.relations
                    .contains(&g.relations()[r].canonical().to_string())
            })
            .map(base)
            .collect();
        for (r, (pr, fr)) in part.relations().iter().zip(g.relations()).enumerate() {
            let want = if held.contains(&base(r)) {
                fr.num_edges()
            } else {
                0
            };
            assert_eq!(
                pr.num_edges(),
                want,
                "partition {k}, relation {}",
                fr.canonical()
            );
        }
    }
    // Data-parallel training cannot use them, and says why.
    let err = PartitionSet::open(&out).err().unwrap().to_string();
    assert!(err.contains("raf"), "{err}");
    assert!(
        partition::meta::write(&g, 2, 0, &tmp.path().join("m0"), false, &mut NoProgress).is_err()
    );
}

#[test]
fn metapaths_restrict_the_metatree_and_bad_ones_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    mag(tmp.path());
    let g = graphs::load(
        &tmp.path().join("g"),
        &LoadOptions {
            mmap_features: true,
            reverse_edges: true,
        },
    )
    .unwrap();
    let paths = partition::meta::parse_metapaths(
        "# paper <- author <- paper\nwrites rev_writes\n\nfield_of_study__rev_has_topic__paper\n",
        &g,
        2,
    )
    .unwrap();
    let out = tmp.path().join("mp");
    let m = partition::meta::write_metapaths(
        &g,
        &partition::meta::MetaOptions {
            layers: 2,
            parts: 2,
            metapaths: Some(&paths),
            graph_sha256: None,
            overwrite: false,
        },
        &out,
        &mut NoProgress,
    )
    .unwrap();
    assert_eq!(m.metapaths.len(), 2);
    let allowed = partition::meta::allowed_per_layer(&paths, 2);
    for p in &m.info {
        for (l, rels) in p.per_layer.iter().enumerate() {
            for r in rels {
                assert!(
                    allowed[l].contains(&g.relation_id(r).unwrap()),
                    "{r} at layer {l} is on no metapath"
                );
            }
        }
    }
    let set = partition::meta::MetaSet::open(&out).unwrap();
    assert_eq!(set.manifest.metapaths, m.metapaths);
    let err = |text: &str| {
        partition::meta::parse_metapaths(text, &g, 2)
            .unwrap_err()
            .to_string()
    };
    assert!(err("wrote\n").contains("no relation named wrote"));
    assert!(err("rev_writes\n").contains("leads into author, not paper"));
    assert!(err("cites cites cites\n").contains("3 relations for a 2-layer model"));
    assert!(err("# nothing\n").contains("no path"));
}

#[test]
fn both_kinds_report_the_same_figures_and_the_report_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let g = mag(tmp.path());
    let counts: Vec<u64> = g.node_types().iter().map(|t| u64::from(t.count)).collect();
    let total_nodes: u64 = counts.iter().sum();
    // Node-assigning: every node owned once, halo nodes are the copies.
    let set = write(&g, tmp.path(), 3, Method::Metis);
    let r = PartitionReport::of_nodes(&set.manifest, &counts);
    assert_eq!(
        (r.kind.as_str(), r.method.as_str(), r.parts, r.edge_cut),
        ("node-assigning", "metis", 3, set.manifest.edge_cut)
    );
    let halo: u64 = set
        .manifest
        .info
        .iter()
        .map(|p| p.halo.iter().sum::<u64>())
        .sum();
    assert!(
        (r.replication_factor - (total_nodes + halo) as f64 / total_nodes as f64).abs() < 1e-12,
        "{}",
        r.replication_factor
    );
    assert!(r.replication_factor > 1.0, "a cut leaves halo nodes");
    assert_eq!(r.boundary_nodes.iter().sum::<u64>(), halo);
    for (t, nt) in g.node_types().iter().enumerate() {
        assert_eq!(r.balance[&nt.name], set.manifest.balance(|p| p.core[t]));
        assert_eq!(
            r.nodes.iter().map(|n| n[&nt.name]).sum::<u64>(),
            set.manifest
                .info
                .iter()
                .map(|p| p.core[t] + p.halo[t])
                .sum::<u64>()
        );
    }
    assert_eq!(
        r.edges.iter().sum::<u64>(),
        set.manifest.info.iter().map(|p| p.edges).sum::<u64>()
    );
    let weighted: f64 = g
        .node_types()
        .iter()
        .map(|nt| r.replication_by_type[&nt.name] * f64::from(nt.count))
        .sum();
    assert!(
        (weighted / total_nodes as f64 - r.replication_factor).abs() < 1e-9,
        "per-type factors weigh into the whole"
    );
    // One partition: nothing cut, nothing copied.
    let one =
        PartitionReport::of_nodes(&write(&g, tmp.path(), 1, Method::Random).manifest, &counts);
    assert_eq!(
        (
            one.edge_cut,
            one.replication_factor,
            one.boundary_nodes.clone()
        ),
        (0, 1.0, vec![0])
    );
    // Relation-assigning: nothing cut, nodes a relation touches copied to each holder.
    let out = tmp.path().join("meta");
    let gr = graphs::load(
        &tmp.path().join("g"),
        &LoadOptions {
            mmap_features: false,
            reverse_edges: true,
        },
    )
    .unwrap();
    let m = partition::meta::write(&gr, 2, 2, &out, false, &mut NoProgress).unwrap();
    let names = gr
        .node_types()
        .iter()
        .map(|t| (t.name.clone(), u64::from(t.count)))
        .collect();
    let edges = gr.relations().iter().map(|r| r.num_edges() as u64).sum();
    let mr = PartitionReport::of_relations(&m, &names, edges);
    assert_eq!(
        (mr.kind.as_str(), mr.edge_cut, mr.parts),
        ("relation-assigning", 0, 2)
    );
    let held: u64 = m.info.iter().map(|p| p.nodes.values().sum::<u64>()).sum();
    assert!((mr.replication_factor - held as f64 / total_nodes as f64).abs() < 1e-12);
    assert!(
        mr.replication_factor > 1.0,
        "every partition holds all target nodes"
    );
    assert_eq!(
        mr.boundary_nodes,
        m.info.iter().map(|p| p.boundary_nodes).collect::<Vec<_>>()
    );
    assert!(mr.balance.contains_key("edges") && mr.balance.values().all(|&b| b >= 1.0));
    // The report round-trips through report.json; a non-file is refused.
    mr.write(&out).unwrap();
    assert_eq!(PartitionReport::read(&out).unwrap(), mr);
    std::fs::create_dir_all(tmp.path().join("odd/report.json")).unwrap();
    let err = PartitionReport::read(&tmp.path().join("odd"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("report.json") && err.contains("regular file"),
        "{err}"
    );
}

/// Two 6-cliques joined by nothing, and 4 isolated nodes, as a graph directory.
fn two_cliques(dir: &Path) -> std::path::PathBuf {
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for base in [0u32, 6] {
        for a in 0..6 {
            for b in 0..6 {
                if a < b {
                    src.push(base + a);
                    dst.push(base + b);
                }
            }
        }
    }
    let n = 16u32;
    let g = graphs::GraphBuilder::new("cliques", "paper", 2)
        .node_type(
            "paper",
            n,
            Some(graphs::Features::from_vec(
                n as usize,
                1,
                vec![0.0; n as usize],
            )),
        )
        .labels(
            (0..n).map(|i| i64::from(i % 2)).collect(),
            graphs::Splits {
                train: (0..n).collect(),
                valid: vec![],
                test: vec![],
            },
        )
        .relation("paper", "cites", "paper", src, dst)
        .build()
        .unwrap();
    let out = dir.join("cliques");
    graphs::save(&g, &out, false).unwrap();
    out
}

#[test]
fn streaming_partitioners_read_edges_in_chunks_and_refuse_bad_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let g = mag(tmp.path());
    let gdir = tmp.path().join("g");
    // Degrees through the stream, chunk boundaries crossed often, equal the loaded graph's.
    let s = partition::stream::EdgeStream::open(&gdir)
        .unwrap()
        .with_chunk(7);
    let deg = s.degrees().unwrap();
    let mut want = vec![0u32; s.nodes() as usize];
    for r in g.relations() {
        let csr = r.in_csr();
        for d in 0..csr.num_rows() as u32 {
            for &u in csr.neighbors(d) {
                want[(s.base[r.src.index()] + u64::from(u)) as usize] += 1;
                want[(s.base[r.dst.index()] + u64::from(d)) as usize] += 1;
            }
        }
    }
    assert_eq!(deg, want);
    assert_eq!(
        s.edges() as usize,
        g.relations().iter().map(|r| r.num_edges()).sum::<usize>()
    );
    // An id out of range is named with its file and edge.
    let bad = two_cliques(&tmp.path().join("bad"));
    let mut ids: Vec<i64> = vec![0, 1, 2, 99];
    ids.extend([1, 2, 3, 4]);
    graphs::npy::write_i64(&bad.join("edges/paper__cites__paper.npy"), &[2, 4], &ids).unwrap();
    let mut schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bad.join("schema.json")).unwrap()).unwrap();
    schema["relations"][0]["count"] = 4.into();
    std::fs::write(bad.join("schema.json"), schema.to_string()).unwrap();
    let err = partition::stream::EdgeStream::open(&bad)
        .unwrap()
        .degrees()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("paper__cites__paper.npy") && err.contains("edge 3") && err.contains("99"),
        "{err}"
    );
}

#[test]
fn spring_keeps_cliques_whole_spreads_isolated_nodes_and_repeats_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = two_cliques(tmp.path());
    let s = partition::stream::EdgeStream::open(&dir)
        .unwrap()
        .with_chunk(4);
    let spring = partition::spring::Spring::default();
    let owners = spring.assign(&s, 2).unwrap().swap_remove(0);
    assert!(
        owners[..6].iter().all(|&o| o == owners[0])
            && owners[6..12].iter().all(|&o| o == owners[6]),
        "{owners:?}"
    );
    assert_ne!(
        owners[0], owners[6],
        "the two cliques are apart: {owners:?}"
    );
    let per: Vec<usize> = (0..2)
        .map(|p| owners.iter().filter(|&&o| o == p).count())
        .collect();
    assert_eq!(
        per,
        vec![8, 8],
        "the isolated nodes even the count: {owners:?}"
    );
    assert_eq!(
        spring.assign(&s, 2).unwrap()[0],
        owners,
        "the same input gives the same owners"
    );
    // On mag-like: every node owned, in range, deterministic, the node count balanced within beta.
    let g = mag(tmp.path());
    let s = partition::stream::EdgeStream::open(&tmp.path().join("g")).unwrap();
    let o = spring.assign(&s, 4).unwrap();
    assert_eq!(
        o.iter().map(Vec::len).collect::<Vec<_>>(),
        g.node_types()
            .iter()
            .map(|t| t.count as usize)
            .collect::<Vec<_>>()
    );
    let per: Vec<usize> = (0..4)
        .map(|p| o.iter().flatten().filter(|&&x| x == p).count())
        .collect();
    let mean = per.iter().sum::<usize>() as f64 / 4.0;
    assert!(
        per.iter().all(|&c| c as f64 <= 1.05 * mean),
        "node balance {per:?}"
    );
    assert_eq!(spring.assign(&s, 4).unwrap(), o);
    // Balancing every count: each type spread over the partitions, deterministic.
    let multi = partition::spring::Spring {
        balance: partition::spring::Balance::Multi,
        ..spring
    };
    let om = multi.assign(&s, 4).unwrap();
    assert_eq!(multi.assign(&s, 4).unwrap(), om);
    for (t, nt) in g.node_types().iter().enumerate() {
        let per: Vec<usize> = (0..4)
            .map(|p| om[t].iter().filter(|&&x| x == p).count())
            .collect();
        assert!(
            per.iter().filter(|&&c| c > 0).count() > 1,
            "{} all in one partition: {per:?}",
            nt.name
        );
    }
    // Restreaming refinement: fewer cut edges, the node bound kept, deterministic; nodes balance only.
    let cut = |o: &[Vec<u16>]| {
        let flat: Vec<u16> = o.iter().flatten().copied().collect();
        let mut c = 0usize;
        s.for_each(|ch| {
            c += ch
                .src
                .iter()
                .zip(ch.dst)
                .filter(|(&u, &v)| flat[u as usize] != flat[v as usize])
                .count();
            Ok(())
        })
        .unwrap();
        c
    };
    let refined = partition::spring::Spring {
        refine: 2,
        ..spring
    };
    let or = refined.assign(&s, 4).unwrap();
    assert!(
        cut(&or) < cut(&o),
        "refinement cuts fewer edges: {} against {}",
        cut(&or),
        cut(&o)
    );
    let per: Vec<usize> = (0..4)
        .map(|p| or.iter().flatten().filter(|&&x| x == p).count())
        .collect();
    let n: usize = per.iter().sum();
    assert!(
        per.iter().all(|&c| c as f64 <= 1.05 * n as f64 / 4.0 + 1.0),
        "node balance kept: {per:?}"
    );
    assert_eq!(refined.assign(&s, 4).unwrap(), or);
    assert!(partition::spring::Spring {
        refine: 1,
        balance: partition::spring::Balance::Multi,
        ..spring
    }
    .assign(&s, 4)
    .is_err());
    // The vertex-cut baselines: owners in range, deterministic, refused past 64 parts.
    for rule in [
        partition::vertex_cut::VertexCut::Hdrf,
        partition::vertex_cut::VertexCut::Dbh,
    ] {
        let a = partition::vertex_cut::assign(rule, &s, 4, 1).unwrap();
        assert!(a.iter().flatten().all(|&x| x < 4));
        assert_eq!(
            partition::vertex_cut::assign(rule, &s, 4, 1).unwrap(),
            a,
            "{rule:?}"
        );
        assert!(partition::vertex_cut::assign(rule, &s, 65, 1).is_err());
    }
    // Written like any other partitioning, so every mode trains on it.
    let a =
        partition::assign_streaming(&tmp.path().join("g"), 2, Method::Spring, 0, spring).unwrap();
    let out = tmp.path().join("spring2");
    partition::write(&g, &a, &out, false, &mut NoProgress).unwrap();
    let set = PartitionSet::open(&out).unwrap();
    assert_eq!(set.manifest.method, Method::Spring);
    assert_eq!(set.owners, a.owners);
}

/// `g` without its edge targets (the streaming writer does not carry them).
fn without_edge_targets(mut g: HetGraph) -> HetGraph {
    for r in 0..g.relations().len() {
        g.retain_edges(graphs::RelationId(r as u32), |_, _| true)
            .unwrap();
    }
    assert!(g.relations().iter().all(|r| r.targets().is_none()));
    g
}

#[test]
fn the_streaming_writer_writes_what_the_loading_writer_writes_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let g = without_edge_targets(mag(tmp.path()));
    let gdir = tmp.path().join("g");
    let spring = partition::assign_streaming(
        &gdir,
        3,
        Method::Spring,
        0,
        partition::spring::Spring::default(),
    )
    .unwrap();
    let metis = partition::assign(&g, 3, Method::Metis, 7).unwrap();
    for (name, a) in [("spring", spring), ("metis", metis)] {
        let (loaded, streamed) = (
            tmp.path().join(format!("{name}-loaded")),
            tmp.path().join(format!("{name}-streamed")),
        );
        let m1 = partition::write(&g, &a, &loaded, false, &mut NoProgress).unwrap();
        let m2 = partition::write_streaming(
            &gdir,
            &a,
            &streamed,
            &partition::WriteOptions::default(),
            &mut NoProgress,
        )
        .unwrap();
        assert_eq!(m1, m2, "{name}: manifests");
        let (f1, f2) = (read_all(&loaded), read_all(&streamed));
        assert_eq!(
            f1.iter().map(|f| &f.0).collect::<Vec<_>>(),
            f2.iter().map(|f| &f.0).collect::<Vec<_>>(),
            "{name}: file lists"
        );
        for ((path, bytes), (_, other)) in f1.iter().zip(&f2) {
            assert!(bytes == other, "{name}: {path} differs");
        }
    }
}

#[test]
fn halo_feature_rows_are_kept_on_request_by_both_writers_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let g = without_edge_targets(mag(tmp.path()));
    let gdir = tmp.path().join("g");
    let a = partition::assign(&g, 2, Method::Random, 3).unwrap();
    let opts = partition::WriteOptions {
        overwrite: false,
        halo_features: true,
        ..Default::default()
    };
    let (loaded, streamed) = (
        tmp.path().join("halo-loaded"),
        tmp.path().join("halo-streamed"),
    );
    let m = partition::write_with(&g, &a, &loaded, &opts, &mut NoProgress).unwrap();
    assert!(m.halo_features);
    partition::write_streaming(&gdir, &a, &streamed, &opts, &mut NoProgress).unwrap();
    assert_eq!(read_all(&loaded), read_all(&streamed));
    // A halo paper of partition 0 has its own features there; a node it never touches reads zeros.
    let set = PartitionSet::open(&loaded).unwrap();
    let p0 = set
        .load_part(
            0,
            &LoadOptions {
                mmap_features: false,
                reverse_edges: false,
            },
        )
        .unwrap();
    let t = g.type_id("paper").unwrap().index();
    let (whole, part) = (
        g.node_types()[t].features.as_ref().unwrap(),
        p0.node_types()[t].features.as_ref().unwrap(),
    );
    let mut halo_seen = 0;
    for v in 0..g.node_types()[t].count as usize {
        if set.owners[t][v] == 0 {
            assert_eq!(part.row(v), whole.row(v));
        } else if part.row(v) != whole.row(v) {
            assert!(
                part.row(v).iter().all(|&x| x == 0.0),
                "node {v}: a row is whole or absent"
            );
        } else {
            halo_seen += 1;
        }
    }
    assert!(
        halo_seen > 0 && halo_seen as u64 <= set.manifest.info[0].halo[t],
        "{halo_seen} halo rows kept"
    );
    let plain =
        partition::write(&g, &a, &tmp.path().join("plain"), false, &mut NoProgress).unwrap();
    assert!(!plain.halo_features);
}

/// Remote input rows of `epochs` epochs of training batches (fanouts 25,20,
/// batch 1024), each partition sampling the seeds it owns, as
/// `bench/src/bin/bytegnn_partition.rs` counts them.
fn remote_rows(g: &HetGraph, owners: &[Vec<u16>], parts: usize, epochs: u64) -> u64 {
    let t0 = g.target().index();
    let (_, splits) = g.target_labels();
    let mut sampler = Sampler::new(g, &[25, 20], 0).unwrap();
    let mut remote = 0;
    for e in 0..epochs {
        for (step, batch) in epoch_batches(&splits.train, 1024, 0, e)
            .into_iter()
            .enumerate()
        {
            for k in 0..parts as u16 {
                let share: Vec<u32> = batch
                    .iter()
                    .copied()
                    .filter(|&v| owners[t0][v as usize] == k)
                    .collect();
                if !share.is_empty() {
                    let mb = sampler.sample(e, step as u64, &share).unwrap();
                    remote += mb.blocks[0]
                        .src
                        .iter()
                        .enumerate()
                        .map(|(t, src)| {
                            src.iter().filter(|&&v| owners[t][v as usize] != k).count() as u64
                        })
                        .sum::<u64>();
                }
            }
        }
    }
    remote
}

#[test]
fn bytegnn_partitions_of_the_real_graphs_pull_at_most_ten_percent_more_rows_than_metis() {
    let Ok(root) = std::env::var("HETGNN_DATASETS") else {
        eprintln!("HETGNN_DATASETS is not set: skipping the real-graph partition quality check");
        return;
    };
    // Issue 24's target, over partitioner seeds 0-4 (a graph of 60-140
    // training nodes makes one batch per epoch: one seed is a small sample).
    for name in ["heco-acm", "planetoid-cora"] {
        let dir = Path::new(&root).join(name);
        let reverse = name != "planetoid-cora";
        let stored = graphs::load(
            &dir,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: false,
            },
        )
        .unwrap();
        let sampled = graphs::load(
            &dir,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: reverse,
            },
        )
        .unwrap();
        for parts in [2usize, 4] {
            let mut ratios = Vec::new();
            for seed in 0..5 {
                let mut opts = graphs::partition::bytegnn::ByteGnn::DEFAULT;
                opts.reverse = reverse;
                let b = graphs::partition::assign_two_level_with(
                    &stored,
                    parts,
                    1,
                    Method::Bytegnn,
                    &opts,
                    seed,
                )
                .unwrap();
                let m = partition::assign(&stored, parts, Method::Metis, seed).unwrap();
                ratios.push(
                    remote_rows(&sampled, &b.owners, parts, 20) as f64
                        / remote_rows(&sampled, &m.owners, parts, 20).max(1) as f64,
                );
            }
            let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
            eprintln!(
                "{name}, {parts} parts: bytegnn / METIS remote rows {ratios:.3?}, mean {mean:.3}"
            );
            assert!(mean <= 1.1, "{name}, {parts} parts: bytegnn pulls {mean:.3}x METIS's remote rows ({ratios:.3?})");
        }
    }
}

/// A copy of graph directory `gdir` at `copy`, the same name and shape,
/// one edge of `paper__cites__paper` changed: a graph of other content.
fn other_content(gdir: &Path, copy: &Path) -> std::path::PathBuf {
    for f in graphs::fingerprint::files(gdir).unwrap().keys() {
        std::fs::create_dir_all(copy.join(f).parent().unwrap()).unwrap();
        std::fs::copy(gdir.join(f), copy.join(f)).unwrap();
    }
    let cites = copy.join("edges/paper__cites__paper.npy");
    let mut bytes = std::fs::read(&cites).unwrap();
    let last = bytes.len() - 8;
    bytes[last] ^= 1;
    std::fs::write(&cites, bytes).unwrap();
    copy.to_path_buf()
}

#[test]
fn a_partition_directory_is_known_by_its_content() {
    let tmp = tempfile::tempdir().unwrap();
    let g = mag(tmp.path());
    let gdir = tmp.path().join("g");
    let write = |name: &str, seed: u64| {
        let out = tmp.path().join(name);
        let a = partition::assign(&g, 2, Method::Random, seed).unwrap();
        let opts = partition::WriteOptions {
            graph_sha256: Some(graphs::fingerprint::content(&gdir).unwrap()),
            ..Default::default()
        };
        partition::write_with(&g, &a, &out, &opts, &mut NoProgress).unwrap();
        out
    };
    let (one, two) = (write("one", 1), write("two", 2));
    PartitionSet::open_for(&one, Some(&gdir)).unwrap();
    // An owners file copied from another partitioning of the same graph.
    std::fs::copy(two.join("owners/paper.npy"), one.join("owners/paper.npy")).unwrap();
    let e = PartitionSet::open(&one).err().unwrap().to_string();
    assert!(
        e.contains("owners/paper.npy") && e.contains("differs"),
        "{e}"
    );
    // A manifest edited by hand.
    let m = two.join("manifest.json");
    let text = std::fs::read_to_string(&m).unwrap();
    assert!(text.contains("\"halo_features\": false"));
    std::fs::write(
        &m,
        text.replace("\"halo_features\": false", "\"halo_features\": true"),
    )
    .unwrap();
    let e = PartitionSet::open(&two).err().unwrap().to_string();
    assert!(e.contains("was edited"), "{e}");
    // Partitions of one graph named with another (same name, one relation changed).
    let three = write("three", 3);
    let copy = other_content(&gdir, &tmp.path().join("copy"));
    let e = PartitionSet::open_for(&three, Some(&copy))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("was cut from a graph whose content is"), "{e}");
    // A partition's own files are checked when that partition is loaded
    // (a node hashes only its own): the others still load.
    let four = write("four", 4);
    let edges = four.join("part1/edges/paper__cites__paper.npy");
    let mut bytes = std::fs::read(&edges).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&edges, bytes).unwrap();
    let set = PartitionSet::open(&four).unwrap();
    let opts = LoadOptions {
        mmap_features: true,
        reverse_edges: false,
    };
    let e = set.load_part(1, &opts).err().unwrap().to_string();
    assert!(
        e.contains("paper__cites__paper.npy") && e.contains("differs"),
        "{e}"
    );
    set.load_part(0, &opts).unwrap();
}

#[test]
fn a_meta_partition_directory_is_known_by_its_content() {
    let tmp = tempfile::tempdir().unwrap();
    mag(tmp.path());
    let gdir = tmp.path().join("g");
    let opts = LoadOptions {
        mmap_features: true,
        reverse_edges: true,
    };
    let g = graphs::load(&gdir, &opts).unwrap();
    let content = graphs::fingerprint::content(&gdir).unwrap();
    let write = |name: &str, layers: usize| {
        let out = tmp.path().join(name);
        let o = partition::meta::MetaOptions {
            layers,
            parts: 2,
            metapaths: None,
            graph_sha256: Some(&content),
            overwrite: false,
        };
        partition::meta::write_metapaths(&g, &o, &out, &mut NoProgress).unwrap();
        out
    };
    let (one, two) = (write("one", 2), write("two", 1));
    let set = partition::meta::MetaSet::open_for(&one, Some(&gdir)).unwrap();
    assert_eq!(set.manifest.graph_sha256.as_deref(), Some(content.as_str()));
    assert!(set.manifest.files.keys().any(|f| f.starts_with("part0/")));
    // A partition's file changed after it was written.
    let rel = set
        .manifest
        .files
        .keys()
        .find(|f| f.starts_with("part0/edges/"))
        .unwrap()
        .clone();
    let three = write("three", 2);
    let mut bytes = std::fs::read(three.join(&rel)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(three.join(&rel), bytes).unwrap();
    let e = partition::meta::MetaSet::open(&three)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains(&rel) && e.contains("differs"), "{e}");
    // A manifest edited by hand.
    let m = one.join("manifest.json");
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, text.replacen("\"load\": ", "\"load\": 1", 1)).unwrap();
    let e = partition::meta::MetaSet::open(&one)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("was edited"), "{e}");
    // Meta-partitions of one graph named with another of other content.
    let copy = other_content(&gdir, &tmp.path().join("copy"));
    let e = partition::meta::MetaSet::open_for(&two, Some(&copy))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("was cut from a graph whose content is"), "{e}");
}
