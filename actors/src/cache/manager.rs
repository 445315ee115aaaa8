//! Each device's cache manager as an addressable actor, `cache/<owner>`
//! (`cache/trainer/3`, `cache/worker/0`): it answers what the cache holds —
//! its budget and allocation, hit rates per node type, and the cached feature
//! rows themselves — to `doctor`, peers or tools, by name and from anywhere
//! in the cluster. Its owner (the trainer or worker using the device)
//! publishes a view when the cache is built and after every epoch; the rows
//! stay where they are, so training never waits on the manager's mailbox.
//! Learnable rows change every step on their owner's thread: the manager
//! reports them (allocation, hit rate) but serves feature rows only.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use actix::{Actor, Context, Handler, MessageResult};
use dashmap::DashMap;
use runtime::{ByteVec, Deliver, Msg};
use serde::{Deserialize, Serialize};

use super::{CacheTypeReport, DeviceCache, FeatureCache};
use crate::owner::messages::ServeError;

/// Most rows one [`CacheRows`] request may ask for.
pub const MAX_ROWS_ASKED: usize = 1 << 16;

/// The actor name of `owner`'s cache manager.
pub fn name(owner: &str) -> String {
    format!("cache/{owner}")
}

/// What a cache manager says of its cache.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheStatus {
    /// The trainer or worker whose device it is.
    pub owner: String,
    /// `miss-penalty`, `hotness` or `none`.
    pub policy: String,
    /// The budget (`training.cache_bytes`).
    pub budget_bytes: u64,
    /// Bytes the cached rows take.
    pub used_bytes: u64,
    /// Per node type: share, rows, hit rate, measured penalties.
    pub types: BTreeMap<String, CacheTypeReport>,
}

/// Asks a cache manager for its [`CacheStatus`]; `None` until its cache is built.
#[derive(Debug, Serialize, Deserialize)]
pub struct CacheQuery;

impl Msg for CacheQuery {
    type Reply = Option<CacheStatus>;
    const KIND: &'static str = "cache_status";
}

/// Asks a cache manager for the cached feature rows among `ids` of node type `ntype`.
#[derive(Debug, Serialize, Deserialize)]
pub struct CacheRows {
    /// The node type's name.
    pub ntype: String,
    /// Node ids (at most [`MAX_ROWS_ASKED`]).
    pub ids: Vec<u32>,
}

/// The cached rows among those asked for.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CachedRows {
    /// Row width.
    pub dim: u32,
    /// The ids asked for that are cached, in request order.
    pub ids: Vec<u32>,
    /// Their rows: little-endian f32, row-major.
    pub rows: ByteVec,
}

impl Msg for CacheRows {
    type Reply = Result<CachedRows, ServeError>;
    const KIND: &'static str = "cache_rows";
}

/// What the owner published: the figures, and the feature rows to serve.
struct Published {
    status: CacheStatus,
    features: Arc<FeatureCache>,
    /// Node type names, by index.
    types: Vec<String>,
}

/// A cache as its manager sees it: written by the owner, read by the manager.
#[derive(Default)]
pub struct CacheView {
    published: RwLock<Option<Published>>,
}

impl CacheView {
    /// Publishes `cache`'s current figures (owner `owner`, node type names `types`).
    pub fn publish(&self, owner: &str, policy: &str, types: &[String], cache: &DeviceCache) {
        let status = CacheStatus {
            owner: owner.to_string(),
            policy: policy.to_string(),
            budget_bytes: cache.budget(),
            used_bytes: cache.bytes(),
            types: cache.report(),
        };
        let p = Published {
            status,
            features: cache.features.clone(),
            types: types.to_vec(),
        };
        *self.published.write().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    /// The published figures, if any.
    pub fn status(&self) -> Option<CacheStatus> {
        self.published
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|p| p.status.clone())
    }

    /// The cached feature rows among `ids` of type `ntype`.
    pub fn rows(&self, ntype: &str, ids: &[u32]) -> Result<CachedRows, ServeError> {
        if ids.len() > MAX_ROWS_ASKED {
            return Err(ServeError::Refused(format!(
                "{} rows asked, at most {MAX_ROWS_ASKED} per request",
                ids.len()
            )));
        }
        let guard = self.published.read().unwrap_or_else(|e| e.into_inner());
        // Asked before the owner built its cache: the asker's bug, not the cache's.
        let p = guard
            .as_ref()
            .ok_or_else(|| ServeError::refused("no cache built yet"))?;
        let ty = p
            .types
            .iter()
            .position(|t| t == ntype)
            .ok_or_else(|| ServeError::Refused(format!("no node type {ntype:?}")))?;
        let Some(c) = p.features.get(ty) else {
            return Ok(CachedRows::default());
        };
        let (held, rows) = c.read(ids).map_err(ServeError::failed)?;
        Ok(CachedRows {
            dim: c.dim() as u32,
            ids: held,
            rows: ByteVec(bytemuck::cast_slice(&rows).to_vec()),
        })
    }
}

/// The node type names of `g`, by index.
pub fn type_names(g: &graphs::HetGraph) -> Vec<String> {
    g.node_types().iter().map(|nt| nt.name.clone()).collect()
}

/// The process's cache views by owner (each trainer or worker publishes into
/// its own; its manager actor reads it).
pub type CacheDirectory = DashMap<String, Arc<CacheView>>;

/// The cache manager of one device.
pub struct CacheManager(pub Arc<CacheView>);

impl Actor for CacheManager {
    type Context = Context<Self>;
}

