//! placeholder until the helper's aggregate lands
use bytes::BytesMut;
use iop_core::exec::{ExecEvent, RunFailure};
pub struct MessageAggregate;
impl MessageAggregate {
    pub fn new(_stop_sequences: Vec<String>) -> Self {
        MessageAggregate
    }
    pub fn on_event(&mut self, _ev: ExecEvent) -> Result<bool, RunFailure> {
        Ok(true)
    }
    pub fn write(&self, _out: &mut BytesMut, _id: &str, _model: &str) {}
}
