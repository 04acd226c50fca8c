//! The operator status page: `GET /admin/` (also `/admin`), its script and
//! its style sheet, compiled into the binary (no build step, nothing
//! fetched from elsewhere).
//!
//! The files hold no data, so they are served without the admin token; the
//! page asks for the token once, keeps it in the tab's `sessionStorage` and
//! sends it as `Authorization: Bearer` on its one data request, the event
//! stream with snapshots (`GET /admin/v1/events?snapshots=1`). A strict
//! Content-Security-Policy allows only this origin's script, style and
//! connections: no inline script, no other origin, no framing.

use iop_core::http::RequestHead;

use crate::server::Conn;

/// The Content-Security-Policy of every page file.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                       img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");

/// One file of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum File {
    /// The HTML document.
    Index,
    /// Its script.
    Script,
    /// Its style sheet.
    Style,
}

impl File {
    /// The file served at `path`, if any.
    pub fn of(path: &str) -> Option<File> {
        match path {
            "/admin" | "/admin/" | "/admin/index.html" => Some(File::Index),
            "/admin/app.js" => Some(File::Script),
            "/admin/style.css" => Some(File::Style),
            _ => None,
        }
    }

    /// Its content type and body.
    pub fn content(self) -> (&'static str, &'static str) {
        match self {
            File::Index => ("text/html; charset=utf-8", INDEX),
            File::Script => ("text/javascript; charset=utf-8", SCRIPT),
            File::Style => ("text/css; charset=utf-8", STYLE),
        }
    }
}

/// The headers of every page file.
pub const HEADERS: [(&str, &str); 5] = [
    ("content-security-policy", CSP),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("x-frame-options", "DENY"),
];

/// Serves `file` (GET or HEAD; 405 otherwise); returns whether the
/// connection may be kept.
pub async fn serve(conn: &mut Conn, head: &RequestHead, file: File, keep: bool) -> bool {
    if head.method != "GET" && head.method != "HEAD" {
        return crate::surface::method_not_allowed(conn, head, crate::surface::ALLOW_GET, keep).await.is_ok() && keep;
    }
    let (content_type, body) = file.content();
    conn.respond(200, content_type, &HEADERS, body.as_bytes(), keep).await.is_ok() && keep
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn routes_only_the_pages_files() {
        assert_eq!(File::of("/admin"), Some(File::Index));
        assert_eq!(File::of("/admin/"), Some(File::Index));
        assert_eq!(File::of("/admin/app.js"), Some(File::Script));
        assert_eq!(File::of("/admin/style.css"), Some(File::Style));
        assert_eq!(File::of("/admin/v1/nodes"), None);
        assert_eq!(File::of("/admin/app.js/x"), None);
        assert_eq!(File::of("/admin/../app.js"), None);
    }

    /// Whether `html` has an attribute such as ` onclick=`.
    fn has_event_handler(html: &str) -> bool {
        html.match_indices(" on").any(|(i, _)| {
            let rest = &html[i + 3..];
            let name_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
            name_len > 0 && rest[name_len..].trim_start().starts_with('=')
        })
    }

    /// Nothing in the page may need an exception to the policy: no inline
    /// script or style, no other origin.
    #[test]
    fn the_page_needs_nothing_the_policy_forbids() {
        let lower = INDEX.to_ascii_lowercase();
        assert!(lower.contains(r#"<script src="/admin/app.js""#));
        assert!(lower.contains(r#"href="/admin/style.css""#));
        assert_eq!(lower.matches("<script").count(), 1, "no inline script");
        assert!(!lower.contains("<style"), "no inline style");
        assert!(!lower.contains(" style="), "no style attribute");
        assert!(!has_event_handler(&lower), "no inline event handler");
        for file in [INDEX, SCRIPT, STYLE] {
            assert!(!file.contains("http://") && !file.contains("https://") && !file.contains("//cdn"));
        }
        assert!(!SCRIPT.contains("innerHTML") && !SCRIPT.contains("eval("), "data goes in as text only");
    }
}
