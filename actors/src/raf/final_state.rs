//! The trained model of a raf run: each worker's final state (the
//! parameters and tables it holds), sent to the coordinator in pieces by the
//! workers of other nodes, gathered there, and assembled into one model.

use std::collections::BTreeSet;
use std::time::Duration;

use candle_core::{DType, Tensor};
use graphs::HetGraph;
use runtime::{ByteVec, Node};

use super::messages::{self, Final, FinalState};
use super::names;
use super::worker::WorkerResult;
use crate::config::TrainingConfig;
use crate::distributed::inbox::Inbox;
use crate::distributed::Timeouts;
use crate::error::{Result, TrainError};

/// A worker's final state, for the coordinator.
pub(crate) fn final_state(r: &WorkerResult) -> Result<FinalState> {
    let params = r
        .model
        .params
        .iter()
        .filter(|(n, _)| r.held.contains(*n))
        .map(|(n, v)| {
            Ok((
                n.to_string(),
                v.as_tensor()
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            ))
        })
        .collect::<Result<_>>()?;
    let tables = r
        .model
        .embeddings
        .iter()
        .enumerate()
        .filter_map(|(ty, e)| e.as_ref().map(|e| (ty as u32, 0, e.data.clone())))
        .collect();
    Ok(FinalState { params, tables })
}

/// Sends this worker's final state to the coordinator (cluster runs): the
/// parameters first, then the tables in pieces of at most [`messages::FINAL_PIECE`] values.
pub(crate) fn send_final(
    node: &Node,
    handle: &tokio::runtime::Handle,
    inbox: &Inbox,
    worker: u32,
    gen: u64,
    r: &WorkerResult,
    timeout: Duration,
) -> Result<()> {
    let FinalState { params, tables } = final_state(r)?;
    let mut pieces = vec![FinalState {
        params,
        tables: Vec::new(),
    }];
    for (ty, _, data) in tables {
        for (i, chunk) in data.chunks(messages::FINAL_PIECE).enumerate() {
            pieces.push(FinalState {
                params: Vec::new(),
                tables: vec![(ty, (i * messages::FINAL_PIECE) as u64, chunk.to_vec())],
            });
        }
    }
    let me = runtime::ActorName::new(&names::worker(worker)).map_err(TrainError::internal)?;
    let to = node
        .actor(names::FINAL)
        .map_err(TrainError::internal)?
        .with_sender(me);
    let total = pieces.len() as u32;
    for (i, state) in pieces.into_iter().enumerate() {
        let data = messages::encode(&messages::FinalPiece {
            pieces: total,
            state,
        })?;
        let ask = to.ask(
            Final {
                gen,
                seq: i as u64,
                from: worker,
                data: ByteVec(data),
            },
            timeout,
        );
        // The coordinator may say the run is over (it has everything) before the last answer.
        inbox
            .block_on(handle, ask)?
            .map_err(TrainError::peer_lost)?;
    }
    Ok(())
}

