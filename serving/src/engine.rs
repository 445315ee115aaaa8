//! Answers of a trained model: the class (and class probabilities, and the
//! embedding the classifier reads) of target nodes, and nodes' embeddings,
//! by one of two inferences, each equal to its offline counterpart:
//!
//! - sampled: the training fanouts with evaluation's seed and one fixed
//!   sampling key ([`actors::epoch::INFERENCE_STEP`]), so a node's answer
//!   does not depend on the other nodes computed with it (`predict`);
//! - exact: every layer over full neighbourhoods, as `embed` computes it,
//!   every node's embedding computed once when the model is loaded.

use actors::epoch::{sample, SamplingPlan, INFERENCE_STEP};
use actors::inference::online::Online;
use candle_core::{DType, Tensor};
use graphs::overlay::Overlay;
use graphs::{Block, MiniBatch, NodeTypeId, Sampler};
use models::inference::{self, TypeRows};
use models::model::Head;

use crate::additions::Additions;
use crate::error::{Result, ServeError};
use crate::trained::Trained;

/// How answers are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Inference {
    /// Sampled neighbourhoods with a fixed key (`predict`'s answers).
    Sampled,
    /// Full neighbourhoods, layer by layer (`embed`'s answers).
    Exact,
}

impl std::fmt::Display for Inference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Inference::Sampled => "sampled",
            Inference::Exact => "exact",
        })
    }
}

/// Which outputs a classification computes besides the classes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Want {
    /// Class probabilities (softmax of the logits).
    pub probabilities: bool,
    /// The embeddings the classifier reads.
    pub embeddings: bool,
}

/// Rows of floats, `width` per node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rows {
    /// Floats per node.
    pub width: usize,
    /// `nodes * width` floats.
    pub data: Vec<f32>,
}

impl Rows {
    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.width..(i + 1) * self.width]
    }

    /// Columns `c` of every row.
    pub fn columns(&self, c: std::ops::Range<usize>) -> Rows {
        let n = self.data.len() / self.width.max(1);
        Rows {
            width: c.len(),
            data: (0..n)
                .flat_map(|i| self.row(i)[c.clone()].iter().copied())
                .collect(),
        }
    }

    /// Rows `at`, in that order (repeats allowed).
    pub fn pick(&self, at: &[usize]) -> Rows {
        Rows {
            width: self.width,
            data: at
                .iter()
                .flat_map(|&i| self.row(i).iter().copied())
                .collect(),
        }
    }
}

/// Where each of `nodes` sits in `sorted`, which holds every one of them.
pub fn positions(sorted: &[u32], nodes: &[u32]) -> Vec<usize> {
    nodes
        .iter()
        .map(|v| sorted.binary_search(v).unwrap_or_default())
        .collect()
}

/// A classification of some target nodes, in their order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Classified {
    /// The predicted class of each node (empty for a regression model).
    pub classes: Vec<u32>,
    /// The predicted value of each node (a regression model's only).
    pub values: Option<Vec<f32>>,
    /// The predicted labels of each node, in label order (a multi-label model's only).
    pub labels: Option<Vec<Vec<u32>>>,
    /// Class probabilities (multi-label: each label's), when asked for.
    pub probabilities: Option<Rows>,
    /// The classifier's input embeddings, when asked for.
    pub embeddings: Option<Rows>,
}

impl Classified {
    /// The answers of nodes `at`, in that order; probabilities and
    /// embeddings only where `want` asks for them.
    pub fn pick(&self, at: &[usize], want: Want) -> Classified {
        Classified {
            classes: at
                .iter()
                .filter_map(|&i| self.classes.get(i).copied())
                .collect(),
            values: self
                .values
                .as_ref()
                .map(|v| at.iter().map(|&i| v[i]).collect()),
            labels: self
                .labels
                .as_ref()
                .map(|l| at.iter().map(|&i| l[i].clone()).collect()),
            probabilities: self
                .probabilities
                .as_ref()
                .filter(|_| want.probabilities)
                .map(|r| r.pick(at)),
            embeddings: self
                .embeddings
                .as_ref()
                .filter(|_| want.embeddings)
                .map(|r| r.pick(at)),
        }
    }
}

/// A loaded model answering classification and embedding questions.
pub struct Engine {
    trained: Trained,
    inference: Inference,
    plan: SamplingPlan,
    /// The head answered with and its columns of a target node's output row
    /// (a multi-task model has one per task; the first by default).
    head: (Head, std::ops::Range<usize>),
    /// Every node's embedding (exact inference), per type.
    exact: Option<Vec<Option<TypeRows>>>,
    /// Every node's rows of every layer but the last, from the sampled
    /// inference's draws ([`Engine::precompute`]), per type.
    precomputed: Option<Vec<Option<TypeRows>>>,
    /// Served from partitions: where neighbourhoods are drawn and read.
    online: Option<Online>,
    /// The last request's sampler maps, reused by the next
    /// ([`graphs::sampler::Sampler::with_maps`]); empty while one is in use.
    maps: std::sync::Mutex<Vec<Vec<u32>>>,
}

