//! FeatureStore (partition × node type): serves the rows its partition owns,
//! plain features or learnable embeddings; for the latter it owns the rows'
//! Adam state and applies the update once every trainer has pushed its
//! gradient for the step. It writes its own rows into checkpoints and
//! restores them when a generation of the run starts from one.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use actix::{Actor, AsyncContext, Context, Handler, MessageResult, ResponseFuture};
use graphs::HetGraph;
use models::embedding::{adam_rows, RowsMut};
use models::optim::AdamConfig;
use runtime::{ByteVec, Deliver, SharedBytes};

use super::messages::{Export, Pull, Push, Reset, Save, ServeError};
use super::priority::{Parked, Serve};
use crate::distributed::{checkpoint, decode_f32};

/// Most rows one pull or push may name (a mini-batch's input rows are far fewer).
pub const MAX_ROWS: usize = 1 << 24;

/// One trainer's push: the rows (positions in this shard) and their gradients.
type Pushed = (Vec<u32>, Vec<f32>);

/// Learnable rows owned by one store, with their Adam state.
pub struct Shard {
    /// Owned global ids, ascending.
    pub ids: Vec<u32>,
    seed: u64,
    name: String,
    count: usize,
    dim: usize,
    data: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    steps: Vec<u32>,
    adam: AdamConfig,
    trainers: usize,
    pending: BTreeMap<u64, Vec<Option<Pushed>>>,
    applied: Option<u64>,
    /// Per owned row, its slot in the step's gradient sum (`u32::MAX`: none).
    slot: Vec<u32>,
    /// The rows a fine-tuned run starts from (`training.init_from`), instead of drawn ones.
    start: Option<Arc<Vec<f32>>>,
    /// Its rows stay as they start (`training.freeze`): pushes complete steps but change nothing.
    frozen: bool,
}

impl Shard {
    /// The rows of `owned` (ascending) of the table a single process would
    /// initialise for (seed, name): the same values, row for row.
    pub fn new(
        seed: u64,
        name: &str,
        count: usize,
        dim: usize,
        owned: Vec<u32>,
        adam: AdamConfig,
        trainers: usize,
    ) -> Shard {
        let data = models::init::normal_rows(seed, name, dim, &owned);
        let n = owned.len();
        Shard {
            ids: owned,
            seed,
            name: name.to_string(),
            count,
            dim,
            data,
            m: vec![0.0; n * dim],
            v: vec![0.0; n * dim],
            steps: vec![0; n],
            adam,
            trainers,
            pending: BTreeMap::new(),
            applied: None,
            slot: vec![u32::MAX; n],
            start: None,
            frozen: false,
        }
    }

    /// The shard starting from `rows` (its owned rows, as another run left
    /// them) and, when `frozen`, keeping them.
    pub fn starting_from(mut self, rows: Vec<f32>, frozen: bool) -> Shard {
        debug_assert_eq!(rows.len(), self.data.len());
        self.data.clone_from(&rows);
        self.start = Some(Arc::new(rows));
        self.frozen = frozen;
        self
    }

    /// The shard as it was before training.
    fn initial(&self) -> Shard {
        let mut s = Shard::new(
            self.seed,
            &self.name,
            self.count,
            self.dim,
            self.ids.clone(),
            self.adam,
            self.trainers,
        );
        if let Some(rows) = &self.start {
            s.data.clone_from(rows);
        }
        (s.start, s.frozen) = (self.start.clone(), self.frozen);
        s
    }

    /// Its rows and their Adam state, for a checkpoint.
    fn tensors(&self) -> candle_core::Result<HashMap<String, Tensor>> {
        let (n, d, cpu) = (self.ids.len(), self.dim, &Device::Cpu);
        Ok(HashMap::from([
            ("ids".to_string(), Tensor::from_slice(&self.ids, n, cpu)?),
            (
                "data".to_string(),
                Tensor::from_slice(&self.data, (n, d), cpu)?,
            ),
            ("m".to_string(), Tensor::from_slice(&self.m, (n, d), cpu)?),
            ("v".to_string(), Tensor::from_slice(&self.v, (n, d), cpu)?),
            (
                "steps".to_string(),
                Tensor::from_slice(&self.steps, n, cpu)?,
            ),
        ]))
    }

