//! placeholder until the helper's encoder lands
use bytes::BytesMut;
use iop_core::exec::ExecEvent;
pub struct MessagesEncoder;
impl MessagesEncoder {
    pub fn new(_id: &str, _model: &str, _input_estimate: u64, _stop_sequences: Vec<String>) -> Self {
        MessagesEncoder
    }
}
impl crate::surface::encode::EventEncoder for MessagesEncoder {
    fn event(&mut self, _out: &mut BytesMut, _ev: ExecEvent) -> bool {
        true
    }
}