impl Engine {
    /// An engine over `trained`. Exact inference computes every node's
    /// embedding now, `chunk` destinations at a time, reporting
    /// `progress(layer, done, total)`.
    pub fn new(
        trained: Trained,
        inference: Inference,
        chunk: usize,
        progress: impl FnMut(usize, u64, u64),
    ) -> Result<Engine> {
        let plan = SamplingPlan::new(&trained.source.fanouts, trained.source.spec.seed);
        let exact = match inference {
            // An MLP reads no neighbourhood: both inferences are the same.
            Inference::Exact if trained.model.uses_neighbors() => Some(
                inference::embed_all(&trained.model, &trained.graph, chunk, progress)
                    .map_err(|e| ServeError::Load(format!("exact inference: {e}")))?,
            ),
            _ => None,
        };
        let head = trained.source.spec.head_columns(&trained.graph).remove(0);
        Ok(Engine {
            trained,
            inference,
            plan,
            head,
            exact,
            precomputed: None,
            online: None,
            maps: Default::default(),
        })
    }

    /// Computes now, layer by layer over every node, the rows each layer
    /// but the last gives it under the sampled inference's draws, so that
    /// a request draws and computes its last layer only. A node's draws are
    /// keyed by the node, so its rows are the ones any request holding it
    /// computes: the same answers (to float rounding: rows are computed in
    /// other groupings), for memory of one hidden row per node of every
    /// type. `chunk` destinations at a time; `progress(layer, done, total)`.
    /// Nothing to do for a model of one relational layer or none.
    pub fn precompute(
        mut self,
        chunk: usize,
        progress: impl FnMut(usize, u64, u64),
    ) -> Result<Engine> {
        if self.online.is_some() {
            return Err(ServeError::Load(
                "precomputed layers are a whole-graph server's (serve --data without --partitions)"
                    .into(),
            ));
        }
        if self.inference != Inference::Sampled {
            return Err(ServeError::Load(
                "precomputed layers are for sampled inference: exact inference computes every layer at load already".into(),
            ));
        }
        if !self.classifies() {
            return Err(ServeError::Load(
                "precomputed layers speed up the node answers of /v1/predict; this model predicts links or edges (serve it without --precompute)".into(),
            ));
        }
        let layers = self.layers_to_keep();
        if layers == 0 {
            return Ok(self);
        }
        let (g, model) = (&self.trained.graph, &self.trained.model);
        let fanouts = &self.plan.fanouts;
        if fanouts.len() != layers + 1 {
            return Err(ServeError::Load(format!(
                "the checkpoint has {} fanouts for a {}-layer model: it cannot be sampled as trained",
                fanouts.len(),
                layers + 1
            )));
        }
        self.check_precompute_fits()?;
        let (seed, epoch) = (self.plan.eval_seed(), self.trained.source.epochs_done);
        // Layer l's draws: the top hop of a sampler of layers 0..=l (keyed as layer l).
        let mut samplers = (0..layers)
            .map(|l| -> Result<Sampler> {
                let s = Sampler::new(g, &fanouts[fanouts.len() - 1 - l..], seed)?;
                Ok(s.in_parallel().top_hops(1)?)
            })
            .collect::<Result<Vec<_>>>()?;
        let sampled = |l: usize, t: NodeTypeId, dst: &[u32]| -> Result<Block> {
            let s = samplers
                .get_mut(l)
                .ok_or_else(|| ServeError::Inference(format!("no sampler of layer {l}")))?;
            let mut seeds = vec![Vec::new(); g.node_types().len()];
            seeds[t.index()] = dst.to_vec();
            let mut mb =
                s.sample_typed(epoch, INFERENCE_STEP, &seeds, &graphs::link::NoExclusion)?;
            mb.blocks
                .pop()
                .ok_or_else(|| ServeError::Inference("a hop without a block".into()))
        };
        let rows = inference::layerwise(model, g, layers, chunk, sampled, progress)?;
        self.precomputed = rows;
        Ok(self)
    }

    /// Whether the layers below the last are precomputed ([`Engine::precompute`]).
    pub fn precomputed(&self) -> bool {
        self.precomputed.is_some()
    }

    /// The relational layers [`Engine::precompute`] keeps (every one but the
    /// last; none for a features-only model).
    fn layers_to_keep(&self) -> usize {
        let model = &self.trained.model;
        match model.uses_neighbors() {
            true => model.spec().layers.saturating_sub(1),
            false => 0,
        }
    }

