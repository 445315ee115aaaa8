//! Edge tasks' head: a decoder reads the last layer's rows of an edge's two
//! endpoints and writes one logit per class (edge classification) or one
//! value (edge regression). One decoder serves every target relation.

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::params::ParamStore;

/// How an edge's outputs are computed from its endpoints' rows `h_u`, `h_v`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EdgeDecoder {
    /// `W2 · relu(W1 · [h_u ; h_v] + b1) + b2` (GraphStorm's default form).
    #[default]
    Mlp,
    /// `W · (h_u ⊙ h_v) + b`: a DistMult diagonal per output, bilinear in
    /// the two ends.
    Distmult,
}

/// What makes a model an edge predictor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeSpec {
    /// The target relations (canonical names).
    pub relations: Vec<String>,
    /// The decoder.
    pub decoder: EdgeDecoder,
    /// One value per edge (regression); else one logit per class of the
    /// target relations' labels.
    pub values: bool,
}

const MLP_W: &str = "edge.mlp.weight";
const MLP_B: &str = "edge.mlp.bias";
const DISTMULT_W: &str = "edge.distmult.weight";
const OUT_W: &str = "edge.out.weight";
const OUT_B: &str = "edge.out.bias";

impl EdgeSpec {
    /// Checks the spec is usable.
    pub fn validate(&self) -> Result<()> {
        if self.relations.is_empty() {
            return Err(ModelError::Config(
                "an edge task needs at least one target relation".into(),
            ));
        }
        Ok(())
    }

    /// Outputs per edge on `g`: 1 for a value, else the classes the target
    /// relations' labels share.
    pub fn outputs(&self, g: &graphs::HetGraph) -> Result<usize> {
        if self.values {
            return Ok(1);
        }
        let mut classes = None;
        for name in &self.relations {
            let r = g.relation_id(name).ok_or_else(|| {
                ModelError::Config(format!(
                    "target relation '{name}' is not in graph '{}'",
                    g.name()
                ))
            })?;
            let c = g.relation(r).targets().and_then(|t| t.num_classes).ok_or_else(|| {
                ModelError::Config(format!("target relation '{name}' of graph '{}' has no edge labels (edges/{name}/labels.npy and num_classes in schema.json)", g.name()))
            })?;
            if classes.is_some_and(|x| x != c) {
                return Err(ModelError::Config(format!("the target relations' labels have different numbers of classes ({} and {c} for '{name}'): one decoder needs one set of classes", classes.unwrap_or(c))));
            }
            classes = Some(c);
        }
        Ok(classes.unwrap_or(0) as usize)
    }

    /// Adds the decoder's parameters for rows `hidden` wide on `g`.
    pub(crate) fn build(
        &self,
        params: &mut ParamStore,
        seed: u64,
        hidden: usize,
        g: &graphs::HetGraph,
        dtype: DType,
        device: &Device,
    ) -> Result<()> {
        let outputs = self.outputs(g)?;
        match self.decoder {
            EdgeDecoder::Mlp => {
                // Uniform within 1/sqrt(fan-in), as torch's Linear: Glorot's wider
                // draw made the decoder overfit early (docs/guide/tasks.md).
                let b1 = 1.0 / ((2 * hidden) as f64).sqrt();
                params.uniform(seed, MLP_W, (2 * hidden, hidden), b1, dtype, device)?;
                params.uniform(seed, MLP_B, hidden, b1, dtype, device)?;
                let b2 = 1.0 / (hidden as f64).sqrt();
                params.uniform(seed, OUT_W, (hidden, outputs), b2, dtype, device)?;
            }
            EdgeDecoder::Distmult => {
                params.matrix(seed, DISTMULT_W, hidden, outputs, dtype, device)?;
            }
        }
        params.zeros(OUT_B, outputs, dtype, device)?;
        Ok(())
    }

    /// Outputs `[n, outputs]` of edges whose endpoints' rows are `src` and `dst` (`[n, hidden]`).
    pub(crate) fn decode(&self, params: &ParamStore, src: &Tensor, dst: &Tensor) -> Result<Tensor> {
        let get = |name: &str| -> Result<Tensor> {
            Ok(params
                .get(name)
                .ok_or_else(|| ModelError::Config(format!("no edge decoder parameter {name}")))?
                .as_tensor()
                .clone())
        };
        let h = match self.decoder {
            EdgeDecoder::Mlp => {
                let x = Tensor::cat(&[src, dst], 1)?;
                let x = crate::ops::add_bias(&crate::ops::matmul(&x, &get(MLP_W)?)?, &get(MLP_B)?)?;
                crate::ops::matmul(&x.relu()?, &get(OUT_W)?)?
            }
            EdgeDecoder::Distmult => crate::ops::matmul(&(src * dst)?, &get(DISTMULT_W)?)?,
        };
        Ok(crate::ops::add_bias(&h, &get(OUT_B)?)?)
    }
}

/// Outputs `[n, outputs]` of edges `src[i] -> dst[i]` from every node's rows
/// of their end types (`src_rows`, `dst_rows`, as [`crate::inference::embed_all`]
/// returns them); an id outside its type's rows is an error.
pub fn decode_rows(
    model: &crate::Model,
    src_rows: &crate::inference::TypeRows,
    dst_rows: &crate::inference::TypeRows,
    src: &[u32],
    dst: &[u32],
) -> Result<Tensor> {
    if src.len() != dst.len() {
        return Err(ModelError::Config(format!(
            "{} sources for {} destinations",
            src.len(),
            dst.len()
        )));
    }
    let gather = |t: &crate::inference::TypeRows, ids: &[u32]| -> Result<Tensor> {
        let w = t.width;
        let count = t.data.len() / w.max(1);
        let mut buf = Vec::with_capacity(ids.len() * w);
        for &v in ids {
            let v = v as usize;
            if v >= count {
                return Err(ModelError::Config(format!(
                    "node id {v} is out of range 0..{count}"
                )));
            }
            buf.extend_from_slice(&t.data[v * w..(v + 1) * w]);
        }
        Ok(Tensor::from_vec(buf, (ids.len(), w), model.device())?.to_dtype(model.dtype())?)
    };
    let (s, d) = (gather(src_rows, src)?, gather(dst_rows, dst)?);
    Ok(model.decode_edges(&s, &d)?.to_dtype(DType::F32)?)
}
