//! Picking rows of a table by index (a batch's rows out of a cache), with a
//! kernel that moves them as 16-byte vectors, a warp per row: candle's
//! `index_select` computes each element's place with integer divisions and
//! reached a seventh of an H100's memory bandwidth on a batch's feature rows.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};

/// Rows `ids` of `x` (`[n, d]` f32), as a new `[ids.len(), d]` tensor; not differentiable.
pub fn take_rows(x: &Tensor, ids: &[u32]) -> candle_core::Result<Tensor> {
    if x.dtype() != candle_core::DType::F32 {
        let at = Tensor::from_slice(ids, ids.len(), x.device())?;
        return x.index_select(&at, 0);
    }
    x.contiguous()?.apply_op1_no_bwd(&TakeRows(ids))
}

/// Rows `ids` of the row-major `x` (`width` floats a row), copied in that
/// order; `Err(id)` names the first id past `x`'s rows.
pub fn copy_rows(x: &[f32], width: usize, ids: &[u32]) -> Result<Vec<f32>, u32> {
    let mut out = Vec::with_capacity(ids.len() * width);
    for &v in ids {
        let at = v as usize * width;
        out.extend_from_slice(x.get(at..at + width).ok_or(v)?);
    }
    Ok(out)
}

struct TakeRows<'a>(&'a [u32]);

impl TakeRows<'_> {
    /// Rows and columns of the input, every id checked against its rows.
    fn shape(&self, l: &Layout) -> candle_core::Result<(usize, usize)> {
        let (n, d) = match l.dims() {
            [n, d] => (*n, *d),
            dims => {
                return Err(candle_core::Error::Msg(format!(
                    "take-rows: expected a matrix, got shape {dims:?}"
                )))
            }
        };
        if let Some(&bad) = self.0.iter().find(|&&i| i as usize >= n) {
            return Err(candle_core::Error::Msg(format!(
                "take-rows: row {bad} of {n}"
            )));
        }
        Ok((n, d))
    }
}

impl CustomOp1 for TakeRows<'_> {
    fn name(&self) -> &'static str {
        "take-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, d) = self.shape(l)?;
        let (a, b) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("take-rows needs a contiguous input".into()))?;
        let x = &s.as_slice::<f32>()?[a..b];
        let mut out = Vec::with_capacity(self.0.len() * d);
        for &i in self.0 {
            out.extend_from_slice(&x[i as usize * d..(i as usize + 1) * d]);
        }
        Ok((CpuStorage::F32(out), Shape::from((self.0.len(), d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (_, d) = self.shape(l)?;
        Ok((
            super::cuda::take_rows((s, l), self.0, d)?,
            Shape::from((self.0.len(), d)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn picks_rows_in_order_and_refuses_bad_ids() {
        let x = Tensor::from_vec(
            (0..30).map(|v| v as f32).collect::<Vec<_>>(),
            (10, 3),
            &Device::Cpu,
        )
        .unwrap();
        let y: Vec<f32> = take_rows(&x, &[7, 0, 7, 2])
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(y, [21., 22., 23., 0., 1., 2., 21., 22., 23., 6., 7., 8.]);
        assert!(take_rows(&x, &[10])
            .unwrap_err()
            .to_string()
            .contains("row 10 of 10"));
        let view = x.narrow(0, 2, 3).unwrap();
        let y: Vec<f32> = take_rows(&view, &[1])
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(y, [9., 10., 11.]);
    }
}