    /// The memory [`Engine::precompute`] takes at most: the kept layer's
    /// hidden rows of every node, and the one before it while computing.
    pub fn precompute_bytes(&self) -> u128 {
        let (g, spec) = (&self.trained.graph, self.trained.model.spec());
        let nodes: u128 = g.node_types().iter().map(|t| u128::from(t.count)).sum();
        nodes * spec.hidden as u128 * 4 * self.layers_to_keep().min(2) as u128
    }

    /// Refuses, with the figures, a [`Engine::precompute`] whose rows the
    /// machine's memory (or `HETGNN_MEMORY_BYTES`) cannot hold beside what
    /// this process holds already.
    pub fn check_precompute_fits(&self) -> Result<()> {
        let held = graphs::memory::anon_rss_bytes().unwrap_or(0);
        graphs::memory::check_fits(
            "precomputing the layers below the last (hidden rows of every node of every type, beside what this process holds)",
            self.precompute_bytes() + u128::from(held),
        )
        .map_err(|e| ServeError::Load(format!("{e}; serve without --precompute")))
    }

    /// Whether answering `nodes` target nodes with [`Engine::precompute`]
    /// first computes fewer rows than answering them alone: a node's
    /// answer computes the layers below the last for its first hop's draws
    /// (up to the first fanout per relation into its type), a precomputation
    /// for every node once.
    pub fn precompute_pays_for(&self, nodes: usize) -> bool {
        let g = &self.trained.graph;
        let t = g.target();
        let first = self.plan.fanouts.first().copied().unwrap_or(0) as u64;
        let count = u64::from(g.node_type(t).count).max(1);
        // Per relation, the fanout or the mean in-degree, whichever is smaller.
        let per_node: u64 = g
            .in_relations(t)
            .iter()
            .map(|&r| first.min((g.relation(r).num_edges() as u64).div_ceil(count)))
            .sum();
        let all: u64 = g.node_types().iter().map(|t| u64::from(t.count)).sum();
        self.classifies()
            && self.layers_to_keep() > 0
            && (nodes as u64).saturating_mul(per_node) >= all
    }

    /// An engine over `trained`, this node's partition, answering by sampled
    /// inference with neighbourhoods drawn and read through `online`
    /// (requests with new nodes and edges, and exact inference, are a
    /// single-process server's).
    pub fn partitioned(trained: Trained, online: Online) -> Engine {
        let plan = SamplingPlan::new(&trained.source.fanouts, trained.source.spec.seed);
        let head = trained.source.spec.head_columns(&trained.graph).remove(0);
        Engine {
            trained,
            inference: Inference::Sampled,
            plan,
            head,
            exact: None,
            precomputed: None,
            online: Some(online),
            maps: Default::default(),
        }
    }

    /// Served from partitions: this node's partition and its reads.
    pub fn online(&self) -> Option<&Online> {
        self.online.as_ref()
    }

    /// Answers with the head of node task `task` ("node-classification",
    /// "node-regression" or "multi-label"), which the model must have been trained for.
    pub fn choose_task(&mut self, task: &str) -> Result<()> {
        let heads = self.trained.source.spec.head_columns(&self.trained.graph);
        let names: Vec<&str> = heads.iter().map(|(h, _)| head_task(*h)).collect();
        match heads.into_iter().find(|(h, _)| head_task(*h) == task) {
            Some(h) if self.classifies() => {
                self.head = h;
                Ok(())
            }
            _ => Err(ServeError::BadRequest(format!(
                "this model was not trained for task '{task}'{}",
                match self.classifies() {
                    true => format!(" (it predicts: {})", names.join(", ")),
                    false => String::new(),
                }
            ))),
        }
    }

    /// Outputs per node of the head answered with: classes, labels, or 1
    /// for a value (a link or edge model: the width of its embeddings).
    pub fn outputs(&self) -> usize {
        match self.classifies() {
            true => self.head.1.len(),
            false => self.trained.model.num_classes(),
        }
    }

