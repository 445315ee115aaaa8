//! A training mode that exists only in tests, to show what a mode is: this
//! folder and its registration in `crate::modes` (its variant of `Mode`, its
//! registry entry, its arm of `open`), nothing else. Its settings are its
//! own sub-table (`[training.toy]`, checked here), its figures travel
//! opaquely in the shared epoch accounts and are merged by it into the
//! report (`toy`), and the shared drivers and coordinator run its
//! generations. It learns nothing: each partition (the whole graph) takes
//! the run's steps as a count, and the model is the initial one.

use std::path::PathBuf;
use std::sync::Arc;

use actix::Actor;
use candle_core::{DType, Device};
use graphs::HetGraph;
use models::Model;
use runtime::{Node, Topology};
use serde::{Deserialize, Serialize};

use crate::config::TrainingConfig;
use crate::distributed::checkpoint::Manifest;
use crate::distributed::inbox::{Inbox, InboxActor};
use crate::distributed::messages::{Abort, Begin, EpochStats, Finish, StepDone};
use crate::distributed::{names, Distributed, Part, System};
use crate::error::{Result, TrainError};
use crate::modes::{ModeConfig, Rules};
use crate::report::EpochReport;

/// `[training.toy]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToyConfig {
    /// Partitions, each holding the whole graph (default 2).
    pub parts: u32,
}

impl Default for ToyConfig {
    fn default() -> Self {
        ToyConfig { parts: 2 }
    }
}

impl ModeConfig for ToyConfig {
    fn check(&self, t: &TrainingConfig) -> Result<()> {
        if !(1..=8).contains(&self.parts) {
            return Err(TrainError::Config(format!(
                "training.toy.parts: {} (1 to 8)",
                self.parts
            )));
        }
        if t.data.is_none() {
            return Err(TrainError::Config(
                "training.data: the toy mode reads a graph".into(),
            ));
        }
        Ok(())
    }
}

/// The toy mode's rules: its figures merged into the report.
pub const RULES: Rules = Rules {
    own_steps: false,
    partial_params: false,
    figures: merge,
};

/// A partition's figures of an epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToyFigures {
    /// Steps the partition took in the epoch.
    pub steps: u64,
}

/// The figures of every partition, summed (the report's `toy`).
fn merge(report: &mut EpochReport, stats: &[EpochStats]) -> Result<()> {
    let mut sum = ToyFigures::default();
    for s in stats {
        if let Some(f) = s.figures::<ToyFigures>()? {
            sum.steps += f.steps;
        }
    }
    report.set_figures("toy", &sum)
}

/// The toy mode over a graph.
pub struct Toy {
    cfg: TrainingConfig,
    parts: u32,
}

impl Toy {
    /// The mode as `t` configures it.
    pub fn open(t: &TrainingConfig) -> Result<Toy> {
        let own = ToyConfig::of(t)?;
        Ok(Toy {
            cfg: t.clone(),
            parts: own.parts,
        })
    }
}

fn leader(part: u32) -> String {
    format!("toy/{part}")
}

impl Distributed for Toy {
    type Outcome = ();

