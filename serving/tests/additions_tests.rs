//! Answers over a request's new nodes and edges equal the same inference on
//! the graph rebuilt with them (sampled: the same draws; exact: every
//! in-neighbour), and bad additions are refused with what to fix.

mod common;

use std::path::{Path, PathBuf};

use common::trained as trained_for;
use graphs::overlay::Overlay;
use graphs::RelationId;
use serving::additions::{self, Additions};
use serving::api::PredictRequest;
use serving::{Classified, Engine, Inference, Rows, Trained, Want};
use tables::results::NodeNames;

/// A mag-like graph and an R-GCN trained on it for one epoch, checkpointed.
fn trained(tmp: &Path) -> (PathBuf, PathBuf) {
    trained_for(tmp, &[])
}

/// The checkpoint `ck` loaded on the graph at `data` rebuilt with `add`
/// (the offline counterpart of answering over the additions).
fn rebuilt(data: &Path, ck: &Path, add: &Additions) -> Trained {
    let (other, _) = Trained::open(ck, data).unwrap();
    let graph = Overlay::new(&other.graph, add.added.clone(), &add.edges)
        .unwrap()
        .rebuilt(&add.features)
        .unwrap();
    let names = graph
        .node_types()
        .iter()
        .map(|t| NodeNames::load(data, &t.name, t.count).unwrap())
        .collect();
    Trained {
        graph: graph.into(),
        names,
        ..other
    }
}

fn rel(g: &graphs::HetGraph, canonical: &str) -> RelationId {
    g.relation_id(canonical).unwrap()
}

fn close(a: &Rows, b: &Rows, tol: f32, what: &str) {
    assert_eq!(a.width, b.width, "{what}");
    assert_eq!(a.data.len(), b.data.len(), "{what}");
    for (i, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
        assert!((x - y).abs() <= tol, "{what}[{i}]: {x} vs {y}");
    }
}

fn same(a: &Classified, b: &Classified, tol: f32, what: &str) {
    assert_eq!(a.classes, b.classes, "{what}");
    close(
        a.probabilities.as_ref().unwrap(),
        b.probabilities.as_ref().unwrap(),
        tol,
        what,
    );
    close(
        a.embeddings.as_ref().unwrap(),
        b.embeddings.as_ref().unwrap(),
        tol,
        what,
    );
}

#[test]
fn new_nodes_are_answered_as_on_the_rebuilt_graph() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ck) = trained(tmp.path());
    for (inference, tol) in [(Inference::Sampled, 1e-6), (Inference::Exact, 1e-4)] {
        let (tr, _) = Trained::open(&ck, &data).unwrap();
        let g = &tr.graph;
        let paper = g.target();
        let papers = g.node_type(paper).count;
        let dim = g.node_type(paper).features.as_ref().unwrap().dim();
        let mut added = vec![0; g.node_types().len()];
        added[paper.index()] = 2;
        let mut features: Vec<Option<Vec<f32>>> = g
            .node_types()
            .iter()
            .map(|t| t.features.as_ref().map(|_| Vec::new()))
            .collect();
        features[paper.index()] = Some(
            (0..2 * dim)
                .map(|i| ((i * 7) % 11) as f32 / 5.0 - 1.0)
                .collect(),
        );
        let (cites, writes) = (
            rel(g, "paper__cites__paper"),
            rel(g, "author__writes__paper"),
        );
        let (n0, n1) = (papers, papers + 1);
        let edges = vec![
            (cites, n0, 3),
            (cites, 5, n0),
            (cites, n1, n0),
            (writes, 2, n1),
            (writes, 2, 7),
        ];
        let add = Additions {
            added,
            features,
            edges,
        };
        // The offline counterpart: the same checkpoint on the graph rebuilt with the additions.
        let offline = rebuilt(&data, &ck, &add);
        let ours = Engine::new(tr, inference, 64, |_, _, _| {}).unwrap();
        let theirs = Engine::new(offline, inference, 64, |_, _, _| {}).unwrap();
        let want = Want {
            probabilities: true,
            embeddings: true,
        };
        let nodes = [n1, 7, n0, 7, 0, 3];
        let a = ours.classify_with(&add, &nodes, want).unwrap();
        let b = theirs.classify(&nodes, want).unwrap();
        same(&a, &b, tol, &format!("{inference} classify"));
        assert_eq!(a.classes.len(), nodes.len());
        // Embeddings of the target type (and, exact, of the types the new edges reach).
        let e = ours.embed_with(&add, paper, &[n0, 7]).unwrap();
        close(
            &e,
            &theirs.embed(paper, &[n0, 7]).unwrap(),
            tol,
            &format!("{inference} embed"),
        );
        if inference == Inference::Exact {
            let author = ours.trained().graph.type_id("author").unwrap();
            close(
                &ours.embed_with(&add, author, &[2, 0]).unwrap(),
                &theirs.embed(author, &[2, 0]).unwrap(),
                tol,
                "exact author embed",
            );
        } else {
            let author = ours.trained().graph.type_id("author").unwrap();
            let e = ours.embed_with(&add, author, &[2]).unwrap_err();
            assert!(e.to_string().contains("exact inference"), "{e}");
        }
        // Nothing added: the stored graph's answers.
        let plain = ours.classify(&[0, 3], want).unwrap();
        let none = Additions {
            added: vec![0; ours.trained().graph.node_types().len()],
            ..Additions::default()
        };
        assert_eq!(ours.classify_with(&none, &[0, 3], want).unwrap(), plain);
        // A node past the new ones is refused.
        let e = ours.classify_with(&add, &[papers + 2], want).unwrap_err();
        assert_eq!(e.status(), 404, "{e}");
    }
}