    /// The node tasks the model answers, the one answered with first.
    pub fn tasks(&self) -> Vec<&'static str> {
        if !self.classifies() {
            return Vec::new();
        }
        let mut names = vec![head_task(self.head.0)];
        for (h, _) in self.trained.source.spec.head_columns(&self.trained.graph) {
            if h != self.head.0 {
                names.push(head_task(h));
            }
        }
        names
    }

    /// The model, graph and names answered from.
    pub fn trained(&self) -> &Trained {
        &self.trained
    }

    /// How answers are computed.
    pub fn inference(&self) -> Inference {
        self.inference
    }

    /// Whether the model predicts something per target node, a class or a
    /// value (a link or edge predictor does not).
    pub fn classifies(&self) -> bool {
        self.trained.source.spec.predicts_nodes()
    }

    /// Whether the model predicts a value per node rather than a class.
    pub fn regresses(&self) -> bool {
        self.classifies() && self.head.0 == Head::Value
    }

    /// Whether the model predicts a set of labels per node rather than a class.
    pub fn multi_label(&self) -> bool {
        self.classifies() && self.head.0 == Head::Labels
    }

    /// Classes of target nodes `nodes` (dense ids, any order, repeats allowed).
    pub fn classify(&self, nodes: &[u32], want: Want) -> Result<Classified> {
        self.check_classifies()?;
        let g = &self.trained.graph;
        check_nodes(g, g.target(), nodes)?;
        if nodes.is_empty() {
            return Ok(Classified::default());
        }
        // Inference runs on distinct nodes (the sampler's seeds must be);
        // repeats get their node's answer.
        let distinct = sorted_distinct(nodes);
        if distinct.as_slice() == nodes {
            return self.classify_distinct(nodes, want);
        }
        let c = self.classify_distinct(&distinct, want)?;
        Ok(c.pick(&positions(&distinct, nodes), want))
    }

    /// Refuses a model that predicts nothing per node.
    fn check_classifies(&self) -> Result<()> {
        if self.classifies() {
            return Ok(());
        }
        Err(ServeError::BadRequest(
            "this model was trained for link prediction or an edge task and predicts nothing per node; ask for embeddings (edge models: POST /v1/score_edges or `hetgnn predict --edges` score edge lists)".into(),
        ))
    }

    /// [`Engine::classify`] of distinct, sorted nodes.
    fn classify_distinct(&self, nodes: &[u32], want: Want) -> Result<Classified> {
        let g = &self.trained.graph;
        let model = &self.trained.model;
        let (logits, emb) = match &self.exact {
            Some(rows) => {
                let logits = inference::classify_exact(model, g, rows, nodes)?;
                let emb = want
                    .embeddings
                    .then(|| rows_of(rows, g.target(), nodes))
                    .transpose()?;
                (logits, emb)
            }
            None => {
                let (logits, emb) = match &self.online {
                    Some(o) => {
                        let (mb, inputs) = o.neighbourhoods(nodes).map_err(from_partitions)?;
                        model.forward_with_embeddings(g, &mb, inputs, None)?
                    }
                    None => {
                        // This request's thread waits for it: its draws go on every core.
                        let mut sampler =
                            self.plan.eval(g)?.in_parallel().with_maps(self.take_maps());
                        if self.precomputed.is_some() {
                            // The layers below the last are kept: the last hop only.
                            sampler = sampler.top_hops(1)?;
                        }
                        let mb = sample(
                            &mut sampler,
                            model.uses_neighbors(),
                            self.trained.source.epochs_done,
                            INFERENCE_STEP,
                            nodes,
                        )?;
                        self.keep_maps(sampler);
                        match (&self.precomputed, mb.blocks.first()) {
                            (Some(rows), Some(first)) => {
                                let h = inference::rows_of(rows, &first.src, model)?;
                                model.forward_top(g, &mb, h)?
                            }
                            _ => model.forward_stored(g, &mb)?,
                        }
                    }
                };
                let emb = if want.embeddings {
                    Some(to_rows(&emb)?)
                } else {
                    None
                };
                (logits, emb)
            }
        };
        Ok(self.answers(&to_rows(&logits)?, emb, want))
    }

    /// A classification's answers from its logits (and the embeddings, when asked for).
    fn answers(&self, logits: &Rows, emb: Option<Rows>, want: Want) -> Classified {
        answers(self.head.clone(), logits, emb, want)
    }

    /// [`Engine::classify`] on the graph with `add`'s nodes and edges
    /// (`nodes` may be new ones: ids from the target type's count on),
    /// computed over the neighbourhoods the additions change: the answers
    /// the same inference gives on the graph rebuilt with them
    /// ([`Overlay::rebuilt`]). The stored graph is unchanged.
    pub fn classify_with(&self, add: &Additions, nodes: &[u32], want: Want) -> Result<Classified> {
        if add.is_empty() {
            return self.classify(nodes, want);
        }
        self.check_classifies()?;
        let overlay = self.overlay(add)?;
        let t = self.trained.graph.target();
        check_overlay_nodes(&overlay, t, nodes)?;
        if nodes.is_empty() {
            return Ok(Classified::default());
        }
        let distinct = sorted_distinct(nodes);
        let model = &self.trained.model;
        let mb = self.sample_over(&overlay, t, &distinct, self.trained.source.spec.layers)?;
        let inputs = self.inputs_over(&overlay, add, &mb.blocks[0].src)?;
        let (logits, emb) = model.forward_with_embeddings(overlay.graph(), &mb, inputs, None)?;
        let emb = want.embeddings.then(|| to_rows(&emb)).transpose()?;
        let c = self.answers(&to_rows(&logits)?, emb, want);
        Ok(c.pick(&positions(&distinct, nodes), want))
    }

    /// [`Engine::embed`] on the graph with `add`'s nodes and edges, as
    /// [`Engine::classify_with`] classifies.
    pub fn embed_with(&self, add: &Additions, t: NodeTypeId, nodes: &[u32]) -> Result<Rows> {
        if add.is_empty() {
            return self.embed(t, nodes);
        }
        let overlay = self.overlay(add)?;
        check_overlay_nodes(&overlay, t, nodes)?;
        let g = &self.trained.graph;
        if self.exact.is_none() {
            if t == g.target() && self.classifies() {
                let want = Want {
                    probabilities: false,
                    embeddings: true,
                };
                return Ok(self
                    .classify_with(add, nodes, want)?
                    .embeddings
                    .unwrap_or_default());
            }
            return Err(sampled_embeds_target_only(g));
        }
        if nodes.is_empty() {
            return Ok(Rows::default());
        }
        let distinct = sorted_distinct(nodes);
        let model = &self.trained.model;
        let layers = inference::embedding_layers(model)?;
        let mut h = if layers == 0 {
            // A one-layer R-GCN's embeddings are its inputs.
            let mut typed = vec![Vec::new(); g.node_types().len()];
            typed[t.index()] = distinct.clone();
            self.inputs_over(&overlay, add, &typed)?
        } else {
            let mb = self.sample_over(&overlay, t, &distinct, layers)?;
            let inputs = self.inputs_over(&overlay, add, &mb.blocks[0].src)?;
            inference::forward_layers(model, g, &mb.blocks, inputs)?
        };
        let x = h[t.index()].take().ok_or_else(|| {
            ServeError::BadRequest("the model computes no embeddings of this node type".into())
        })?;
        Ok(to_rows(&x)?.pick(&positions(&distinct, nodes)))
    }

    /// The stored graph with `add` over it.
    fn overlay(&self, add: &Additions) -> Result<Overlay<'_>> {
        if self.online.is_some() {
            return Err(ServeError::BadRequest(
                "new nodes and edges are answered by a server holding the whole graph (serve --data); a server of partitions answers stored nodes".into(),
            ));
        }
        Overlay::new(&self.trained.graph, add.added.clone(), &add.edges)
            .map_err(|e| ServeError::BadRequest(e.to_string()))
    }

    /// The blocks of `layers` layers for `seeds` of type `t` over `overlay`:
    /// every in-neighbour (exact inference) or the evaluation sampler's
    /// draws (sampled), keyed as [`Engine::classify`] keys them.
    fn sample_over(
        &self,
        overlay: &Overlay,
        t: NodeTypeId,
        seeds: &[u32],
        layers: usize,
    ) -> Result<MiniBatch> {
        let g = overlay.graph();
        let mut typed = vec![Vec::new(); g.node_types().len()];
        typed[t.index()] = seeds.to_vec();
        let (epoch, step) = (self.trained.source.epochs_done, INFERENCE_STEP);
        if !self.trained.model.uses_neighbors() {
            // A features-only model reads the seeds' rows alone (as `sample` gives them).
            return Ok(MiniBatch {
                epoch,
                step,
                seeds: seeds.to_vec(),
                blocks: vec![Block {
                    layer: 0,
                    src: typed.clone(),
                    dst: typed,
                    relations: Vec::new(),
                }],
            });
        }
        let sampler = match self.inference {
            Inference::Exact => Sampler::new(g, &vec![usize::MAX; layers], 0)?,
            Inference::Sampled => self.plan.eval(g)?,
        };
        let mut sampler = sampler
            .with_new_nodes(overlay.added())?
            .with_maps(self.take_maps());
        let mb = overlay.sample(&mut sampler, epoch, step, &typed)?;
        self.keep_maps(sampler);
        Ok(mb)
    }

    /// The sampler maps the last request left (none if another holds them).
    fn take_maps(&self) -> Vec<Vec<u32>> {
        self.maps
            .try_lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }

    /// Leaves `sampler`'s maps for the next request (after a sampling that
    /// returned: an error or panic midway drops them instead).
    fn keep_maps(&self, sampler: Sampler<'_>) {
        if let Ok(mut m) = self.maps.try_lock() {
            *m = sampler.into_maps();
        }
    }

    /// The input rows of `src` (per type) over `overlay`: stored nodes'
    /// features or learnt rows, new nodes' feature rows from `add`.
    fn inputs_over(
        &self,
        overlay: &Overlay,
        add: &Additions,
        src: &[Vec<u32>],
    ) -> Result<models::self_loop::PerType> {
        let g = overlay.graph();
        let model = &self.trained.model;
        let stored: Vec<Vec<u32>> = src
            .iter()
            .enumerate()
            .map(|(t, ids)| {
                let t = NodeTypeId(t as u32);
                ids.iter()
                    .copied()
                    .filter(|&v| !overlay.is_new(t, v))
                    .collect()
            })
            .collect();
        let mut inputs = model.gather_inputs(g, &stored)?;
        let wants = model.feature_gather();
        for (t, ids) in src.iter().enumerate() {
            if stored[t].len() == ids.len() {
                continue;
            }
            if !wants.wants(t) {
                inputs[t] = None;
                continue;
            }
            let nt = &g.node_types()[t];
            let (Some(f), Some(new)) = (&nt.features, add.features.get(t).and_then(Option::as_ref))
            else {
                return Err(ServeError::BadRequest(format!(
                    "new nodes of type '{}', which has no features, cannot be read by the model",
                    nt.name
                )));
            };
            let dim = f.dim();
            let old: Option<Vec<f32>> = inputs[t]
                .take()
                .map(|x| x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>())
                .transpose()?;
            let mut data = Vec::with_capacity(ids.len() * dim);
            let mut next_old = 0usize;
            for &v in ids {
                let row = if v >= nt.count {
                    let at = (v - nt.count) as usize * dim;
                    new.get(at..at + dim)
                } else {
                    next_old += 1;
                    let at = (next_old - 1) * dim;
                    old.as_deref().and_then(|o| o.get(at..at + dim))
                };
                data.extend_from_slice(row.ok_or_else(|| {
                    ServeError::Inference(format!(
                        "no input row for node {v} of type '{}'",
                        nt.name
                    ))
                })?);
            }
            inputs[t] = Some(
                Tensor::from_vec(data, (ids.len(), dim), model.device())?
                    .to_dtype(model.dtype())?,
            );
        }
        Ok(inputs)
    }

    /// The relations whose edges the model scores: an edge model's target
    /// relations, or a link predictor's.
    pub fn scored_relations(&self) -> Result<&[String]> {
        let spec = &self.trained.source.spec;
        match (&spec.edge, &spec.link) {
            (Some(e), _) => Ok(&e.relations),
            (None, Some(l)) => Ok(&l.relations),
            (None, None) => Err(ServeError::BadRequest(
                "this model was trained for node classification or regression: it scores no edges (edge tasks and link prediction do)".into(),
            )),
        }
    }

    /// Classes (or values) of the edges `src[i] -> dst[i]` of target
    /// relation `r` of an edge model, decoded from its ends' exact rows (as
    /// its evaluation and `hetgnn predict --edges` do); for a link
    /// predictor, each edge's score (a logit: values) and, when asked, its
    /// probability (the score's sigmoid).
    pub fn score_edges(
        &self,
        r: graphs::RelationId,
        src: &[u32],
        dst: &[u32],
        probabilities: bool,
    ) -> Result<Classified> {
        let g = &self.trained.graph;
        let at = self.scored_relation(r)?;
        let rel = g.relation(r);
        let rows = self.exact.as_ref().ok_or_else(needs_exact)?;
        check_nodes(g, rel.src, src)?;
        check_nodes(g, rel.dst, dst)?;
        let table = |t: graphs::NodeTypeId| {
            rows.get(t.index())
                .and_then(Option::as_ref)
                .ok_or_else(|| ServeError::Inference("no embeddings of an edge's end type".into()))
        };
        self.decode(
            at,
            table(rel.src)?,
            table(rel.dst)?,
            src,
            dst,
            probabilities,
        )
    }

    /// [`Engine::score_edges`] on the graph with `add`'s nodes and edges
    /// (either end may be a new node): each end's exact rows over the
    /// additions ([`Engine::embed_with`]), then the model's decoder.
    pub fn score_edges_with(
        &self,
        add: &Additions,
        r: graphs::RelationId,
        src: &[u32],
        dst: &[u32],
        probabilities: bool,
    ) -> Result<Classified> {
        if add.is_empty() {
            return self.score_edges(r, src, dst, probabilities);
        }
        let at = self.scored_relation(r)?;
        if self.exact.is_none() {
            return Err(needs_exact());
        }
        let rel = self.trained.graph.relation(r);
        // Each end's rows, as a small table of its distinct nodes.
        let local = |t: NodeTypeId, nodes: &[u32]| -> Result<(TypeRows, Vec<u32>)> {
            let distinct = sorted_distinct(nodes);
            let rows = self.embed_with(add, t, &distinct)?;
            let pos = positions(&distinct, nodes).into_iter().map(|i| i as u32);
            Ok((
                TypeRows {
                    width: rows.width,
                    data: rows.data,
                },
                pos.collect(),
            ))
        };
        let (ts, ls) = local(rel.src, src)?;
        let (td, ld) = local(rel.dst, dst)?;
        self.decode(at, &ts, &td, &ls, &ld, probabilities)
    }

    /// The index of relation `r` among the relations the model scores.
    fn scored_relation(&self, r: graphs::RelationId) -> Result<usize> {
        let relations = self.scored_relations()?;
        let rel = self.trained.graph.relation(r);
        relations
            .iter()
            .position(|x| x == rel.canonical())
            .ok_or_else(|| {
                ServeError::BadRequest(format!(
                    "the model was trained on the edges of {}, not '{}'",
                    relations.join(", "),
                    rel.canonical()
                ))
            })
    }

    /// The answers for edges `src[i] -> dst[i]` of the model's scored
    /// relation `at`, whose ends' rows are rows `src[i]` of `ts` and `dst[i]` of `td`.
    fn decode(
        &self,
        at: usize,
        ts: &TypeRows,
        td: &TypeRows,
        src: &[u32],
        dst: &[u32],
        probabilities: bool,
    ) -> Result<Classified> {
        let Some(spec) = &self.trained.source.spec.edge else {
            let scores = models::link::score_rows(&self.trained.model, at, ts, td, src, dst)?;
            return Ok(Classified {
                probabilities: probabilities.then(|| Rows {
                    width: 1,
                    data: scores
                        .iter()
                        .copied()
                        .map(models::link::probability)
                        .collect(),
                }),
                values: Some(scores),
                ..Classified::default()
            });
        };
        let y = to_rows(&models::edge::decode_rows(
            &self.trained.model,
            ts,
            td,
            src,
            dst,
        )?)?;
        if spec.values {
            return Ok(Classified {
                values: Some(y.data),
                ..Classified::default()
            });
        }
        Ok(Classified {
            classes: (0..src.len()).map(|i| argmax(y.row(i))).collect(),
            probabilities: probabilities.then(|| softmax(&y)),
            ..Classified::default()
        })
    }

    /// Embeddings of nodes `nodes` of type `t`: any type with exact inference,
    /// the target type (the classifier's input) with sampled inference.
    pub fn embed(&self, t: NodeTypeId, nodes: &[u32]) -> Result<Rows> {
        let g = &self.trained.graph;
        check_nodes(g, t, nodes)?;
        match &self.exact {
            Some(rows) => rows_of(rows, t, nodes),
            None if t == g.target() && self.classifies() => Ok(self
                .classify(
                    nodes,
                    Want {
                        probabilities: false,
                        embeddings: true,
                    },
                )?
                .embeddings
                .unwrap_or_default()),
            None => Err(sampled_embeds_target_only(g)),
        }
    }
}

