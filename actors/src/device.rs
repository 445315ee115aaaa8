//! Parsing `device = "cpu" | "cuda:N"`.

use candle_core::Device;

use crate::error::{Result, TrainError};

/// Opens the device named `spec`.
pub fn open(spec: &str) -> Result<Device> {
    if spec == "cpu" {
        return Ok(Device::Cpu);
    }
    let Some(ordinal) = spec
        .strip_prefix("cuda:")
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return Err(TrainError::Config(format!(
            "training.device: '{spec}' is not 'cpu' or 'cuda:N'"
        )));
    };
    if !cfg!(feature = "cuda") {
        return Err(TrainError::Config(format!("training.device: '{spec}' needs a build with CUDA (cargo build --release --features cuda)")));
    }
    let device = Device::new_cuda(ordinal)
        .map_err(|e| TrainError::Config(format!("training.device: cannot open {spec}: {e}")))?;
    // Not fatal: the device works without it, only slower.
    if let Err(e) = models::ops::keep_device_memory(&device) {
        tracing::warn!(
            "{spec}: freed memory goes back to the driver at every synchronisation ({e})"
        );
    }
    Ok(device)
}