#[test]
fn edges_touching_new_nodes_are_scored_as_on_the_rebuilt_graph() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ck) = trained_for(
        tmp.path(),
        &[
            "training.task=\"edge-classification\"",
            "training.target_relations=\"author__writes__paper\"",
        ],
    );
    let (tr, _) = Trained::open(&ck, &data).unwrap();
    let g = &tr.graph;
    let paper = g.target();
    let papers = g.node_type(paper).count;
    let dim = g.node_type(paper).features.as_ref().unwrap().dim();
    let mut added = vec![0; g.node_types().len()];
    added[paper.index()] = 1;
    let mut features: Vec<Option<Vec<f32>>> = g
        .node_types()
        .iter()
        .map(|t| t.features.as_ref().map(|_| Vec::new()))
        .collect();
    features[paper.index()] = Some((0..dim).map(|i| (i % 5) as f32 / 4.0).collect());
    let (cites, writes) = (
        rel(g, "paper__cites__paper"),
        rel(g, "author__writes__paper"),
    );
    let edges = vec![(cites, papers, 3), (writes, 2, papers), (writes, 4, 9)];
    let add = Additions {
        added,
        features,
        edges,
    };
    let offline = rebuilt(&data, &ck, &add);
    let ours = Engine::new(tr, Inference::Exact, 64, |_, _, _| {}).unwrap();
    let theirs = Engine::new(offline, Inference::Exact, 64, |_, _, _| {}).unwrap();
    let (src, dst) = ([2, 4, 2, 0], [papers, 9, 7, papers]);
    let a = ours
        .score_edges_with(&add, writes, &src, &dst, true)
        .unwrap();
    let b = theirs.score_edges(writes, &src, &dst, true).unwrap();
    assert_eq!(a.classes, b.classes);
    close(
        a.probabilities.as_ref().unwrap(),
        b.probabilities.as_ref().unwrap(),
        1e-4,
        "edge probabilities",
    );
    // Sampled inference scores no edges, with or without additions.
    let (tr, _) = Trained::open(&ck, &data).unwrap();
    let sampled = Engine::new(tr, Inference::Sampled, 64, |_, _, _| {}).unwrap();
    let e = sampled
        .score_edges_with(&add, writes, &src, &dst, false)
        .unwrap_err();
    assert!(e.to_string().contains("--inference exact"), "{e}");
}

fn request(json: &str) -> PredictRequest {
    serde_json::from_str(json).unwrap()
}

