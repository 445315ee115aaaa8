//! The dense-gradient all-reduce of a step: every trainer ends with the sum
//! of all trainers' gradients, added in trainer order so that every replica
//! applies the same update, bit for bit. All-gather (each sends its whole
//! vector to all) or a ring (reduce-scatter then all-gather, in chunks).

use std::collections::BTreeMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor};
use futures_util::future::join_all;
use models::optim::Adam;
use models::params::ParamStore;
use runtime::{ActorRef, ByteVec};

use super::client::Client;
use crate::config::AllReduce;
use crate::distributed::messages::GradShare;
use crate::error::{Result, TrainError};

/// The trainers of one all-reduce, and this one among them.
pub struct Group<'a> {
    /// Every trainer's inbox, in trainer order.
    pub trainers: &'a [ActorRef],
    /// This trainer.
    pub me: u32,
    /// The step.
    pub seq: u64,
    /// All-gather or ring.
    pub kind: AllReduce,
}

/// What a step's vector adds up besides the gradients.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    /// The loss (each trainer's share of it).
    pub loss: f64,
    /// Correct training predictions.
    pub correct: f64,
    /// Training examples counted (where the step's global count is not
    /// known to every trainer: edge tasks' hashed steps).
    pub seen: f64,
    /// Multi-task: each task's own loss (each trainer's share of it).
    pub each: Vec<f64>,
}

/// Values in a step's vector after every parameter's with one task: a
/// presence flag per parameter, then the loss, the correct count and the
/// examples seen (each task's loss comes before them with several).
pub fn extra(params: &ParamStore) -> usize {
    params.len() + 3
}

/// A step's dense gradients as one vector: every parameter's values in
/// parameter order (zeros where `grads` has none), a presence flag per
/// parameter, then the step's [`Tally`] (each task's loss, the loss, the
/// correct count, the examples seen).
pub fn flatten(params: &ParamStore, grads: Option<&GradStore>, tally: Tally) -> Result<Vec<f32>> {
    flatten_named(
        params,
        |_, var| grads.and_then(|gs| gs.get(var.as_tensor())).cloned(),
        tally,
    )
}

