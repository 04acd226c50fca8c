//! placeholder until the helper's translator lands
pub struct Translated {
    pub body: Vec<u8>,
    pub stream: bool,
    pub dropped: Vec<String>,
    pub thinking: bool,
    pub stop_sequences: Vec<String>,
}
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub status: u16,
    pub param: String,
    pub message: String,
}
#[derive(Default)]
pub struct Limits {
    pub max_image_bytes: usize,
}
pub fn to_chat(_body: &[u8], _target_model: &str, _limits: &Limits) -> Result<Translated, Invalid> {
    Err(Invalid { status: 400, param: String::new(), message: String::new() })
}