#[test]
fn bad_additions_are_refused_with_what_to_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ck) = trained(tmp.path());
    let (tr, _) = Trained::open(&ck, &data).unwrap();
    let papers = tr.graph.node_type(tr.graph.target()).count;
    let dim = tr
        .graph
        .node_type(tr.graph.target())
        .features
        .as_ref()
        .unwrap()
        .dim();
    let row = serde_json::to_string(&vec![0.5f32; dim]).unwrap();
    let refused = |json: String| {
        let r = request(&json);
        additions::resolve(&tr, &r.new_nodes, &r.new_edges, 4, 4)
            .expect_err("refused")
            .to_string()
    };
    let node = |id: &str, extra: &str| {
        format!(r#"{{"type": "paper", "id": {id}, "features": {row}{extra}}}"#)
    };
    let cases = [
        (
            r#"{"ids": [0], "new_nodes": [{"type": "author", "id": "a", "features": [1]}]}"#
                .to_string(),
            "no features",
        ),
        (
            format!(r#"{{"ids": [0], "new_nodes": [{}]}}"#, node("3", "")),
            "already a node",
        ),
        (
            format!(
                r#"{{"ids": [0], "new_nodes": [{}, {}]}}"#,
                node("\"x\"", ""),
                node("\"x\"", "")
            ),
            "listed twice",
        ),
        (
            r#"{"ids": [0], "new_nodes": [{"type": "paper", "id": "x", "features": [1, 2]}]}"#
                .into(),
            "feature values",
        ),
        (
            r#"{"ids": [0], "new_nodes": [{"type": "paper", "id": "x", "columns": {"year": 3}}]}"#
                .into(),
            "not imported from tables",
        ),
        (
            r#"{"ids": [0], "new_nodes": [{"type": "paper", "id": "x"}]}"#.into(),
            "give its `features`",
        ),
        (
            r#"{"ids": [0], "new_nodes": [{"type": "venue", "id": "x"}]}"#.into(),
            "unknown node type",
        ),
        (
            format!(
                r#"{{"ids": [0], "new_nodes": [{}], "new_edges": [{{"relation": "befriends", "src": "x", "dst": 0}}]}}"#,
                node("\"x\"", "")
            ),
            "unknown relation",
        ),
        (
            format!(
                r#"{{"ids": [0], "new_nodes": [{}], "new_edges": [{{"relation": "rev_cites", "src": "x", "dst": 0}}]}}"#,
                node("\"x\"", "")
            ),
            "reverse relation",
        ),
        (
            format!(
                r#"{{"ids": [0], "new_nodes": [{}], "new_edges": [{{"relation": "cites", "src": "y", "dst": 0}}]}}"#,
                node("\"x\"", "")
            ),
            "neither a new node",
        ),
        (
            format!(
                r#"{{"ids": [0], "new_nodes": [{}, {}, {}, {}, {}]}}"#,
                node("\"a\"", ""),
                node("\"b\"", ""),
                node("\"c\"", ""),
                node("\"d\"", ""),
                node("\"e\"", "")
            ),
            "at most 4",
        ),
    ];
    for (json, want) in cases {
        let e = refused(json.clone());
        assert!(e.contains(want), "{json}: {e}");
    }
    // Accepted: a new node by a string id, named in `ids`, an edge by its bare name.
    let r = request(&format!(
        r#"{{"ids": ["x", 1], "new_nodes": [{}], "new_edges": [{{"relation": "cites", "src": "x", "dst": 1}}]}}"#,
        node("\"x\"", "")
    ));
    let resolved = additions::resolve(&tr, &r.new_nodes, &r.new_edges, 4, 4).unwrap();
    let t = tr.graph.target();
    assert_eq!(resolved.dense(&tr, t, &r.ids).unwrap(), vec![papers, 1]);
    let cites = tr.graph.relation_id("paper__cites__paper").unwrap();
    assert_eq!(resolved.additions.edges, vec![(cites, papers, 1)]);
    assert_eq!(resolved.additions.added[t.index()], 1);
    // An unknown id among `ids` is still refused.
    let r = request(&format!(
        r#"{{"ids": ["y"], "new_nodes": [{}]}}"#,
        node("\"x\"", "")
    ));
    let resolved = additions::resolve(&tr, &r.new_nodes, &r.new_edges, 4, 4).unwrap();
    assert!(resolved.dense(&tr, t, &r.ids).is_err());
}
