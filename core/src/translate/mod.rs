//! What the translations of other APIs' requests onto an OpenAI
//! chat-completions body share ([`crate::messages`], [`crate::responses`]):
//! the refusal ([`Invalid`]), typed reads out of a JSON tree that name
//! their param ([`read`]), the top-level object with duplicate keys refused
//! ([`top`]), and image sizes ([`image`]).

pub(crate) mod image;
pub(crate) mod read;
pub(crate) mod top;

/// A request the translation refuses; `message` is client-facing and
/// starts with the field it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    /// 400, or 413 for an oversized image.
    pub status: u16,
    /// The field as a dotted path (`messages.1.content.0.tool_use_id`,
    /// `input.3.call_id`); empty for the body as a whole.
    pub param: String,
    pub message: String,
}