impl Handler<Deliver<CacheQuery>> for CacheManager {
    type Result = MessageResult<Deliver<CacheQuery>>;
    fn handle(&mut self, _: Deliver<CacheQuery>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.0.status())
    }
}

impl Handler<Deliver<CacheRows>> for CacheManager {
    type Result = MessageResult<Deliver<CacheRows>>;
    fn handle(&mut self, m: Deliver<CacheRows>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.0.rows(&m.msg.ntype, &m.msg.ids))
    }
}

/// Starts `owner`'s cache manager on `node` and enters its view in `directory`.
pub fn serve(
    node: &runtime::Node,
    owner: &str,
    directory: &CacheDirectory,
) -> Result<Arc<CacheView>, runtime::WireError> {
    let view = directory.entry(owner.to_string()).or_default().clone();
    let addr = CacheManager(view.clone()).start();
    node.register(&name(owner), &addr)?
        .handle::<CacheQuery>()
        .handle::<CacheRows>();
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::hotness::Visits;
    use crate::cache::Candidate;
    use graphs::{Features, GraphBuilder, HetGraph, Splits};

    fn graph() -> HetGraph {
        let papers = 8u32;
        GraphBuilder::new("g", "paper", 2)
            .node_type(
                "paper",
                papers,
                Some(Features::from_vec(
                    papers as usize,
                    3,
                    (0..3 * papers).map(|i| i as f32).collect(),
                )),
            )
            .node_type("author", 4, None)
            .labels(
                (0..papers).map(|i| i64::from(i % 2)).collect(),
                Splits {
                    train: (0..papers).collect(),
                    valid: vec![],
                    test: vec![],
                },
            )
            .relation(
                "author",
                "writes",
                "paper",
                vec![0, 1, 2, 3],
                vec![0, 1, 2, 3],
            )
            .build()
            .unwrap()
    }

    #[test]
    fn a_manager_answers_its_status_and_cached_rows_by_name_and_refuses_oversized_asks() {
        let g = graph();
        let mut visits = Visits::new(&[8, 4]);
        visits.add(&[vec![6, 6, 2, 1], vec![]]);
        let paper = Candidate {
            ty: 0,
            learnable: false,
            dim: 3,
            miss: 2e-6,
            hit: 1e-6,
        };
        let feats = g.node_types()[0].features.as_ref().unwrap();
        let cache = DeviceCache::new(
            &g,
            1 << 10,
            &visits,
            vec![(paper, vec![6, 2])],
            &[],
            &candle_core::Device::Cpu,
            |_, ids| {
                Ok(ids
                    .iter()
                    .flat_map(|&v| feats.row(v as usize).to_vec())
                    .collect())
            },
        )
        .unwrap();
        let directory = CacheDirectory::default();
        let system = actix_rt::System::new();
        system.block_on(async {
            let node = runtime::Node::embedded("local").unwrap();
            let view = serve(&node, "trainer/0", &directory).unwrap();
            let me = node.actor(&name("trainer/0")).unwrap();
            assert_eq!(
                me.ask(CacheQuery, std::time::Duration::from_secs(5))
                    .await
                    .unwrap(),
                None,
                "nothing published yet"
            );
            let err = me
                .ask(
                    CacheRows {
                        ntype: "paper".into(),
                        ids: vec![6],
                    },
                    std::time::Duration::from_secs(5),
                )
                .await
                .unwrap()
                .unwrap_err();
            assert!(err.to_string().contains("no cache built yet"), "{err}");
            view.publish("trainer/0", "miss-penalty", &type_names(&g), &cache);
            let status = me
                .ask(CacheQuery, std::time::Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (
                    status.owner.as_str(),
                    status.policy.as_str(),
                    status.budget_bytes,
                    status.used_bytes
                ),
                ("trainer/0", "miss-penalty", 1 << 10, 24)
            );
            assert_eq!(status.types["paper"].rows, 2);
            // Rows 6 and 2 are cached; 5 is not and is left out; the order is the request's.
            let got = me
                .ask(
                    CacheRows {
                        ntype: "paper".into(),
                        ids: vec![2, 5, 6],
                    },
                    std::time::Duration::from_secs(5),
                )
                .await
                .unwrap()
                .unwrap();
            assert_eq!((got.dim, got.ids.clone()), (3, vec![2, 6]));
            let rows: Vec<f32> = bytemuck::cast_slice(&got.rows.0).to_vec();
            assert_eq!(rows, [feats.row(2), feats.row(6)].concat());
            let none = me
                .ask(
                    CacheRows {
                        ntype: "author".into(),
                        ids: vec![0],
                    },
                    std::time::Duration::from_secs(5),
                )
                .await
                .unwrap()
                .unwrap();
            assert!(none.ids.is_empty(), "author rows are not cached");
            let bad = me
                .ask(
                    CacheRows {
                        ntype: "venue".into(),
                        ids: vec![0],
                    },
                    std::time::Duration::from_secs(5),
                )
                .await
                .unwrap()
                .unwrap_err();
            assert!(bad.to_string().contains("no node type \"venue\""), "{bad}");
            let big = me
                .ask(
                    CacheRows {
                        ntype: "paper".into(),
                        ids: vec![0; MAX_ROWS_ASKED + 1],
                    },
                    std::time::Duration::from_secs(5),
                )
                .await
                .unwrap()
                .unwrap_err();
            assert!(big.to_string().contains("at most"), "{big}");
            node.shutdown().await;
        });
        assert!(directory.contains_key("trainer/0"));
    }
}