/// [`flatten`] with each parameter's gradient from `grad(name, var)`.
pub fn flatten_named(
    params: &ParamStore,
    grad: impl Fn(&str, &candle_core::Var) -> Option<Tensor>,
    tally: Tally,
) -> Result<Vec<f32>> {
    let mut flat = Vec::new();
    let mut flags = Vec::new();
    for (name, var) in params.iter() {
        match grad(name, var) {
            Some(gr) => {
                flat.extend(gr.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
                flags.push(1.0);
            }
            None => {
                flat.resize(flat.len() + var.elem_count(), 0.0);
                flags.push(0.0);
            }
        }
    }
    flat.extend(flags);
    flat.extend(tally.each.iter().map(|&x| x as f32));
    flat.extend([tally.loss, tally.correct, tally.seen].map(|x| x as f32));
    Ok(flat)
}

/// One Adam step from `sum`, the all-reduced [`flatten`] vectors: only the
/// parameters some trainer had a gradient for move. Returns the summed [`Tally`].
pub fn apply(params: &ParamStore, adam: &mut Adam, sum: &[f32]) -> Result<Tally> {
    let values: usize = params.iter().map(|(_, v)| v.elem_count()).sum();
    // What follows the flags: the tasks' losses, then the three counts.
    let tasks = sum
        .len()
        .checked_sub(values + extra(params))
        .ok_or_else(|| TrainError::Protocol("a gradient vector shorter than the model".into()))?;
    let mut named = BTreeMap::new();
    let mut at = 0;
    for (i, (name, var)) in params.iter().enumerate() {
        let n = var.elem_count();
        if sum[values + i] > 0.0 {
            named.insert(
                name.to_string(),
                Tensor::from_slice(&sum[at..at + n], var.shape(), var.device())?
                    .to_dtype(var.dtype())?,
            );
        }
        at += n;
    }
    adam.step_named(params, &named)?;
    let at = |k: usize| f64::from(sum[sum.len() - k]);
    let first = values + params.len();
    Ok(Tally {
        loss: at(3),
        correct: at(2),
        seen: at(1),
        each: sum[first..first + tasks]
            .iter()
            .map(|&x| f64::from(x))
            .collect(),
    })
}

/// Sums `mine` with the other trainers' vectors of this step, in trainer
/// order, while `pushes` (this step's embedding gradients) travel; both are
/// acknowledged before it returns. A store serves this step's rows to the
/// next only once every push has arrived (see `Pull::after`).
pub fn all_reduce<P>(c: &Client, g: &Group, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
where
    P: std::future::Future<Output = Result<()>>,
{
    match g.kind {
        AllReduce::AllGather => all_gather(c, g, mine, pushes),
        AllReduce::Ring => ring(c, g, mine, pushes),
    }
}

/// Every trainer sends its whole vector to every other and sums all of
/// them in trainer order: one round, (K-1)·n values sent per trainer.
fn all_gather<P>(c: &Client, g: &Group, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
where
    P: std::future::Future<Output = Result<()>>,
{
    let me = g.me;
    let bytes = ByteVec(bytemuck::cast_slice(&mine).to_vec());
    let asks = g
        .trainers
        .iter()
        .enumerate()
        .filter(|(p, _)| *p as u32 != me)
        .map(|(_, r)| {
            r.ask(
                GradShare {
                    gen: c.gen,
                    seq: g.seq,
                    round: 0,
                    from: me,
                    data: bytes.clone(),
                },
                c.timeouts.ask,
            )
        });
    let (shared, pushed) =
        c.block_on(futures_util::future::join(join_all(asks), join_all(pushes)))?;
    for r in shared {
        r?;
    }
    for r in pushed {
        r?;
    }
    let k = g.trainers.len() as u32;
    let others: Vec<u32> = (0..k).filter(|&p| p != me).collect();
    let mut shares = c
        .inbox
        .gradients(g.seq, 0, &others, mine.len(), c.timeouts.step)?
        .into_iter();
    let mut sum = vec![0.0f32; mine.len()];
    for p in 0..k {
        let v = if p == me {
            mine.clone()
        } else {
            shares.next().expect("one share per peer")
        };
        sum.iter_mut().zip(&v).for_each(|(a, b)| *a += b);
    }
    Ok(sum)
}

/// Ring all-reduce: K-1 rounds of reduce-scatter, then K-1 of all-gather,
/// one chunk of n/K values to the next trainer per round: 2(K-1)/K·n
/// values sent per trainer. Each chunk is summed once, on one trainer,
/// and copied to the others, so every replica gets the same bits.
fn ring<P>(c: &Client, g: &Group, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
where
    P: std::future::Future<Output = Result<()>>,
{
    let (k, r, n) = (g.trainers.len(), g.me as usize, mine.len());
    let mut pushes = Some(join_all(pushes));
    let mut v = mine;
    let span = |c: usize| c * n / k..(c + 1) * n / k;
    let next = &g.trainers[(r + 1) % k];
    let prev = ((r + k - 1) % k) as u32;
    for i in 0..2 * (k - 1) {
        let (send, recv) = if i < k - 1 {
            ((r + k - i) % k, (r + 2 * k - i - 1) % k)
        } else {
            let j = i - (k - 1);
            ((r + 1 + k - j) % k, (r + k - j) % k)
        };
        let msg = GradShare {
            gen: c.gen,
            seq: g.seq,
            round: i as u32,
            from: g.me,
            data: ByteVec(bytemuck::cast_slice(&v[span(send)]).to_vec()),
        };
        let ask = next.ask(msg, c.timeouts.ask);
        match pushes.take() {
            Some(p) => {
                let (sent, pushed) = c.block_on(futures_util::future::join(ask, p))?;
                sent?;
                for r in pushed {
                    r?;
                }
            }
            None => c.block_on(ask)??,
        }
        let got = c
            .inbox
            .gradients(g.seq, i as u32, &[prev], span(recv).len(), c.timeouts.step)?
            .remove(0);
        let dst = &mut v[span(recv)];
        if i < k - 1 {
            dst.iter_mut().zip(&got).for_each(|(a, b)| *a += b);
        } else {
            dst.copy_from_slice(&got);
        }
    }
    if let Some(p) = pushes {
        for r in c.block_on(p)? {
            r?;
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};
    use models::optim::{Adam, AdamConfig};
    use models::params::ParamStore;

    use super::{apply, flatten, Tally};

    #[test]
    fn a_step_vector_carries_each_tasks_loss_through_to_the_sum() {
        let mut params = ParamStore::new();
        params.zeros("w", 4, DType::F32, &Device::Cpu).unwrap();
        let tally = Tally {
            loss: 1.5,
            correct: 3.0,
            seen: 0.0,
            each: vec![0.25, 2.5],
        };
        let flat = flatten(&params, None, tally.clone()).unwrap();
        // Four values, one flag, two tasks, three counts.
        assert_eq!(flat.len(), 4 + 1 + 2 + 3);
        let mut adam = Adam::new(AdamConfig {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        });
        assert_eq!(apply(&params, &mut adam, &flat).unwrap(), tally);
        // One task: nothing between the flags and the counts.
        let one = Tally {
            each: Vec::new(),
            ..tally
        };
        let flat = flatten(&params, None, one.clone()).unwrap();
        assert_eq!(apply(&params, &mut adam, &flat).unwrap(), one);
        // A vector that cannot hold the model is a protocol violation.
        let err = apply(&params, &mut adam, &flat[..6]).unwrap_err();
        assert!(err.to_string().contains("shorter than the model"), "{err}");
    }
}
