//! Which endpoint a request goes to, from its method and path, and the
//! native dialect routes `--without` turned off.

/// The model endpoints: numbered, recorded, answered through a
/// [`Reply`](super::reply::Reply), `mock` overrides honoured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
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
    /// `POST /api/chat`.
    OllamaChat,
    /// `POST /api/embed`.
    OllamaEmbed,
}

/// Everything else: answered at once, never recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meta {
    /// `GET /v1/models`.
    Models,
    /// `GET /api/tags`.
    Tags,
    /// `GET /api/ps`.
    Ps,
    /// `GET /api/version`.
    Version,
    /// `POST /api/show`.
    Show,
    /// `GET /healthz`.
    Healthz,
    /// `GET /stats`.
    Stats,
    /// `GET /last`.
    Last,
    /// `GET /log`.
    Log,
    /// `GET /closes`.
    Closes,
    /// `POST /mock/health`.
    SetHealth,
    /// `POST /tokenize` (vLLM's, beside `/v1`).
    Tokenize,
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A model endpoint.
    Model(Endpoint),
    /// A metadata or mock endpoint.
    Meta(Meta),
    /// A known path with another method (405).
    MethodNotAllowed,
    /// An unknown path (404).
    NotFound,
}

/// A family of native dialect routes that `--without` can turn off, so the
/// mock stands for a server that lacks them (their paths answer 404).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Native {
    /// `/v1/messages` and `/v1/messages/count_tokens`.
    Messages,
    /// `/v1/responses`.
    Responses,
    /// `/tokenize`.
    Tokenize,
}

impl Endpoint {
    /// The native family the endpoint belongs to, if `--without` can turn it off.
    pub fn native(self) -> Option<Native> {
        match self {
            Self::Messages | Self::CountTokens => Some(Native::Messages),
            Self::Responses => Some(Native::Responses),
            _ => None,
        }
    }
}

const ROUTES: &[(&str, &str, Route)] = &[
    ("POST", "/v1/chat/completions", Route::Model(Endpoint::Chat)),
    ("POST", "/v1/completions", Route::Model(Endpoint::Completions)),
    ("POST", "/v1/embeddings", Route::Model(Endpoint::Embeddings)),
    ("POST", "/v1/responses", Route::Model(Endpoint::Responses)),
    ("POST", "/v1/messages", Route::Model(Endpoint::Messages)),
    ("POST", "/v1/messages/count_tokens", Route::Model(Endpoint::CountTokens)),
    ("POST", "/api/chat", Route::Model(Endpoint::OllamaChat)),
    ("POST", "/api/embed", Route::Model(Endpoint::OllamaEmbed)),
    ("GET", "/v1/models", Route::Meta(Meta::Models)),
    ("GET", "/api/tags", Route::Meta(Meta::Tags)),
    ("GET", "/api/ps", Route::Meta(Meta::Ps)),
    ("GET", "/api/version", Route::Meta(Meta::Version)),
    ("POST", "/api/show", Route::Meta(Meta::Show)),
    ("GET", "/healthz", Route::Meta(Meta::Healthz)),
    ("GET", "/stats", Route::Meta(Meta::Stats)),
    ("GET", "/last", Route::Meta(Meta::Last)),
    ("GET", "/log", Route::Meta(Meta::Log)),
    ("GET", "/closes", Route::Meta(Meta::Closes)),
    ("POST", "/mock/health", Route::Meta(Meta::SetHealth)),
    ("POST", "/tokenize", Route::Meta(Meta::Tokenize)),
];

/// The native family `route` belongs to, if `--without` can turn it off.
fn native_of(route: Route) -> Option<Native> {
    match route {
        Route::Model(e) => e.native(),
        Route::Meta(Meta::Tokenize) => Some(Native::Tokenize),
        _ => None,
    }
}

/// The route of `method` `path` (path without its query); the paths of the
/// families in `without` are unknown.
pub fn route(method: &str, path: &str, without: &[Native]) -> Route {
    let mut known = false;
    for (m, p, r) in ROUTES {
        let off = native_of(*r).is_some_and(|n| without.contains(&n));
        if *p == path && !off {
            if *m == method {
                return *r;
            }
            known = true;
        }
    }
    if known {
        Route::MethodNotAllowed
    } else {
        Route::NotFound
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_method_and_path() {
        let route = |m, p| route(m, p, &[]);
        assert_eq!(route("POST", "/v1/chat/completions"), Route::Model(Endpoint::Chat));
        assert_eq!(route("POST", "/api/embed"), Route::Model(Endpoint::OllamaEmbed));
        assert_eq!(route("POST", "/v1/messages"), Route::Model(Endpoint::Messages));
        assert_eq!(route("POST", "/v1/messages/count_tokens"), Route::Model(Endpoint::CountTokens));
        assert_eq!(route("POST", "/api/show"), Route::Meta(Meta::Show));
        assert_eq!(route("GET", "/log"), Route::Meta(Meta::Log));
        assert_eq!(route("GET", "/closes"), Route::Meta(Meta::Closes));
        assert_eq!(route("GET", "/api/chat"), Route::MethodNotAllowed);
        assert_eq!(route("GET", "/v1/messages"), Route::MethodNotAllowed);
        assert_eq!(route("POST", "/healthz"), Route::MethodNotAllowed);
        assert_eq!(route("GET", "/nope"), Route::NotFound);
        assert_eq!(route("GET", "/v1/models/"), Route::NotFound);
    }

    #[test]
    fn without_turns_a_family_into_unknown_paths() {
        let off = [Native::Messages];
        assert_eq!(route("POST", "/v1/messages", &off), Route::NotFound);
        assert_eq!(route("GET", "/v1/messages", &off), Route::NotFound, "not 405: the path is unknown");
        assert_eq!(route("POST", "/v1/messages/count_tokens", &off), Route::NotFound);
        assert_eq!(route("POST", "/v1/responses", &off), Route::Model(Endpoint::Responses));
        let off = [Native::Responses];
        assert_eq!(route("POST", "/v1/responses", &off), Route::NotFound);
        assert_eq!(route("POST", "/v1/messages", &off), Route::Model(Endpoint::Messages));
        assert_eq!(route("POST", "/v1/chat/completions", &off), Route::Model(Endpoint::Chat));
        assert_eq!(route("POST", "/tokenize", &off), Route::Meta(Meta::Tokenize));
        assert_eq!(route("POST", "/tokenize", &[Native::Tokenize]), Route::NotFound);
    }
}
