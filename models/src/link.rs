//! Link prediction's head: the decoder that scores an edge from its
//! endpoints' embeddings, the training losses, and the ranking metrics.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// How an edge `u -> v` of relation `r` is scored from the last layer's rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decoder {
    /// `<h_u, h_v>`.
    #[default]
    Dot,
    /// `<h_u, diag(d_r), h_v>`, a learned diagonal per relation (initialised to ones).
    Distmult,
}

/// The training loss over a batch's positive and negative scores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkLoss {
    /// Binary cross-entropy with logits, averaged over every positive and
    /// negative score (DGL's and GraphStorm's default).
    #[default]
    CrossEntropy,
    /// Softmax cross-entropy of each positive against its own negatives
    /// (InfoNCE), averaged over positives.
    Contrastive,
}

/// What makes a model a link predictor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkSpec {
    /// The target relations (canonical names), in the order edges refer to them.
    pub relations: Vec<String>,
    /// The decoder.
    pub decoder: Decoder,
}

/// Name of relation `r`'s diagonal in the parameter store.
pub fn diagonal_name(relation: &str) -> String {
    format!("decoder.{relation}.diag")
}

/// Scores of edges whose endpoints' rows are `src` and `dst` (`[n, width]`
/// each), with `diag` the relation's diagonal for DistMult: `[n]`.
pub fn score(src: &Tensor, dst: &Tensor, diag: Option<&Tensor>) -> Result<Tensor> {
    let s = match diag {
        Some(d) => src.broadcast_mul(d)?,
        None => src.clone(),
    };
    Ok((s * dst)?.sum(1)?)
}

/// `log(1 + exp(x))`, computed without overflow.
fn softplus(x: &Tensor) -> Result<Tensor> {
    let tail = x.abs()?.neg()?.exp()?.affine(1.0, 1.0)?.log()?;
    Ok((x.relu()? + tail)?)
}

/// The loss of positive scores `pos` (`[p]`) against negative scores `neg`
/// (`[p, k]`, row `i` the negatives of positive `i`), divided by `denominator`
/// rather than averaged, so that trainers holding parts of a batch can sum
/// their shares: for [`LinkLoss::CrossEntropy`] pass the number of scores in
/// the whole batch (`p·(1+k)`), for [`LinkLoss::Contrastive`] its positives.
pub fn loss(kind: LinkLoss, pos: &Tensor, neg: &Tensor, denominator: f64) -> Result<Tensor> {
    if denominator <= 0.0 {
        return Err(ModelError::Config("a link-prediction loss over no edges".into()));
    }
    let total = match kind {
        LinkLoss::CrossEntropy => (softplus(&pos.neg()?)?.sum_all()? + softplus(neg)?.sum_all()?)?,
        LinkLoss::Contrastive => {
            let logits = Tensor::cat(&[&pos.unsqueeze(1)?, neg], 1)?;
            candle_nn::ops::log_softmax(&logits, 1)?.narrow(1, 0, 1)?.sum_all()?.neg()?
        }
    };
    Ok((total / denominator)?)
}

/// Ranking metrics of positives against their fixed negatives, summed (divide by `count`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankSums {
    /// Edges ranked.
    pub count: u64,
    /// Sum of reciprocal ranks.
    pub reciprocal: f64,
    /// Edges ranked first.
    pub hits1: u64,
    /// Edges ranked in the first 10.
    pub hits10: u64,
    /// Edges ranked in the first 100.
    pub hits100: u64,
}