    /// Takes rows and Adam state from checkpoint tensors, which must hold
    /// exactly this shard's rows; `applied`: the last step they include.
    fn restore(
        &mut self,
        mut t: HashMap<String, Tensor>,
        applied: Option<u64>,
    ) -> Result<(), ServeError> {
        let mut take = |k: &str| {
            t.remove(k)
                .ok_or_else(|| ServeError::Failed(format!("tensor '{k}' is missing")))
        };
        let (ids, data, m, v, steps) = (
            take("ids")?,
            take("data")?,
            take("m")?,
            take("v")?,
            take("steps")?,
        );
        let e = ServeError::failed;
        let ids: Vec<u32> = ids.to_vec1().map_err(e)?;
        if ids != self.ids {
            return Err(ServeError::failed(
                "holds other rows than this store owns (another partitioning?)",
            ));
        }
        let flat = |t: Tensor| -> Result<Vec<f32>, ServeError> {
            t.flatten_all().and_then(|t| t.to_vec1()).map_err(e)
        };
        let (data, m, v) = (flat(data)?, flat(m)?, flat(v)?);
        let steps: Vec<u32> = steps.to_vec1().map_err(e)?;
        let n = self.ids.len() * self.dim;
        if data.len() != n || m.len() != n || v.len() != n || steps.len() != self.ids.len() {
            return Err(ServeError::failed(format!(
                "rows of another width (this store's is {})",
                self.dim
            )));
        }
        if data.iter().chain(&m).chain(&v).any(|x| !x.is_finite()) {
            return Err(ServeError::failed("holds values that are not finite"));
        }
        (self.data, self.m, self.v, self.steps) = (data, m, v, steps);
        self.pending.clear();
        self.applied = applied;
        Ok(())
    }

    fn row(&self, id: u32) -> Result<usize, ServeError> {
        self.ids
            .binary_search(&id)
            .map_err(|_| ServeError::Refused(format!("row {id} is not owned here")))
    }

    fn push(&mut self, p: Push) -> Result<(), ServeError> {
        let t = p.trainer as usize;
        if t >= self.trainers {
            return Err(ServeError::Refused(format!(
                "trainer {t} out of range 0..{}",
                self.trainers
            )));
        }
        if self.applied.is_some_and(|a| p.seq <= a) {
            return Ok(()); // a resend of a step already applied
        }
        let grad: Vec<f32> =
            decode_f32(&p.grad.0, p.ids.len() * self.dim).map_err(ServeError::refused)?;
        // Looked up once, here, where a bad id is refused to its sender; the step keeps the rows.
        let rows = p
            .ids
            .iter()
            .map(|&id| self.row(id).map(|r| r as u32))
            .collect::<Result<Vec<u32>, ServeError>>()?;
        let slots = self
            .pending
            .entry(p.seq)
            .or_insert_with(|| vec![None; self.trainers]);
        slots[t].get_or_insert((rows, grad));
        if slots.iter().any(Option::is_none) {
            return Ok(());
        }
        let Some(slots) = self.pending.remove(&p.seq) else {
            return Ok(());
        };
        if self.frozen {
            self.applied = Some(p.seq);
            return Ok(());
        }
        // Sum per row in trainer order, then one Adam step per touched row.
        let d = self.dim;
        // At most one row per id pushed: sized once, never grown.
        let most: usize = slots.iter().flatten().map(|(pushed, _)| pushed.len()).sum();
        let mut rows: Vec<usize> = Vec::with_capacity(most);
        let mut sums: Vec<f32> = Vec::with_capacity(most * d);
        for (pushed, grad) in slots.into_iter().flatten() {
            for (k, r) in pushed.into_iter().enumerate() {
                let r = r as usize;
                let g = &grad[k * d..(k + 1) * d];
                match self.slot[r] {
                    u32::MAX => {
                        self.slot[r] = rows.len() as u32;
                        rows.push(r);
                        sums.extend_from_slice(g);
                    }
                    at => sums[at as usize * d..(at as usize + 1) * d]
                        .iter_mut()
                        .zip(g)
                        .for_each(|(a, b)| *a += b),
                }
            }
        }
        let mut ids = Vec::with_capacity(rows.len());
        for &r in &rows {
            self.slot[r] = u32::MAX;
            ids.push(r as u32);
        }
        let table = RowsMut {
            data: &mut self.data,
            m: &mut self.m,
            v: &mut self.v,
            steps: &mut self.steps,
            dim: d,
        };
        adam_rows(table, &ids, &sums, &self.adam).map_err(ServeError::failed)?;
        self.applied = Some(p.seq);
        Ok(())
    }
}