/// A failure of another partition's node: retry when it is back (503), or a defect (500).
fn from_partitions(e: actors::TrainError) -> ServeError {
    match e.is_recoverable() {
        true => ServeError::Unavailable(format!(
            "another partition's node did not answer ({e}); retry once it is back"
        )),
        false => ServeError::Inference(e.to_string()),
    }
}

fn needs_exact() -> ServeError {
    ServeError::BadRequest(
        "edges are scored from exact embeddings: serve the model with --inference exact".into(),
    )
}

fn sampled_embeds_target_only(g: &graphs::HetGraph) -> ServeError {
    ServeError::BadRequest(format!(
        "sampled inference embeds only the target type '{}' of a classifier; serve with exact inference for every type",
        g.node_type(g.target()).name
    ))
}

/// `nodes` sorted, without repeats.
fn sorted_distinct(nodes: &[u32]) -> Vec<u32> {
    let mut d = nodes.to_vec();
    d.sort_unstable();
    d.dedup();
    d
}

/// Refuses nodes beyond type `t`'s stored and new nodes.
fn check_overlay_nodes(o: &Overlay, t: NodeTypeId, nodes: &[u32]) -> Result<()> {
    check_below(o.graph(), t, nodes, o.added()[t.index()])
}

/// Refuses nodes beyond type `t`'s count (callers map ids first; this guards the model).
fn check_nodes(g: &graphs::HetGraph, t: NodeTypeId, nodes: &[u32]) -> Result<()> {
    check_below(g, t, nodes, 0)
}

