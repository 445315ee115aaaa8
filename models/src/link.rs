//! Link prediction's head: the decoder that scores an edge from its
//! endpoints' embeddings, the training losses, and the ranking metrics.

use candle_core::Tensor;
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
    Ok((query(src, diag)? * dst)?.sum(1)?)
}

/// What a destination row is dotted with: `src`, times the relation's
/// diagonal for DistMult.
pub fn query(src: &Tensor, diag: Option<&Tensor>) -> Result<Tensor> {
    Ok(match diag {
        Some(d) => src.broadcast_mul(d)?,
        None => src.clone(),
    })
}

/// The probability an edge exists from its score (the decoder's logit): its sigmoid.
pub fn probability(score: f32) -> f32 {
    1.0 / (1.0 + (-score).exp())
}

/// `a · b`, summed in eight lanes then across them, in a fixed order (the
/// same bits on any thread); `a` and `b` have the same length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
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
        return Err(ModelError::Config(
            "a link-prediction loss over no edges".into(),
        ));
    }
    let total = match kind {
        LinkLoss::CrossEntropy => {
            (softplus(&pos.neg()?)?.sum_all()? + softplus(neg)?.sum_all()?)?
        }
        LinkLoss::Contrastive => {
            let logits = Tensor::cat(&[&pos.unsqueeze(1)?, neg], 1)?;
            candle_nn::ops::log_softmax(&logits, 1)?
                .narrow(1, 0, 1)?
                .sum_all()?
                .neg()?
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
    /// Ranks positive scores `pos` against `neg`, `k` negatives per positive,
    /// row after row: the OGB rank, `1 +` the mean of the negatives scored
    /// above and those scored at least as high (ties count half).
    pub fn add(&mut self, pos: &[f32], neg: &[f32], k: usize) -> Result<()> {
        if neg.len() != pos.len() * k {
            return Err(ModelError::Config(format!(
                "{} negative scores for {} positives of {k} each",
                neg.len(),
                pos.len()
            )));
        }
        for (i, p) in pos.iter().enumerate() {
            let row = &neg[i * k..(i + 1) * k];
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

/// Scores (logits) of the edges `src[i] -> dst[i]` of target relation `r`
/// (index into the link spec's relations) of `model`, from every node's
/// rows of the edges' end types: the fixed-order [`dot`] of each source's
/// query row with its destination's row, as exact evaluation ranks them.
pub fn score_rows(
    model: &crate::Model,
    r: usize,
    src_rows: &crate::inference::TypeRows,
    dst_rows: &crate::inference::TypeRows,
    src: &[u32],
    dst: &[u32],
) -> Result<Vec<f32>> {
    use candle_core::DType;
    if src.len() != dst.len() {
        return Err(ModelError::Config(format!(
            "{} sources for {} destinations",
            src.len(),
            dst.len()
        )));
    }
    let w = src_rows.width;
    if dst_rows.width != w {
        return Err(ModelError::Config(format!(
            "embeddings {w} and {} wide cannot be scored together",
            dst_rows.width
        )));
    }
    let row = |t: &crate::inference::TypeRows, v: u32| -> Result<std::ops::Range<usize>> {
        let count = t.data.len() / w.max(1);
        let v = v as usize;
        if v >= count {
            return Err(ModelError::Config(format!(
                "node id {v} is out of range 0..{count}"
            )));
        }
        Ok(v * w..(v + 1) * w)
    };
    // A model with node tasks too: the decoder reads the rows' last `hidden` columns.
    let (hidden, full) = (model.spec().hidden, model.num_classes());
    let skip = match model.spec().is_mixed() && w == full && full > hidden {
        true => full - hidden,
        false => 0,
    };
    fn part(t: &crate::inference::TypeRows, at: std::ops::Range<usize>, skip: usize) -> &[f32] {
        &t.data[at][skip..]
    }
    let d = w - skip;
    let mut buf = Vec::with_capacity(src.len() * d);
    for &v in src {
        buf.extend_from_slice(part(src_rows, row(src_rows, v)?, skip));
    }
    let s = Tensor::from_vec(buf, (src.len(), d), model.device())?.to_dtype(model.dtype())?;
    let q: Vec<f32> = model
        .link_query(r, &s)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1()?;
    dst.iter()
        .enumerate()
        .map(|(i, &v)| {
            Ok(dot(
                &q[i * d..(i + 1) * d],
                part(dst_rows, row(dst_rows, v)?, skip),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(v: &[f32]) -> Tensor {
        Tensor::new(v, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_host_dot_is_the_scores_dot_and_ties_rank_half() {
        let a: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..67).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        assert!((f64::from(dot(&a, &b)) - want).abs() < 1e-5);
        let score = super::score(
            &t(&a).reshape((1, 67)).unwrap(),
            &t(&b).reshape((1, 67)).unwrap(),
            None,
        )
        .unwrap();
        assert!((score.to_vec1::<f32>().unwrap()[0] - dot(&a, &b)).abs() < 1e-5);
        assert_eq!(dot(&[], &[]), 0.0);
        // A negative scored exactly as its positive counts half.
        let (pos, neg) = (
            [0.5f32, -1.0, 2.0],
            [0.5f32, 0.7, -2.0, 1.0, -1.0, -3.0, 0.0, 0.1, 0.2],
        );
        let mut b = RankSums::default();
        b.add(&pos, &neg, 3).unwrap();
        assert_eq!((b.count, b.hits1, b.hits10), (3, 1, 3));
        assert!(
            (b.reciprocal - (1.0 / 2.5 + 1.0 / 2.5 + 1.0)).abs() < 1e-12,
            "a tie counts half: {}",
            b.reciprocal
        );
        assert!(b.add(&pos, &neg[..8], 3).is_err());
        // No negatives: every edge ranks first.
        let mut c = RankSums::default();
        c.add(&pos, &[], 0).unwrap();
        assert_eq!((c.count, c.hits1), (3, 3));
    }

    #[test]
    fn cross_entropy_is_the_mean_of_the_logistic_losses() {
        let pos = t(&[2.0, -1.0]);
        let neg = Tensor::new(&[[0.5f32, -3.0], [100.0, -100.0]], &Device::Cpu).unwrap();
        let sp = |x: f64| (1.0 + x.exp()).ln();
        let want = (sp(-2.0) + sp(1.0) + sp(0.5) + sp(-3.0) + 100.0 + sp(-100.0)) / 6.0;
        let got = loss(LinkLoss::CrossEntropy, &pos, &neg, 6.0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!((f64::from(got) - want).abs() < 1e-5, "{got} vs {want}");
        let c = loss(LinkLoss::Contrastive, &pos, &neg, 2.0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let lse = |v: &[f64]| v.iter().map(|x| x.exp()).sum::<f64>().ln();
        let want = ((lse(&[2.0, 0.5, -3.0]) - 2.0) + (lse(&[-1.0, 100.0, -100.0]) + 1.0)) / 2.0;
        assert!((f64::from(c) - want).abs() < 1e-4, "{c} vs {want}");
        assert!(loss(LinkLoss::CrossEntropy, &pos, &neg, 0.0).is_err());
    }

    #[test]
    fn ranks_follow_the_ogb_convention() {
        let mut r = RankSums::default();
        r.add(
            &[3.0, 5.0, 1.0],
            &[0.0, 1.0, 2.0, 5.0, 5.0, 0.0, 9.0, 8.0, 7.0],
            3,
        )
        .unwrap();
        // Ranks 1, 1 + (0 + 2)/2 = 2, 4.
        assert_eq!(r.count, 3);
        assert!((r.mrr() - (1.0 + 0.5 + 0.25) / 3.0).abs() < 1e-12);
        assert_eq!((r.hits1, r.hits10, r.hits100), (1, 3, 3));
    }

    #[test]
    fn distmult_scales_each_dimension() {
        let a = Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[3.0f32, 4.0]], &Device::Cpu).unwrap();
        assert_eq!(
            score(&a, &b, None).unwrap().to_vec1::<f32>().unwrap(),
            vec![11.0]
        );
        assert_eq!(
            score(&a, &b, Some(&t(&[2.0, 0.5])))
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            vec![10.0]
        );
    }
}