/// What a store serves.
pub enum StoreData {
    /// Feature rows of type `ty` from the partition graph (memory-mapped).
    Features {
        /// The partition.
        graph: Arc<HetGraph>,
        /// Node type.
        ty: usize,
    },
    /// Learnable rows.
    Embeddings(Box<Shard>),
}

/// The FeatureStore actor of one partition and node type.
pub struct FeatureStore {
    part: u16,
    owners: Arc<Vec<Vec<u16>>>,
    ty: usize,
    data: StoreData,
    /// The generation of the run it serves.
    gen: u64,
    /// Where checkpoints go, and this store's file in them.
    checkpoints: Option<(PathBuf, String)>,
    /// Pulls waiting to be served.
    parked: Parked<Pull, PullAnswer>,
}

impl FeatureStore {
    /// A store for partition `part`, node type `ty`; learnable rows are
    /// checkpointed under `checkpoints` as `file`.
    pub fn new(
        part: u16,
        owners: Arc<Vec<Vec<u16>>>,
        ty: usize,
        data: StoreData,
        checkpoints: Option<(PathBuf, String)>,
    ) -> FeatureStore {
        FeatureStore {
            part,
            owners,
            ty,
            data,
            gen: 0,
            checkpoints,
            parked: Parked::default(),
        }
    }

    /// Starts generation `gen` from the checkpoint at step `from` (or afresh).
    fn reset(&mut self, gen: u64, from: Option<u64>) -> Result<(), ServeError> {
        if let StoreData::Embeddings(s) = &mut self.data {
            match from {
                None => **s = s.initial(),
                Some(seq) => {
                    let (root, file) = self.checkpoints.as_ref().ok_or_else(|| {
                        ServeError::failed("no checkpoint_dir configured on this node")
                    })?;
                    let dir = checkpoint::dir(root, seq);
                    let m = checkpoint::manifest(&dir).map_err(ServeError::failed)?;
                    let t = checkpoint::load_tensors(&dir, &m, file).map_err(ServeError::failed)?;
                    s.restore(t, seq.checked_sub(1)).map_err(|e| {
                        ServeError::Failed(format!("{}: {e}", dir.join(file).display()))
                    })?;
                }
            }
        }
        self.gen = gen;
        Ok(())
    }

    /// Writes the rows into the checkpoint at `seq` once the updates of the
    /// steps before it are applied (`None` until then).
    fn save(&self, gen: u64, seq: u64) -> Result<Option<(String, String)>, ServeError> {
        let StoreData::Embeddings(s) = &self.data else {
            return Err(ServeError::refused("plain features are not checkpointed"));
        };
        if gen != self.gen || s.applied.map_or(0, |a| a + 1) < seq {
            return Ok(None);
        }
        if s.applied.map_or(0, |a| a + 1) > seq {
            return Err(ServeError::Refused(format!(
                "asked for the checkpoint at step {seq}, but step {} is already applied",
                s.applied.unwrap_or(0)
            )));
        }
        let (root, file) = self
            .checkpoints
            .as_ref()
            .ok_or_else(|| ServeError::failed("no checkpoint_dir configured on this node"))?;
        let t = s.tensors().map_err(ServeError::failed)?;
        checkpoint::write_tensors(&checkpoint::partial_dir(root, seq), file, &t)
            .map(Some)
            .map_err(ServeError::failed)
    }

    fn check_owned(&self, ids: &[u32]) -> Result<(), ServeError> {
        if ids.len() > MAX_ROWS {
            return Err(ServeError::Refused(format!(
                "{} rows requested, at most {MAX_ROWS}",
                ids.len()
            )));
        }
        let own = &self.owners[self.ty];
        for &i in ids {
            match own.get(i as usize) {
                Some(&p) if p == self.part => {}
                Some(p) => {
                    return Err(ServeError::Refused(format!(
                        "row {i} belongs to partition {p}, not {}",
                        self.part
                    )))
                }
                None => {
                    return Err(ServeError::Refused(format!(
                        "row {i} out of range 0..{}",
                        own.len()
                    )))
                }
            }
        }
        Ok(())
    }

