//! Which endpoint a request goes to, from its method and path alone.

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

const ROUTES: &[(&str, &str, Route)] = &[
    ("POST", "/v1/chat/completions", Route::Model(Endpoint::Chat)),
    ("POST", "/v1/completions", Route::Model(Endpoint::Completions)),
    ("POST", "/v1/embeddings", Route::Model(Endpoint::Embeddings)),
    ("POST", "/v1/responses", Route::Model(Endpoint::Responses)),
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
];

/// The route of `method` `path` (path without its query).
pub fn route(method: &str, path: &str) -> Route {
    let mut known = false;
    for (m, p, r) in ROUTES {
        if *p == path {
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
        assert_eq!(route("POST", "/v1/chat/completions"), Route::Model(Endpoint::Chat));
        assert_eq!(route("POST", "/api/embed"), Route::Model(Endpoint::OllamaEmbed));
        assert_eq!(route("POST", "/api/show"), Route::Meta(Meta::Show));
        assert_eq!(route("GET", "/log"), Route::Meta(Meta::Log));
        assert_eq!(route("GET", "/closes"), Route::Meta(Meta::Closes));
        assert_eq!(route("GET", "/api/chat"), Route::MethodNotAllowed);
        assert_eq!(route("POST", "/healthz"), Route::MethodNotAllowed);
        assert_eq!(route("GET", "/nope"), Route::NotFound);
        assert_eq!(route("GET", "/v1/models/"), Route::NotFound);
    }
}
