//! What a model is trained to do, apart from how training is distributed:
//! node tasks' losses and metrics (their batches are target nodes, made by
//! the modes), and link prediction's and edge tasks' batches, losses and
//! metrics, for any mode that supports them; node tasks trained together.

pub mod edge;
pub mod link;
pub mod multi;
pub mod node;
