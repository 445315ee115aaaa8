//! The request decoder on arbitrary input: every body either decodes or is
//! refused with an error, never a panic, and decoded ids resolve or are
//! refused as unknown, naming at most five.

use proptest::prelude::*;
use serving::api::{resolve, EmbedRequest, Id, PredictRequest};
use serving::ServeError;
use tables::results::NodeNames;

fn names(count: u32) -> (tempfile::TempDir, NodeNames) {
    // A directory without an import record: nodes are named by dense ids.
    let dir = tempfile::tempdir().unwrap();
    let n = NodeNames::load(dir.path(), "paper", count).unwrap();
    (dir, n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = serde_json::from_slice::<PredictRequest>(&body);
        let _ = serde_json::from_slice::<EmbedRequest>(&body);
    }

    #[test]
    fn json_shaped_bodies_decode_or_refuse(
        ids in proptest::collection::vec(prop_oneof![
            any::<i64>().prop_map(|v| v.to_string()),
            "[a-z0-9\\\\\"]{0,6}".prop_map(|s| format!("{s:?}")),
            Just("1.5".to_string()), Just("null".to_string()), Just("[]".to_string()),
        ], 0..20),
        extra in prop_oneof![Just(""), Just(", \"probabilities\": true"), Just(", \"x\": 1"), Just(", \"type\": 3")],
    ) {
        let body = format!("{{\"ids\": [{}]{extra}}}", ids.join(","));
        match serde_json::from_str::<PredictRequest>(&body) {
            Ok(r) => {
                prop_assert_eq!(r.ids.len(), ids.len());
                prop_assert!(extra.is_empty() || extra.contains("probabilities"));
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn ids_resolve_or_are_refused_as_unknown(
        ids in proptest::collection::vec(prop_oneof![
            (-5i64..120).prop_map(Id::Int),
            "[0-9a-z]{0,4}".prop_map(Id::Text),
        ], 1..40),
    ) {
        let (_dir, n) = names(100);
        let known = |id: &Id| matches!(id, Id::Int(v) if (0..100).contains(v));
        match resolve(&n, "paper", &ids) {
            Ok(dense) => {
                prop_assert!(ids.iter().all(known));
                let want: Vec<u32> = ids.iter().map(|id| match id { Id::Int(v) => *v as u32, Id::Text(_) => unreachable!() }).collect();
                prop_assert_eq!(dense, want);
            }
            Err(ServeError::UnknownNodes(m)) => {
                let bad = ids.iter().filter(|i| !known(i)).count();
                prop_assert!(bad > 0);
                let count = format!("{bad} id(s)");
                prop_assert!(m.starts_with(&count), "{}", m);
                if bad > 5 {
                    let more = format!("and {} more", bad - 5);
                    prop_assert!(m.contains(&more), "{}", m);
                }
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }
}
