//! Feature transforms: statistics fitted on a first pass over a node table,
//! then applied row by row on a second. The fitted form is saved beside the
//! graph so that later data can be transformed identically.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::config::{FeatureSpec, Fill, Transform};
use crate::source::Cells;

/// Quantile points kept per column by rank-gauss.
const RANK_GAUSS_POINTS: usize = 1001;

/// A feature block with its fitted statistics: all that applying it needs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FittedBlock {
    /// Source columns.
    pub columns: Vec<String>,
    /// Value of a missing cell.
    pub fill: Option<Fill>,
    /// The transform and its statistics.
    pub fitted: Fitted,
}

/// A transform's fitted statistics, per column.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "transform", rename_all = "kebab-case")]
pub enum Fitted {
    /// As is.
    None,
    /// `(x - min) / (max - min)`; 0 where max = min.
    MinMax {
        /// Per-column minimum.
        min: Vec<f64>,
        /// Per-column maximum.
        max: Vec<f64>,
    },
    /// `(x - mean) / std`; `x - mean` where std = 0.
    Standard {
        /// Per-column mean.
        mean: Vec<f64>,
        /// Per-column population standard deviation.
        std: Vec<f64>,
    },
    /// Rank through the quantiles, then the standard normal's quantile function.
    RankGauss {
        /// Per-column ascending quantile points.
        quantiles: Vec<Vec<f64>>,
    },
    /// One-hot of `boundaries.partition_point(|b| b <= x)`.
    Bucketize {
        /// Ascending boundaries.
        boundaries: Vec<f64>,
    },
    /// One-hot of the category among the sorted categories; unseen: all zero.
    OneHot {
        /// Per-column sorted categories.
        categories: Vec<Vec<String>>,
    },
    /// Multi-hot of the categories in a list cell.
    MultiHot {
        /// Per-column sorted categories.
        categories: Vec<Vec<String>>,
        /// Separator of a text cell.
        separator: String,
    },
    /// Links to the nodes of a category type (no feature columns).
    Embedding {
        /// Per-column sorted categories: the category type's nodes, in id order.
        categories: Vec<Vec<String>>,
        /// Separator of a text cell holding several categories (none: one per cell).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        separator: Option<String>,
    },
}

/// A problem with one cell: the column's index in the block and the message.
pub type CellError = (usize, String);

impl FittedBlock {
    /// Output width.
    pub fn width(&self) -> usize {
        let cols = self.columns.len();
        match &self.fitted {
            Fitted::None
            | Fitted::MinMax { .. }
            | Fitted::Standard { .. }
            | Fitted::RankGauss { .. } => cols,
            Fitted::Bucketize { boundaries } => cols * (boundaries.len() + 1),
            Fitted::OneHot { categories } | Fitted::MultiHot { categories, .. } => {
                categories.iter().map(Vec::len).sum()
            }
            Fitted::Embedding { .. } => 0,
        }
    }

    /// The categories of each column, when the block is an embedding's.
    pub fn embedding_categories(&self) -> Option<&[Vec<String>]> {
        match &self.fitted {
            Fitted::Embedding { categories, .. } => Some(categories),
            _ => None,
        }
    }

    /// An embedding block's links of row `row`: `(column, category id)` for
    /// every known category of each column (an unseen one links nothing).
    pub fn links(
        &self,
        cells: &[&Cells],
        row: usize,
        out: &mut Vec<(usize, u32)>,
    ) -> Result<(), CellError> {
        let Fitted::Embedding {
            categories,
            separator,
        } = &self.fitted
        else {
            return Ok(());
        };
        for (c, col) in cells.iter().enumerate() {
            let items =
                embedding_items(col, row, &self.fill, separator.as_deref()).map_err(|p| (c, p))?;
            let mut ks: Vec<(usize, u32)> = items
                .iter()
                .filter_map(|item| categories[c].binary_search(item).ok())
                .map(|k| (c, k as u32))
                .collect();
            // A category listed twice in a cell links once.
            ks.sort_unstable();
            ks.dedup();
            out.extend(ks);
        }
        Ok(())
    }