    fn pull(
        &self,
        gen: u64,
        ids: &[u32],
        after: Option<u64>,
    ) -> Result<Option<SharedBytes>, ServeError> {
        if let StoreData::Embeddings(s) = &self.data {
            if gen != self.gen || after.is_some_and(|a| s.applied.is_none_or(|done| done < a)) {
                return Ok(None);
            }
        }
        self.check_owned(ids)?;
        let mut out: Vec<u8> = Vec::new();
        match &self.data {
            // Constant rows go as their non-zeros where that is shorter (bags of words).
            StoreData::Features { graph, ty } => {
                let f = graph.node_types()[*ty]
                    .features
                    .as_ref()
                    .ok_or_else(|| ServeError::failed("this type has no features"))?;
                let rows: Vec<&[f32]> = ids.iter().map(|&i| f.row(i as usize)).collect();
                out = crate::distributed::rows::encode_rows(&rows);
            }
            StoreData::Embeddings(s) => {
                out.reserve(ids.len() * s.dim * 4);
                for &i in ids {
                    let r = s.row(i)?;
                    out.extend_from_slice(bytemuck::cast_slice(
                        &s.data[r * s.dim..(r + 1) * s.dim],
                    ));
                }
            }
        }
        Ok(Some(SharedBytes(out.into())))
    }
}

impl Actor for FeatureStore {
    type Context = Context<Self>;
}

/// The answer to a pull.
type PullAnswer = Result<Option<SharedBytes>, ServeError>;

impl Handler<Deliver<Pull>> for FeatureStore {
    type Result = ResponseFuture<PullAnswer>;
    /// Parked and served by priority (see [`super::priority`]).
    fn handle(&mut self, m: Deliver<Pull>, ctx: &mut Context<Self>) -> Self::Result {
        let rx = self.parked.park(m.msg.priority, m.msg);
        ctx.notify(Serve);
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(ServeError::Stopped(
                    "the store stopped before it answered".into(),
                ))
            })
        })
    }
}

impl Handler<Serve> for FeatureStore {
    type Result = ();
    fn handle(&mut self, _: Serve, _: &mut Context<Self>) {
        let mut parked = std::mem::take(&mut self.parked);
        parked.serve_one(|m| self.pull(m.gen, &m.ids, m.after));
        self.parked = parked;
    }
}

impl Handler<Deliver<Push>> for FeatureStore {
    type Result = MessageResult<Deliver<Push>>;
    fn handle(&mut self, m: Deliver<Push>, _: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.check_owned(&m.msg.ids) {
            return MessageResult(Err(e));
        }
        MessageResult(match &mut self.data {
            StoreData::Embeddings(_) if m.msg.gen != self.gen => Ok(None),
            StoreData::Embeddings(s) => s.push(m.msg).map(Some),
            StoreData::Features { .. } => {
                Err(ServeError::refused("plain features take no gradients"))
            }
        })
    }
}

impl Handler<Deliver<Reset>> for FeatureStore {
    type Result = MessageResult<Deliver<Reset>>;
    fn handle(&mut self, m: Deliver<Reset>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.reset(m.msg.gen, m.msg.from))
    }
}

impl Handler<Deliver<Save>> for FeatureStore {
    type Result = MessageResult<Deliver<Save>>;
    fn handle(&mut self, m: Deliver<Save>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.save(m.msg.gen, m.msg.seq))
    }
}