impl RankSums {
    /// Ranks positive scores `pos` (`[p]`) against `neg` (`[p, k]`): the OGB
    /// rank, `1 +` the mean of the negatives scored above and those scored
    /// at least as high (ties count half).
    pub fn add(&mut self, pos: &Tensor, neg: &Tensor) -> Result<()> {
        let pos: Vec<f32> = pos.to_dtype(DType::F32)?.to_vec1()?;
        let neg: Vec<Vec<f32>> = neg.to_dtype(DType::F32)?.to_vec2()?;
        for (p, row) in pos.iter().zip(&neg) {
            let above = row.iter().filter(|&&n| n > *p).count() as f64;
            let tied = row.iter().filter(|&&n| n >= *p).count() as f64;
            let rank = 1.0 + 0.5 * (above + tied);
            self.count += 1;
            self.reciprocal += 1.0 / rank;
            self.hits1 += u64::from(rank <= 1.0);
            self.hits10 += u64::from(rank <= 10.0);
            self.hits100 += u64::from(rank <= 100.0);
        }
        Ok(())
    }

    /// Adds another part's sums.
    pub fn merge(&mut self, o: &RankSums) {
        self.count += o.count;
        self.reciprocal += o.reciprocal;
        self.hits1 += o.hits1;
        self.hits10 += o.hits10;
        self.hits100 += o.hits100;
    }

    /// Mean reciprocal rank.
    pub fn mrr(&self) -> f64 {
        self.reciprocal / self.count.max(1) as f64
    }

    /// Share of edges ranked in the first `k` (1, 10 or 100).
    pub fn hits(&self, k: u32) -> f64 {
        let n = match k {
            1 => self.hits1,
            10 => self.hits10,
            _ => self.hits100,
        };
        n as f64 / self.count.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(v: &[f32]) -> Tensor {
        Tensor::new(v, &Device::Cpu).unwrap()
    }

    #[test]
    fn cross_entropy_is_the_mean_of_the_logistic_losses() {
        let pos = t(&[2.0, -1.0]);
        let neg = Tensor::new(&[[0.5f32, -3.0], [100.0, -100.0]], &Device::Cpu).unwrap();
        let sp = |x: f64| (1.0 + x.exp()).ln();
        let want = (sp(-2.0) + sp(1.0) + sp(0.5) + sp(-3.0) + 100.0 + sp(-100.0)) / 6.0;
        let got = loss(LinkLoss::CrossEntropy, &pos, &neg, 6.0).unwrap().to_scalar::<f32>().unwrap();
        assert!((f64::from(got) - want).abs() < 1e-5, "{got} vs {want}");
        let c = loss(LinkLoss::Contrastive, &pos, &neg, 2.0).unwrap().to_scalar::<f32>().unwrap();
        let lse = |v: &[f64]| v.iter().map(|x| x.exp()).sum::<f64>().ln();
        let want = ((lse(&[2.0, 0.5, -3.0]) - 2.0) + (lse(&[-1.0, 100.0, -100.0]) + 1.0)) / 2.0;
        assert!((f64::from(c) - want).abs() < 1e-4, "{c} vs {want}");
        assert!(loss(LinkLoss::CrossEntropy, &pos, &neg, 0.0).is_err());
    }

    #[test]
    fn ranks_follow_the_ogb_convention() {
        let mut r = RankSums::default();
        let neg = Tensor::new(&[[0.0f32, 1.0, 2.0], [5.0, 5.0, 0.0], [9.0, 8.0, 7.0]], &Device::Cpu).unwrap();
        r.add(&t(&[3.0, 5.0, 1.0]), &neg).unwrap();
        // Ranks 1, 1 + (0 + 2)/2 = 2, 4.
        assert_eq!(r.count, 3);
        assert!((r.mrr() - (1.0 + 0.5 + 0.25) / 3.0).abs() < 1e-12);
        assert_eq!((r.hits1, r.hits10, r.hits100), (1, 3, 3));
    }

    #[test]
    fn distmult_scales_each_dimension() {
        let a = Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[3.0f32, 4.0]], &Device::Cpu).unwrap();
        assert_eq!(score(&a, &b, None).unwrap().to_vec1::<f32>().unwrap(), vec![11.0]);
        assert_eq!(score(&a, &b, Some(&t(&[2.0, 0.5]))).unwrap().to_vec1::<f32>().unwrap(), vec![10.0]);
    }
}