/// The whole model from the workers' final states: each parameter from its
/// first holder, each table from its first holder (untouched ones at their
/// initial values), on a model built on `g`.
pub(crate) fn assemble(
    t: &TrainingConfig,
    g: &HetGraph,
    states: &[FinalState],
) -> Result<models::Model> {
    let model = models::Model::new(&t.model_spec(), g, DType::F32, &candle_core::Device::Cpu)?;
    let mut model = model;
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut tables_done: BTreeSet<usize> = BTreeSet::new();
    for (w, st) in states.iter().enumerate() {
        // Each table this worker sent: its pieces in order, together whole.
        let mut next: std::collections::BTreeMap<usize, u64> = std::collections::BTreeMap::new();
        for (name, values) in &st.params {
            if done.contains(name) {
                continue;
            }
            let var = model.params.get(name).ok_or_else(|| {
                TrainError::Protocol(format!("worker {w} sent unknown parameter {name}"))
            })?;
            if var.elem_count() != values.len() {
                return Err(TrainError::Protocol(format!(
                    "worker {w} sent {} values for {name} ({} expected)",
                    values.len(),
                    var.elem_count()
                )));
            }
            var.set(&Tensor::from_slice(values, var.shape(), var.device())?)?;
            done.insert(name.clone());
        }
        for (ty, at, rows) in &st.tables {
            let ty = *ty as usize;
            if tables_done.contains(&ty) {
                continue;
            }
            let e = model
                .embeddings
                .get_mut(ty)
                .and_then(Option::as_mut)
                .ok_or_else(|| {
                    TrainError::Protocol(format!(
                        "worker {w} sent a table for type {ty}, which has none"
                    ))
                })?;
            let from = next.get(&ty).copied().unwrap_or(0);
            let to = from as usize + rows.len();
            if *at != from || to > e.data.len() {
                return Err(TrainError::Protocol(format!(
                    "worker {w} sent values {at}..{} of {} where {from}.. were due ({} in all)",
                    *at as usize + rows.len(),
                    e.name,
                    e.data.len()
                )));
            }
            e.data[from as usize..to].copy_from_slice(rows);
            next.insert(ty, to as u64);
        }
        for (ty, end) in next {
            let len = model.embeddings[ty].as_ref().map_or(0, |e| e.data.len());
            if end as usize != len {
                return Err(TrainError::Protocol(format!(
                    "worker {w} sent {end} of the {len} values of node type {ty}'s table"
                )));
            }
            tables_done.insert(ty);
        }
    }
    Ok(model)
}

/// Worker `k`'s final state, gathered piece by piece (piece 0 says how many follow).
pub(crate) fn gather_final(coord: &Inbox, k: u32, timeouts: Timeouts) -> Result<FinalState> {
    let mut state = FinalState::default();
    let mut pieces = 1;
    let mut i = 0u32;
    while i < pieces {
        let bytes = coord
            .raw(
                "a worker's final state",
                u64::from(i),
                messages::round::FINAL,
                &[k],
                timeouts.step,
            )?
            .swap_remove(0);
        let p: messages::FinalPiece =
            messages::decode(&bytes).map_err(|e| e.context(format!("worker {k}'s final state")))?;
        if i == 0 {
            pieces = p.pieces.max(1);
        }
        state.params.extend(p.state.params);
        state.tables.extend(p.state.tables);
        i += 1;
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TrainingConfig;
    use graphs::graph::GraphBuilder;
    use graphs::{Features, Splits};

    fn graph() -> HetGraph {
        let (papers, authors) = (20u32, 30u32);
        GraphBuilder::new("g", "paper", 2)
            .node_type(
                "paper",
                papers,
                Some(Features::from_vec(
                    papers as usize,
                    2,
                    vec![0.5; 2 * papers as usize],
                )),
            )
            .node_type("author", authors, None)
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
                (0..40).map(|i| i % authors).collect(),
                (0..40).map(|i| i % papers).collect(),
            )
            .build()
            .unwrap()
    }

    #[test]
    fn final_states_in_pieces_assemble_whole_tables_and_gaps_are_refused() {
        let g = graph();
        let t = TrainingConfig {
            hidden: 4,
            embed_dim: 3,
            ..TrainingConfig::default()
        };
        let rows: Vec<f32> = (0..90).map(|i| i as f32).collect();
        let author = g.type_id("author").unwrap().index() as u32;
        let pieces = |cuts: &[(u64, usize, usize)]| FinalState {
            params: Vec::new(),
            tables: cuts
                .iter()
                .map(|&(at, a, b)| (author, at, rows[a..b].to_vec()))
                .collect(),
        };
        let m = assemble(&t, &g, &[pieces(&[(0, 0, 40), (40, 40, 41), (41, 41, 90)])]).unwrap();
        assert_eq!(m.embeddings[author as usize].as_ref().unwrap().data, rows);
        let gap = assemble(&t, &g, &[pieces(&[(0, 0, 40), (41, 41, 90)])])
            .unwrap_err()
            .to_string();
        assert!(gap.contains("where 40.. were due"), "{gap}");
        let short = assemble(&t, &g, &[pieces(&[(0, 0, 40)])])
            .unwrap_err()
            .to_string();
        assert!(short.contains("40 of the 90 values"), "{short}");
    }
}
