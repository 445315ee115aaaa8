//! An actix system on a thread of its own, so that training threads can block
//! while it serves the node's actors.

use std::future::Future;

use runtime::Node;

use crate::error::{Result, TrainError};

/// An actix system running on a thread of its own, so training threads can
/// block while it serves the actors.
pub struct System {
    /// The node the system serves.
    pub node: Node,
    /// Its runtime, for asks from other threads.
    pub handle: tokio::runtime::Handle,
    arbiters: Vec<actix::Arbiter>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl System {
    /// Starts the system and runs `setup` in it.
    pub fn start<T, F, S>(setup: S) -> Result<(System, T)>
    where
        T: Send + 'static,
        F: Future<Output = Result<(Node, Vec<actix::Arbiter>, T)>> + 'static,
        S: FnOnce() -> F + Send + 'static,
    {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("actors".into())
            .spawn(move || {
                let system = actix_rt::System::new();
                system.block_on(async move {
                    match setup().await {
                        Ok((node, arbiters, extra)) => {
                            let _ = ready_tx.send(Ok((
                                node.clone(),
                                tokio::runtime::Handle::current(),
                                arbiters,
                                extra,
                            )));
                            let _ = stop_rx.await;
                            node.shutdown().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(|e| TrainError::Internal(format!("cannot start the actor thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((node, handle, arbiters, extra))) => Ok((
                System {
                    node,
                    handle,
                    arbiters,
                    stop: Some(stop_tx),
                    thread: Some(thread),
                },
                extra,
            )),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(TrainError::Internal(
                "the actor thread stopped during start-up".into(),
            )),
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for a in &self.arbiters {
            a.stop();
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