/// Refuses nodes beyond type `t`'s count plus `added` new ones.
fn check_below(g: &graphs::HetGraph, t: NodeTypeId, nodes: &[u32], added: u32) -> Result<()> {
    let nt = g.node_type(t);
    let count = u64::from(nt.count) + u64::from(added);
    let with_new = if added > 0 {
        " with the request's new ones"
    } else {
        ""
    };
    match nodes.iter().find(|&&v| u64::from(v) >= count) {
        Some(v) => Err(ServeError::UnknownNodes(format!(
            "node {v} is beyond the {count} nodes of type '{}'{with_new}",
            nt.name
        ))),
        None => Ok(()),
    }
}

/// The node task a head answers, as configs spell it.
pub fn head_task(h: Head) -> &'static str {
    match h {
        Head::Classes => "node-classification",
        Head::Value => "node-regression",
        Head::Labels => "multi-label",
    }
}

/// Stored rows of `nodes` of type `t`.
fn rows_of(rows: &[Option<TypeRows>], t: NodeTypeId, nodes: &[u32]) -> Result<Rows> {
    let r = rows
        .get(t.index())
        .and_then(Option::as_ref)
        .ok_or_else(|| {
            ServeError::BadRequest("the model computes no embeddings of this node type".into())
        })?;
    let mut data = Vec::with_capacity(nodes.len() * r.width);
    for &v in nodes {
        let at = v as usize * r.width;
        data.extend_from_slice(
            r.data
                .get(at..at + r.width)
                .ok_or_else(|| ServeError::Inference(format!("node {v} beyond the stored rows")))?,
        );
    }
    Ok(Rows {
        width: r.width,
        data,
    })
}

