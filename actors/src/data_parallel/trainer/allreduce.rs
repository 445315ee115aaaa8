//! The dense-gradient all-reduce of a step: every trainer ends with the sum
//! of all trainers' gradients, added in trainer order so that every replica
//! applies the same update, bit for bit. All-gather (each sends its whole
//! vector to all) or a ring (reduce-scatter then all-gather, in chunks).

use futures_util::future::join_all;
use runtime::ByteVec;

use super::{Ctx, Replica};
use crate::config::AllReduce;
use crate::distributed::messages::GradShare;
use crate::error::{Result, TrainError};

impl Replica<'_> {
    /// Sums `mine` with every other trainer's vector of the same step, in trainer order.
    /// Sums `mine` with the other trainers' vectors of this step, in trainer
    /// order, while `pushes` (this step's embedding gradients) travel; both
    /// are acknowledged before it returns. A store serves this step's rows to
    /// the next only once every push has arrived (see [`Pull::after`]).
    pub(super) fn all_reduce<P>(&mut self, ctx: &Ctx, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
    where
        P: std::future::Future<Output = std::result::Result<(), String>>,
    {
        match ctx.s.cfg.allreduce {
            AllReduce::AllGather => self.all_gather(ctx, mine, pushes),
            AllReduce::Ring => self.ring(ctx, mine, pushes),
        }
    }

    /// Every trainer sends its whole vector to every other and sums all of
    /// them in trainer order: one round, (K-1)·n values sent per trainer.
    pub(super) fn all_gather<P>(&mut self, ctx: &Ctx, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
    where
        P: std::future::Future<Output = std::result::Result<(), String>>,
    {
        let s = ctx.s;
        let me = s.trainer;
        let bytes = ByteVec(bytemuck::cast_slice(&mine).to_vec());
        let asks = ctx
            .peers
            .trainers
            .iter()
            .enumerate()
            .filter(|(p, _)| *p as u32 != me)
            .map(|(_, r)| r.ask(GradShare { gen: s.gen, seq: self.seq, round: 0, from: me, data: bytes.clone() }, s.timeouts.ask));
        let (shared, pushed) = ctx.block_on(futures_util::future::join(join_all(asks), join_all(pushes)))?;
        for r in shared {
            r?;
        }
        for r in pushed {
            r.map_err(TrainError::Distributed)?;
        }
        let others: Vec<u32> = (0..s.trainers).filter(|&p| p != me).collect();
        let mut shares = s.inbox.gradients(self.seq, 0, &others, mine.len(), s.timeouts.step)?.into_iter();
        let mut sum = vec![0.0f32; mine.len()];
        for p in 0..s.trainers {
            let v = if p == me { mine.clone() } else { shares.next().expect("one share per peer") };
            sum.iter_mut().zip(&v).for_each(|(a, b)| *a += b);
        }
        Ok(sum)
    }

    /// Ring all-reduce: K-1 rounds of reduce-scatter, then K-1 of all-gather,
    /// one chunk of n/K values to the next trainer per round: 2(K-1)/K·n
    /// values sent per trainer. Each chunk is summed once, on one trainer,
    /// and copied to the others, so every replica gets the same bits.
    pub(super) fn ring<P>(&mut self, ctx: &Ctx, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
    where
        P: std::future::Future<Output = std::result::Result<(), String>>,
    {
        let s = ctx.s;
        let (k, r, n) = (s.trainers as usize, s.trainer as usize, mine.len());
        let mut pushes = Some(join_all(pushes));
        let mut v = mine;
        let span = |c: usize| c * n / k..(c + 1) * n / k;
        let next = &ctx.peers.trainers[(r + 1) % k];
        let prev = ((r + k - 1) % k) as u32;
        for i in 0..2 * (k - 1) {
            let (send, recv) = if i < k - 1 {
                ((r + k - i) % k, (r + 2 * k - i - 1) % k)
            } else {
                let j = i - (k - 1);
                ((r + 1 + k - j) % k, (r + k - j) % k)
            };
            let msg = GradShare { gen: s.gen, seq: self.seq, round: i as u32, from: s.trainer, data: ByteVec(bytemuck::cast_slice(&v[span(send)]).to_vec()) };
            let ask = next.ask(msg, s.timeouts.ask);
            match pushes.take() {
                Some(p) => {
                    let (sent, pushed) = ctx.block_on(futures_util::future::join(ask, p))?;
                    sent?;
                    for r in pushed {
                        r.map_err(TrainError::Distributed)?;
                    }
                }
                None => ctx.block_on(ask)??,
            }
            let got = s.inbox.gradients(self.seq, i as u32, &[prev], span(recv).len(), s.timeouts.step)?.remove(0);
            let dst = &mut v[span(recv)];
            if i < k - 1 {
                dst.iter_mut().zip(&got).for_each(|(a, b)| *a += b);
            } else {
                dst.copy_from_slice(&got);
            }
        }
        if let Some(p) = pushes {
            for r in ctx.block_on(p)? {
                r.map_err(TrainError::Distributed)?;
            }
        }
        Ok(v)
    }
}