    fn name(&self) -> &'static str {
        "toy"
    }

    fn parts(&self) -> u32 {
        self.parts
    }

    fn trainers(&self) -> u32 {
        self.parts
    }

    fn leader(&self, part: u32) -> String {
        leader(part)
    }

    fn members(&self, part: u32) -> Vec<String> {
        vec![leader(part)]
    }

    fn place(&self, _topology: &mut Topology) -> Result<Vec<String>> {
        Err(TrainError::Config("the toy mode runs embedded only".into()))
    }

    fn load(&self, _part: u32) -> Result<HetGraph> {
        let dir = self.cfg.data.as_ref().ok_or_else(|| {
            TrainError::Config("training.data: the toy mode reads a graph".into())
        })?;
        Ok(graphs::format::load(
            dir,
            &crate::distributed::load_options(&self.cfg),
        )?)
    }

    fn fingerprint(&self, graph: &HetGraph) -> String {
        crate::distributed::checkpoint::fingerprint(&self.cfg, graph.name(), &[b"toy"])
    }

    fn serve(
        &self,
        node: &Node,
        part: u32,
        _graph: &Arc<HetGraph>,
        _arbiters: &mut Vec<actix::Arbiter>,
    ) -> Result<Vec<Arc<Inbox>>> {
        let inbox = Arc::new(Inbox::default());
        let addr = InboxActor(inbox.clone()).start();
        node.register(&leader(part), &addr)
            .map_err(|e| TrainError::Internal(e.to_string()))?
            .handle::<Abort>()
            .handle::<Finish>()
            .handle::<Begin>();
        Ok(vec![inbox])
    }

    fn rules(&self) -> &'static Rules {
        &RULES
    }

    fn attempt(
        &self,
        p: &Part,
        b: Begin,
        _run: &str,
        from: Option<(PathBuf, Manifest)>,
    ) -> Result<()> {
        let t = &self.cfg;
        let per_epoch = self.steps_per_epoch(p.graph, t);
        let first = from.map_or(0, |(_, m)| m.seq);
        let me = runtime::ActorName::new(&leader(p.part))
            .map_err(|e| TrainError::Internal(e.to_string()))?;
        let coordinator = p
            .node
            .actor(names::COORDINATOR)
            .map_err(|e| TrainError::Internal(e.to_string()))?
            .with_sender(me);
        let inbox = &p.inboxes[0];
        let mut seq = first;
        for epoch in first / per_epoch.max(1)..t.epochs {
            let mut steps = 0;
            while seq < (epoch + 1) * per_epoch {
                if p.part == 0 {
                    let done = StepDone {
                        gen: b.gen,
                        epoch,
                        seq,
                        loss: 1.0 / (seq + 1) as f64,
                    };
                    inbox.block_on(p.handle, coordinator.ask(done, p.timeouts.ask))??;
                }
                seq += 1;
                steps += 1;
            }
            let mut stats = EpochStats {
                gen: b.gen,
                trainer: p.part,
                epoch,
                steps,
                ..EpochStats::default()
            };
            stats.set_figures(&ToyFigures { steps })?;
            inbox.block_on(p.handle, coordinator.ask(stats, p.timeouts.ask))??;
        }
        Ok(())
    }

    fn assemble(
        &self,
        _system: &System,
        _inbox: &Inbox,
        _local: Vec<(u32, Result<Option<()>>)>,
        graph: &HetGraph,
    ) -> Result<Model> {
        Ok(Model::new(
            &self.cfg.model_spec(),
            graph,
            DType::F32,
            &Device::Cpu,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::observer::TrainObserver;

    struct Quiet;
    impl TrainObserver for Quiet {}

    fn config(dir: &std::path::Path, extra: &str) -> crate::error::Result<Config> {
        Config::parse(
            &format!(
                "[training]\nmode = \"toy\"\ndata = \"{}\"\nepochs = 2\nbatch = 64\n{extra}",
                dir.display()
            ),
            &[],
        )
    }

    #[test]
    fn a_mode_is_its_folder_and_its_registration() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("g");
        let (like, progress) = (graphs::generate::Like::Mag, &mut graphs::NoProgress);
        graphs::generate::generate(like, 0.003, 0, &dir, false, progress).unwrap();
        let dir = dir.as_path();
        // Its settings are its own sub-table, checked in its folder.
        let cfg = config(dir, "[training.toy]\nparts = 3\n").unwrap();
        let e = config(dir, "[training.toy]\nparts = 9\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("training.toy.parts: 9 (1 to 8)"), "{e}");
        let e = config(dir, "[training.toy]\npart = 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("training.toy") && e.contains("unknown field `part`"),
            "{e}"
        );
        let e = config(dir, "[training.raf]\n").unwrap_err().to_string();
        assert!(
            e.contains("applies to training.mode = \"raf\", not \"toy\""),
            "{e}"
        );
        // The shared drivers and coordinator run it, and its figures reach the report.
        let (report, _model) = crate::modes::train(&cfg, &mut Quiet).unwrap();
        assert_eq!(report.mode, "toy");
        assert_eq!(report.epochs.len(), 2);
        let per_epoch = report.steps / 2;
        assert!(per_epoch > 0);
        for e in &report.epochs {
            let f: super::ToyFigures = e.figures("toy").expect("the mode's figures");
            assert_eq!(f.steps, 3 * per_epoch, "every partition's steps, summed");
        }
    }
}