/// A 2-D tensor's values as rows of f32.
fn to_rows(x: &candle_core::Tensor) -> Result<Rows> {
    let (_, width) = x.dims2()?;
    Ok(Rows {
        width,
        data: x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
    })
}

/// The index of the largest value (the first of equals, as candle's argmax).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The answers of one head (its kind and its columns of `logits`, the
/// target nodes' output rows): a class (argmax), a value, or the labels
/// whose logit is above 0, per row; probabilities and the embeddings `emb`
/// where `want` asks for them.
pub fn answers(
    head: (Head, std::ops::Range<usize>),
    logits: &Rows,
    emb: Option<Rows>,
    want: Want,
) -> Classified {
    let own;
    let logits = match head.1.len() == logits.width {
        true => logits,
        false => {
            own = logits.columns(head.1.clone());
            &own
        }
    };
    let n = logits.data.len() / logits.width.max(1);
    if head.0 == Head::Value {
        return Classified {
            values: Some(logits.data.clone()),
            embeddings: emb,
            ..Classified::default()
        };
    }
    if head.0 == Head::Labels {
        // A label is predicted where its logit is above 0 (probability above 0.5).
        let labels = (0..n)
            .map(|i| {
                let row = logits.row(i).iter().enumerate();
                row.filter(|(_, &x)| x > 0.0)
                    .map(|(j, _)| j as u32)
                    .collect()
            })
            .collect();
        return Classified {
            labels: Some(labels),
            probabilities: want.probabilities.then(|| sigmoid(logits)),
            embeddings: emb,
            ..Classified::default()
        };
    }
    Classified {
        classes: (0..n).map(|i| argmax(logits.row(i))).collect(),
        probabilities: want.probabilities.then(|| softmax(logits)),
        embeddings: emb,
        ..Classified::default()
    }
}

