//! The model routes, whatever their dialect: what each is called on a
//! provider, whether a provider serves it natively (the tunnel) or the
//! normalized run answers it, and whether it may be replayed.

use iop_core::config::ProviderEntry;

use super::dialect::Dialect;

/// A model route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/messages/count_tokens` (Anthropic).
    CountTokens,
}

impl Route {
    /// The route serving `path` (the query left out).
    pub fn from_path(path: &str) -> Option<Route> {
        Some(match path {
            "/v1/chat/completions" => Route::Chat,
            "/v1/completions" => Route::Completions,
            "/v1/embeddings" => Route::Embeddings,
            "/v1/responses" => Route::Responses,
            "/v1/messages" => Route::Messages,
            "/v1/messages/count_tokens" => Route::CountTokens,
            _ => return None,
        })
    }

    /// The path under an OpenAI-compatible provider's base URL.
    pub fn provider_path(self) -> &'static str {
        match self {
            Route::Chat => "/chat/completions",
            Route::Completions => "/completions",
            Route::Embeddings => "/embeddings",
            Route::Responses => "/responses",
            Route::Messages => "/messages",
            Route::CountTokens => "/messages/count_tokens",
        }
    }

    /// Its label in the metrics and the access log (a closed set).
    pub fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat_completions",
            Route::Completions => "completions",
            Route::Embeddings => "embeddings",
            Route::Responses => "responses",
            Route::Messages => "messages",
            Route::CountTokens => "count_tokens",
        }
    }

    /// The dialect its answers and errors are in.
    pub fn dialect(self) -> Dialect {
        match self {
            Route::Messages | Route::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    /// Whether `p`'s server answers this route itself: the request goes
    /// through the tunnel, byte for byte.
    pub fn native_on(self, p: &ProviderEntry) -> bool {
        p.kind.is_openai_compatible()
            && match self {
                Route::Chat | Route::Completions | Route::Embeddings => true,
                Route::Responses => p.native.responses,
                Route::Messages | Route::CountTokens => p.native.messages,
            }
    }

    /// Whether `p` can serve this route at all: natively, or on the
    /// normalized run (chat, embeddings, and Messages and Responses
    /// translated to chat; a token count by an OpenAI-compatible server's
    /// tokenizer). A token count no target serves is estimated by the edge
    /// ([`super::anthropic::count`]), without a provider.
    pub fn served_by(self, p: &ProviderEntry) -> bool {
        self.native_on(p)
            || matches!(self, Route::Chat | Route::Embeddings | Route::Messages | Route::Responses)
            || (self == Route::CountTokens && p.kind.is_openai_compatible())
    }

    /// Whether a failure before the first byte may be replayed elsewhere
    /// (the spec's scope: the conversational routes).
    pub fn replayable(self) -> bool {
        matches!(self, Route::Chat | Route::Responses | Route::Messages)
    }
}
