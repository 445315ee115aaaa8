//! The Sampler actor of a partition: answers owner-compute sampling requests
//! for the nodes it owns, with the requester's keys, so the picks are those a
//! whole-graph sampler would make.

use std::sync::Arc;

use actix::{Actor, AsyncContext, Context, Handler, ResponseFuture};
use graphs::link::{Batching, ExcludeEdges, NoExclusion};
use graphs::{HetGraph, NodeTypeId, RelationFilter, RelationPicks, Sampler};
use runtime::Deliver;

use super::messages::{SampleReq, ServeError};
use super::priority::{Parked, Serve};

/// Most destination nodes one request may name.
pub const MAX_NODES: usize = 1 << 24;
/// Largest fanout accepted.
pub const MAX_FANOUT: u32 = 1 << 16;

/// Sampler of one partition.
pub struct SamplerActor {
    part: u16,
    graph: Arc<HetGraph>,
    owners: Arc<Vec<Vec<u16>>>,
    /// Edge-level tasks: which edges a step leaves out of its neighbourhoods.
    steps: Option<Batching>,
    /// Requests waiting to be served.
    parked: Parked<SampleReq, Answer>,
}

impl SamplerActor {
    /// The sampler of partition `part`.
    pub fn new(
        part: u16,
        graph: Arc<HetGraph>,
        owners: Arc<Vec<Vec<u16>>>,
        steps: Option<Batching>,
    ) -> SamplerActor {
        SamplerActor {
            part,
            graph,
            owners,
            steps,
            parked: Parked::default(),
        }
    }

    fn answer(&self, r: &SampleReq) -> Result<Vec<Vec<RelationPicks>>, ServeError> {
        let g = &*self.graph;
        if r.nodes.len() != g.node_types().len() {
            return Err(ServeError::Refused(format!(
                "nodes for {} types, the graph has {}",
                r.nodes.len(),
                g.node_types().len()
            )));
        }
        if r.fanout == 0 || r.fanout > MAX_FANOUT || r.layer as usize >= 64 {
            return Err(ServeError::Refused(format!(
                "fanout {} or layer {} out of range",
                r.fanout, r.layer
            )));
        }
        if r.nodes.iter().map(Vec::len).sum::<usize>() > MAX_NODES {
            return Err(ServeError::Refused(format!(
                "more than {MAX_NODES} nodes in one request"
            )));
        }
        let mut sampler =
            Sampler::new(g, &[r.fanout as usize], r.seed).map_err(ServeError::refused)?;
        let step_edges = match (&self.steps, r.exclude) {
            (Some(b), true) => Some(b.exclusion(r.epoch, r.step)),
            (None, true) => return Err(ServeError::refused(
                "asked to leave a step's training edges out, in a run without an edge-level task",
            )),
            (_, false) => None,
        };
        let excluded: &dyn ExcludeEdges = match &step_edges {
            Some(x) => x,
            None => &NoExclusion,
        };
        let mut out = Vec::with_capacity(r.nodes.len());
        for (t, nodes) in r.nodes.iter().enumerate() {
            for &v in nodes {
                if self.owners[t].get(v as usize) != Some(&self.part) {
                    return Err(ServeError::Refused(format!(
                        "node {v} of type {t} is not owned by partition {}",
                        self.part
                    )));
                }
            }
            let picks = if nodes.is_empty() {
                Vec::new()
            } else {
                sampler
                    .pick(
                        r.epoch,
                        r.step,
                        r.layer as usize,
                        r.fanout as usize,
                        NodeTypeId(t as u32),
                        nodes,
                        &RelationFilter::All,
                        excluded,
                    )
                    .map_err(ServeError::refused)?
            };
            out.push(picks);
        }
        Ok(out)
    }
}

impl Actor for SamplerActor {
    type Context = Context<Self>;
}

/// The answer to a sampling request.
type Answer = Result<Vec<Vec<RelationPicks>>, ServeError>;

impl Handler<Deliver<SampleReq>> for SamplerActor {
    type Result = ResponseFuture<Answer>;
    /// Parked and served by priority (see [`super::priority`]).
    fn handle(&mut self, m: Deliver<SampleReq>, ctx: &mut Context<Self>) -> Self::Result {
        let rx = self.parked.park(m.msg.priority, m.msg);
        ctx.notify(Serve);
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(ServeError::Stopped(
                    "the sampler stopped before it answered".into(),
                ))
            })
        })
    }
}

impl Handler<Serve> for SamplerActor {
    type Result = ();
    fn handle(&mut self, _: Serve, _: &mut Context<Self>) {
        let mut parked = std::mem::take(&mut self.parked);
        parked.serve_one(|r| self.answer(&r));
        self.parked = parked;
    }
}