    /// Appends row `row` of `cells` (one entry per column) to `out`.
    pub fn apply(&self, cells: &[&Cells], row: usize, out: &mut Vec<f32>) -> Result<(), CellError> {
        for (c, col) in cells.iter().enumerate() {
            let start = out.len();
            self.apply_column(c, col, row, out)?;
            // Finite inputs can still overflow a scale (a span beyond f64, a
            // value beyond f32): refused here rather than found at training.
            if let Some(v) = out[start..].iter().find(|v| !v.is_finite()) {
                return Err((
                    c,
                    format!(
                        "the {} transform gives {v} here: the value is out of range",
                        self.fitted_name()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn fitted_name(&self) -> &'static str {
        match &self.fitted {
            Fitted::None => "none",
            Fitted::MinMax { .. } => "min-max",
            Fitted::Standard { .. } => "standard",
            Fitted::RankGauss { .. } => "rank-gauss",
            Fitted::Bucketize { .. } => "bucketize",
            Fitted::OneHot { .. } => "one-hot",
            Fitted::MultiHot { .. } => "multi-hot",
            Fitted::Embedding { .. } => "embedding",
        }
    }

    fn apply_column(
        &self,
        c: usize,
        col: &Cells,
        row: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), CellError> {
        {
            match &self.fitted {
                Fitted::None => {
                    let v = match col.number_f32(row).map_err(|p| (c, p))? {
                        Some(v) => v,
                        None => fill_number(&self.fill).map_err(|p| (c, p))? as f32,
                    };
                    if !v.is_finite() {
                        return Err((c, format!("{v} is not a finite number")));
                    }
                    out.push(v);
                }
                Fitted::MinMax { min, max } => {
                    let x = number(col, row, &self.fill).map_err(|p| (c, p))?;
                    let span = max[c] - min[c];
                    out.push(if span > 0.0 {
                        ((x - min[c]) / span) as f32
                    } else {
                        0.0
                    });
                }
                Fitted::Standard { mean, std } => {
                    let x = number(col, row, &self.fill).map_err(|p| (c, p))?;
                    let d = x - mean[c];
                    out.push(if std[c] > 0.0 {
                        (d / std[c]) as f32
                    } else {
                        d as f32
                    });
                }
                Fitted::RankGauss { quantiles } => {
                    let x = number(col, row, &self.fill).map_err(|p| (c, p))?;
                    out.push(rank_gauss(&quantiles[c], x) as f32);
                }
                Fitted::Bucketize { boundaries } => {
                    let x = number(col, row, &self.fill).map_err(|p| (c, p))?;
                    let b = boundaries.partition_point(|&v| v <= x);
                    let start = out.len();
                    out.resize(start + boundaries.len() + 1, 0.0);
                    out[start + b] = 1.0;
                }
                Fitted::OneHot { categories } => {
                    let cat = category(col, row, &self.fill).map_err(|p| (c, p))?;
                    let start = out.len();
                    out.resize(start + categories[c].len(), 0.0);
                    if let Ok(k) = categories[c].binary_search(&cat) {
                        out[start + k] = 1.0;
                    }
                }
                Fitted::MultiHot {
                    categories,
                    separator,
                } => {
                    let items = list(col, row, &self.fill, separator).map_err(|p| (c, p))?;
                    let start = out.len();
                    out.resize(start + categories[c].len(), 0.0);
                    for item in items {
                        if let Ok(k) = categories[c].binary_search(&item) {
                            out[start + k] = 1.0;
                        }
                    }
                }
                Fitted::Embedding { .. } => {}
            }
        }
        Ok(())
    }
}

/// Accumulates the statistics of one block over the rows of a first pass.
#[derive(Debug)]
pub struct Fitter {
    spec: FeatureSpec,
    acc: Acc,
}

#[derive(Debug)]
enum Acc {
    Nothing,
    MinMax(Vec<(f64, f64)>),
    /// Welford's running (count, mean, sum of squared deviations).
    Moments(Vec<(u64, f64, f64)>),
    Values(Vec<Vec<f64>>),
    Categories(Vec<BTreeSet<String>>),
}

impl Fitter {
    /// A fitter for `spec`.
    pub fn new(spec: &FeatureSpec) -> Fitter {
        let n = spec.columns.len();
        let acc = match spec.transform {
            Transform::None | Transform::Bucketize => Acc::Nothing,
            Transform::MinMax => Acc::MinMax(vec![(f64::INFINITY, f64::NEG_INFINITY); n]),
            Transform::Standard => Acc::Moments(vec![(0, 0.0, 0.0); n]),
            Transform::RankGauss => Acc::Values(vec![Vec::new(); n]),
            Transform::OneHot | Transform::MultiHot | Transform::Embedding => {
                Acc::Categories(vec![BTreeSet::new(); n])
            }
        };
        Fitter {
            spec: spec.clone(),
            acc,
        }
    }

    /// Whether fitting reads the columns at all.
    pub fn needs_data(&self) -> bool {
        !matches!(self.acc, Acc::Nothing)
    }

    /// Takes row `row` of `cells` into the statistics.
    pub fn observe(&mut self, cells: &[&Cells], row: usize) -> Result<(), CellError> {
        let fill = &self.spec.fill;
        let max_categories = self
            .spec
            .max_categories
            .unwrap_or(match self.spec.transform {
                Transform::Embedding => 1_000_000,
                _ => 1000,
            });
        let separator = self.spec.separator.as_deref().unwrap_or(";");
        for (c, col) in cells.iter().enumerate() {
            match &mut self.acc {
                Acc::Nothing => {}
                Acc::MinMax(m) => {
                    let x = number(col, row, fill).map_err(|p| (c, p))?;
                    m[c] = (m[c].0.min(x), m[c].1.max(x));
                }
                Acc::Moments(m) => {
                    let x = number(col, row, fill).map_err(|p| (c, p))?;
                    let (n, mean, m2) = &mut m[c];
                    *n += 1;
                    let d = x - *mean;
                    *mean += d / *n as f64;
                    *m2 += d * (x - *mean);
                }
                Acc::Values(v) => v[c].push(number(col, row, fill).map_err(|p| (c, p))?),
                Acc::Categories(sets) => {
                    let items = if self.spec.transform == Transform::MultiHot {
                        list(col, row, fill, separator).map_err(|p| (c, p))?
                    } else if self.spec.transform == Transform::Embedding {
                        embedding_items(col, row, fill, self.spec.separator.as_deref())
                            .map_err(|p| (c, p))?
                    } else {
                        vec![category(col, row, fill).map_err(|p| (c, p))?]
                    };
                    for item in items {
                        if !sets[c].contains(&item) {
                            if sets[c].len() >= max_categories {
                                return Err((c, format!("more than {max_categories} distinct categories (raise `max_categories`, or use a numeric transform)")));
                            }
                            sets[c].insert(item);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The fitted block.
    pub fn finish(self) -> FittedBlock {
        let spec = self.spec;
        let fitted = match (spec.transform, self.acc) {
            (Transform::MinMax, Acc::MinMax(m)) => Fitted::MinMax {
                min: m
                    .iter()
                    .map(|p| if p.0.is_finite() { p.0 } else { 0.0 })
                    .collect(),
                max: m
                    .iter()
                    .map(|p| if p.1.is_finite() { p.1 } else { 0.0 })
                    .collect(),
            },
            (Transform::Standard, Acc::Moments(m)) => Fitted::Standard {
                mean: m.iter().map(|p| p.1).collect(),
                std: m
                    .iter()
                    .map(|&(n, _, m2)| if n > 0 { (m2 / n as f64).sqrt() } else { 0.0 })
                    .collect(),
            },
            (Transform::RankGauss, Acc::Values(v)) => Fitted::RankGauss {
                quantiles: v.into_iter().map(quantiles).collect(),
            },
            (Transform::Bucketize, _) => Fitted::Bucketize {
                boundaries: spec.boundaries.clone().unwrap_or_default(),
            },
            (Transform::OneHot, Acc::Categories(s)) => Fitted::OneHot {
                categories: s.into_iter().map(|s| s.into_iter().collect()).collect(),
            },
            (Transform::MultiHot, Acc::Categories(s)) => Fitted::MultiHot {
                categories: s.into_iter().map(|s| s.into_iter().collect()).collect(),
                separator: spec.separator.clone().unwrap_or_else(|| ";".into()),
            },
            (Transform::Embedding, Acc::Categories(s)) => Fitted::Embedding {
                categories: s.into_iter().map(|s| s.into_iter().collect()).collect(),
                separator: spec.separator.clone(),
            },
            _ => Fitted::None,
        };
        FittedBlock {
            columns: spec.columns,
            fill: spec.fill,
            fitted,
        }
    }
}

fn fill_number(fill: &Option<Fill>) -> Result<f64, String> {
    match fill {
        Some(Fill::Number(v)) => Ok(*v),
        _ => Err("missing value (declare a `fill` to accept missing values)".into()),
    }
}

fn number(col: &Cells, row: usize, fill: &Option<Fill>) -> Result<f64, String> {
    let x = match col.number(row)? {
        Some(x) => x,
        None => fill_number(fill)?,
    };
    if x.is_finite() {
        Ok(x)
    } else {
        Err(format!("{x} is not a finite number"))
    }
}

/// The categories of an embedding cell: a list's items, a text's parts
/// when a separator is given, else the one category.
fn embedding_items(
    col: &Cells,
    row: usize,
    fill: &Option<Fill>,
    separator: Option<&str>,
) -> Result<Vec<String>, String> {
    match (col, separator) {
        (Cells::List(_), _) => list(col, row, fill, separator.unwrap_or(";")),
        (_, Some(sep)) => list(col, row, fill, sep),
        (_, None) => category(col, row, fill).map(|c| vec![c]),
    }
}

fn category(col: &Cells, row: usize, fill: &Option<Fill>) -> Result<String, String> {
    match (col, col.text(row), fill) {
        (Cells::List(_), _, _) => {
            Err("a list where one category is expected (use multi-hot)".into())
        }
        (_, Some(t), _) => Ok(t),
        (_, None, Some(Fill::Text(t))) => Ok(t.clone()),
        _ => Err("missing value (declare a `fill` to accept missing values)".into()),
    }
}

fn list(
    col: &Cells,
    row: usize,
    fill: &Option<Fill>,
    separator: &str,
) -> Result<Vec<String>, String> {
    let split = |t: &str| -> Vec<String> {
        t.split(separator)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    match col {
        Cells::List(v) => match &v[row] {
            Some(items) => Ok(items.clone()),
            None => match fill {
                Some(Fill::Text(t)) => Ok(split(t)),
                _ => Err("missing value (declare a `fill` to accept missing values)".into()),
            },
        },
        _ => match (col.text(row), fill) {
            (Some(t), _) => Ok(split(&t)),
            (None, Some(Fill::Text(t))) => Ok(split(t)),
            _ => Err("missing value (declare a `fill` to accept missing values)".into()),
        },
    }
}

/// At most [`RANK_GAUSS_POINTS`] ascending points spanning `values`.
fn quantiles(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    if values.len() <= RANK_GAUSS_POINTS {
        return values;
    }
    let last = (values.len() - 1) as f64;
    (0..RANK_GAUSS_POINTS)
        .map(|k| values[(k as f64 * last / (RANK_GAUSS_POINTS - 1) as f64).round() as usize])
        .collect()
}

/// `x`'s rank among the quantile points in [0, 1] (ties take their middle,
/// between points linearly), mapped through the standard normal's quantile
/// function; the rank is kept within [0.001, 0.999] so the tails stay finite.
fn rank_gauss(q: &[f64], x: f64) -> f64 {
    if q.len() < 2 {
        return 0.0;
    }
    let lo = q.partition_point(|&v| v < x);
    let hi = q.partition_point(|&v| v <= x);
    let pos = if lo < hi {
        (lo + hi - 1) as f64 / 2.0
    } else if lo == 0 {
        0.0
    } else if lo == q.len() {
        (q.len() - 1) as f64
    } else {
        (lo - 1) as f64 + (x - q[lo - 1]) / (q[lo] - q[lo - 1])
    };
    let r = (pos / (q.len() - 1) as f64).clamp(1e-3, 1.0 - 1e-3);
    probit(r)
}

/// The standard normal's quantile function (Acklam's rational approximation,
/// relative error below 1.2e-9).
fn probit(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(t: Transform) -> FeatureSpec {
        FeatureSpec {
            columns: vec!["x".into()],
            transform: t,
            fill: None,
            boundaries: (t == Transform::Bucketize).then(|| vec![0.0, 10.0]),
            separator: None,
            max_categories: None,
        }
    }

    fn fit_apply(t: Transform, cells: Cells) -> Vec<f32> {
        let mut f = Fitter::new(&spec(t));
        for i in 0..cells.len() {
            f.observe(&[&cells], i).unwrap();
        }
        let b = f.finish();
        let mut out = Vec::new();
        for i in 0..cells.len() {
            b.apply(&[&cells], i, &mut out).unwrap();
        }
        assert_eq!(out.len(), cells.len() * b.width());
        out
    }

    #[test]
    fn numeric_transforms_match_their_formulas() {
        let x = || Cells::Float(vec![Some(1.0), Some(3.0), Some(5.0)]);
        assert_eq!(fit_apply(Transform::None, x()), [1.0, 3.0, 5.0]);
        assert_eq!(fit_apply(Transform::MinMax, x()), [0.0, 0.5, 1.0]);
        let s = fit_apply(Transform::Standard, x());
        let sd = (8.0f64 / 3.0).sqrt();
        for (got, want) in s.iter().zip([-2.0 / sd, 0.0, 2.0 / sd]) {
            assert!((f64::from(*got) - want).abs() < 1e-6, "{s:?}");
        }
        let r = fit_apply(Transform::RankGauss, x());
        assert!(r[0] < -3.0 && r[1].abs() < 1e-6 && r[2] > 3.0, "{r:?}");
        let b = fit_apply(
            Transform::Bucketize,
            Cells::Float(vec![Some(-1.0), Some(0.0), Some(12.0)]),
        );
        assert_eq!(b, [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn categories_are_sorted_and_multi_hot_splits_lists() {
        let one = fit_apply(
            Transform::OneHot,
            Cells::Text(vec![Some("b"), Some("a"), Some("b")].into()),
        );
        assert_eq!(one, [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
        let multi = fit_apply(
            Transform::MultiHot,
            Cells::Text(vec![Some("x; y"), Some("z")].into()),
        );
        assert_eq!(multi, [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
        let list = fit_apply(
            Transform::MultiHot,
            Cells::List(vec![Some(vec!["q".into()]), Some(vec![])]),
        );
        assert_eq!(list, [1.0, 0.0]);
    }

    #[test]
    fn missing_and_non_finite_values_are_refused_unless_filled() {
        let cells = Cells::Text(vec![None, Some("nan"), Some("abc")].into());
        let b = Fitter::new(&spec(Transform::None)).finish();
        let mut out = Vec::new();
        assert!(b
            .apply(&[&cells], 0, &mut out)
            .unwrap_err()
            .1
            .contains("fill"));
        assert!(b
            .apply(&[&cells], 1, &mut out)
            .unwrap_err()
            .1
            .contains("finite"));
        assert!(b
            .apply(&[&cells], 2, &mut out)
            .unwrap_err()
            .1
            .contains("not a number"));
        let filled = FittedBlock {
            fill: Some(Fill::Number(7.0)),
            ..b
        };
        filled.apply(&[&cells], 0, &mut out).unwrap();
        assert_eq!(out, [7.0]);
    }

    #[test]
    fn too_many_categories_are_refused() {
        let mut s = spec(Transform::OneHot);
        s.max_categories = Some(2);
        let mut f = Fitter::new(&s);
        let cells = Cells::Int(vec![Some(1), Some(2), Some(3)]);
        f.observe(&[&cells], 0).unwrap();
        f.observe(&[&cells], 1).unwrap();
        assert!(f
            .observe(&[&cells], 2)
            .unwrap_err()
            .1
            .contains("more than 2"));
    }

    #[test]
    fn probit_is_the_normal_quantile() {
        for (p, z) in [
            (0.5, 0.0),
            (0.975, 1.959963985),
            (0.001, -3.090232306),
            (0.9, 1.281551566),
        ] {
            assert!((probit(p) - z).abs() < 1e-6, "{p}");
        }
    }
}