impl Handler<Deliver<Export>> for FeatureStore {
    type Result = MessageResult<Deliver<Export>>;
    fn handle(&mut self, _: Deliver<Export>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(match &self.data {
            StoreData::Embeddings(s) => Ok((
                s.ids.clone(),
                ByteVec(bytemuck::cast_slice(&s.data).to_vec()),
            )),
            StoreData::Features { .. } => {
                Err(ServeError::refused("plain features are not exported"))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(seq: u64, trainer: u32, ids: Vec<u32>, grad: &[f32]) -> Push {
        Push {
            gen: 0,
            seq,
            trainer,
            ids,
            grad: ByteVec(bytemuck::cast_slice(grad).to_vec()),
        }
    }

    fn row(s: &Shard, id: u32) -> Vec<f32> {
        let r = s.row(id).unwrap();
        s.data[r * s.dim..(r + 1) * s.dim].to_vec()
    }

    #[test]
    fn a_step_is_applied_once_every_trainer_pushed_with_the_summed_gradient() {
        let adam = AdamConfig::with_lr(0.1);
        let mut s = Shard::new(3, "embed.author", 6, 2, vec![1, 4, 5], adam, 2);
        let mut reference = models::embedding::EmbeddingTable::new(3, "embed.author", 6, 2);
        assert_eq!(
            row(&s, 4),
            reference.data[8..10].to_vec(),
            "rows start as the single-process table's"
        );
        s.push(push(0, 1, vec![4, 1], &[1.0, 2.0, 3.0, 4.0]))
            .unwrap();
        assert_eq!(
            row(&s, 4),
            reference.data[8..10].to_vec(),
            "nothing applied before every trainer pushed"
        );
        // A resend of the same push changes nothing.
        s.push(push(0, 1, vec![4, 1], &[1.0, 2.0, 3.0, 4.0]))
            .unwrap();
        s.push(push(0, 0, vec![4], &[0.5, -1.0])).unwrap();
        let g = candle_core::Tensor::from_vec(
            vec![3.0f32, 4.0, 1.5, 1.0],
            (2, 2),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        reference.sparse_adam(&[1, 4], &g, &adam).unwrap();
        assert_eq!(row(&s, 1), reference.data[2..4].to_vec());
        assert_eq!(row(&s, 4), reference.data[8..10].to_vec());
        assert_eq!(
            row(&s, 5),
            reference.data[10..12].to_vec(),
            "untouched rows keep their values"
        );
        // A late duplicate of an applied step is ignored.
        s.push(push(0, 0, vec![4], &[100.0, 100.0])).unwrap();
        assert_eq!(row(&s, 4), reference.data[8..10].to_vec());
    }

    #[test]
    fn malformed_pushes_are_refused() {
        let mut s = Shard::new(0, "embed.x", 4, 2, vec![0, 2], AdamConfig::with_lr(0.1), 2);
        assert!(s
            .push(push(0, 2, vec![0], &[1.0, 1.0]))
            .unwrap_err()
            .to_string()
            .contains("refused: trainer 2"));
        assert!(s
            .push(push(0, 0, vec![1], &[1.0, 1.0]))
            .unwrap_err()
            .to_string()
            .contains("not owned"));
        assert!(s
            .push(push(0, 0, vec![0], &[1.0]))
            .unwrap_err()
            .to_string()
            .contains("bytes"));
    }

    #[test]
    fn a_checkpointed_shard_restores_exactly_and_resumes_its_steps() {
        let root = tempfile::tempdir().unwrap();
        let owners = Arc::new(vec![vec![0u16, 1, 0, 0]]);
        let shard = Shard::new(
            1,
            "embed.x",
            4,
            2,
            vec![0, 2, 3],
            AdamConfig::with_lr(0.1),
            1,
        );
        let file = checkpoint::shard_file("x", 0);
        let mut store = FeatureStore::new(
            0,
            owners,
            0,
            StoreData::Embeddings(Box::new(shard)),
            Some((root.path().to_path_buf(), file.clone())),
        );
        let step = |st: &mut FeatureStore, seq: u64, g: f32| match &mut st.data {
            StoreData::Embeddings(s) => s.push(push(seq, 0, vec![0, 3], &[g, g, -g, g])).unwrap(),
            _ => unreachable!(),
        };
        step(&mut store, 0, 1.0);
        assert_eq!(store.save(0, 2).unwrap(), None, "step 1 is not applied yet");
        step(&mut store, 1, 0.5);
        let (f, sum) = store.save(0, 2).unwrap().unwrap();
        assert_eq!(f, file);
        let rows = |st: &FeatureStore| st.pull(st.gen, &[0, 2, 3], None).unwrap().unwrap().0;
        let at_2 = rows(&store);
        step(&mut store, 2, 2.0);
        assert_ne!(rows(&store), at_2);
        let m = checkpoint::Manifest::new(
            "r".into(),
            "data-parallel",
            &crate::config::TrainingConfig::default(),
            2,
            Vec::new(),
            Default::default(),
            BTreeMap::from([(f, sum)]),
        );
        checkpoint::finalize(root.path(), &m, 3).unwrap();
        store.reset(7, Some(2)).unwrap();
        assert_eq!(rows(&store), at_2, "the rows of the checkpoint");
        assert_eq!(
            store.pull(7, &[0], Some(1)).unwrap().map(|b| b.0.len()),
            Some(8),
            "steps before the checkpoint count as applied"
        );
        assert_eq!(
            store.pull(6, &[0], None).unwrap(),
            None,
            "another generation waits"
        );
        store.reset(8, None).unwrap();
        let fresh = Shard::new(
            1,
            "embed.x",
            4,
            2,
            vec![0, 2, 3],
            AdamConfig::with_lr(0.1),
            1,
        );
        assert_eq!(
            rows(&store),
            bytemuck::cast_slice::<f32, u8>(&fresh.data).to_vec(),
            "no checkpoint: the initial rows"
        );
    }
}