/// Element-wise logistic sigmoid, in f64.
fn sigmoid(logits: &Rows) -> Rows {
    Rows {
        width: logits.width,
        data: logits
            .data
            .iter()
            .map(|&x| (1.0 / (1.0 + (-f64::from(x)).exp())) as f32)
            .collect(),
    }
}

/// Row-wise softmax, computed stably in f64.
fn softmax(logits: &Rows) -> Rows {
    let mut data = Vec::with_capacity(logits.data.len());
    for i in 0..logits.data.len() / logits.width.max(1) {
        let row = logits.row(i);
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f64> = row.iter().map(|&v| f64::from(v - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        data.extend(exps.iter().map(|&e| (e / sum) as f32));
    }
    Rows {
        width: logits.width,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_equal_values() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[-2.0]), 0);
    }

    #[test]
    fn softmax_rows_sum_to_one_and_keep_order() {
        let p = softmax(&Rows {
            width: 3,
            data: vec![1.0, 2.0, 3.0, 1000.0, 0.0, -1000.0],
        });
        for i in 0..2 {
            let s: f32 = p.row(i).iter().sum();
            assert!((s - 1.0).abs() < 1e-6, "{s}");
        }
        assert!(p.row(0)[2] > p.row(0)[1] && p.row(0)[1] > p.row(0)[0]);
        assert!((p.row(1)[0] - 1.0).abs() < 1e-6);
    }
}
