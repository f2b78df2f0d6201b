//! The analytical GPU model (to be written).

use opsched_graph::{Graph, NodeId};

use crate::{CostModel, DevicePreset, LinkPreset, ResourceDemand};

/// Roofline times, thread-block SM shares and a contention law.
#[derive(Clone, Debug)]
pub struct AnalyticalModel {
    pub device: DevicePreset,
    pub link: LinkPreset,
}

impl AnalyticalModel {
    pub fn new(device: DevicePreset, link: LinkPreset) -> Self {
        AnalyticalModel { device, link }
    }
}

impl CostModel for AnalyticalModel {
    fn name(&self) -> String {
        format!("analytical({})", self.device.name)
    }
    fn op_time(&self, _g: &Graph, _op: NodeId) -> f64 {
        0.0
    }
    fn demand(&self, _g: &Graph, _op: NodeId) -> ResourceDemand {
        ResourceDemand::default()
    }
    fn rates(&self, _g: &Graph, running: &[NodeId], out: &mut Vec<f64>) {
        out.clear();
        out.resize(running.len(), 1.0);
    }
    fn merged_time(&self, _g: &Graph, _ops: &[NodeId]) -> Option<f64> {
        None
    }
    fn transfer_time(&self, _g: &Graph, _src: NodeId, _dst: NodeId) -> f64 {
        0.0
    }
    fn capacity_bound(&self, _g: &Graph, _ops: &[NodeId], _gpus: usize) -> f64 {
        0.0
    }
}
