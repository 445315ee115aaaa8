//! What a model is trained to do, apart from how training is distributed:
//! node classification lives in the modes themselves (its batches are target
//! nodes); link prediction's batches, losses and metrics live here, for any
//! mode that supports it.

pub mod link;
