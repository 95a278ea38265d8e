//! Who may use the engine's HTTP API. Three groups of endpoints:
//!
//! - open: `/health/*` (probes), always unauthenticated;
//! - reads: `/tables…` (row data), open unless `protect_reads`, then a bearer token;
//! - status: `/status` and `/metrics` (scrapes; no row data, but table names, positions and
//!   errors), open unless `protect_status`, then the same bearer token;
//! - control: `POST /sources/{id}/pause|resume`, refused unless `control`, then a bearer token.
//!
//! The token comes from a file (a mounted Secret key) or the environment, is compared in
//! constant time and is never logged (its `Debug` is redacted).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use larch_core::failure::{Reason, tag};

/// The environment variable holding the token when no `--token-file` is given.
pub const TOKEN_ENV: &str = "LARCH_ENGINE_TOKEN";
/// Shorter tokens are refused: a token is meant to be generated, not typed.
pub const MIN_TOKEN_LEN: usize = 16;

/// A bearer token. Only its SHA-256 is kept, so comparisons take the same time whatever the
/// length of what is presented.
#[derive(Clone)]
pub struct Token([u8; 32]);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Validates `text` (surrounding whitespace, such as a Secret file's final newline, is
    /// dropped); `origin` names where it came from in errors, never the value.
    pub fn new(text: &str, origin: &str) -> anyhow::Result<Token> {
        let t = text.trim();
        if t.len() < MIN_TOKEN_LEN {
            return Err(tag(
                Reason::InvalidConfig,
                anyhow::anyhow!(
                    "{origin}: the API token must be at least {MIN_TOKEN_LEN} characters (it has {})",
                    t.len()
                ),
            ));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(tag(
                Reason::InvalidConfig,
                anyhow::anyhow!(
                    "{origin}: the API token must be printable ASCII without spaces or line breaks (an HTTP header carries it)"
                ),
            ));
        }
        Ok(Token(Sha256::digest(t.as_bytes()).into()))
    }

    pub fn from_file(path: &Path) -> anyhow::Result<Token> {
        let origin = format!("--token-file {}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| {
            tag(
                Reason::InvalidConfig,
                anyhow::anyhow!("{origin}: cannot read: {e}"),
            )
        })?;
        Token::new(&text, &origin)
    }

    /// Whether `presented` is this token, in constant time.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        digest.ct_eq(&self.0).into()
    }
}

/// The engine's API access policy.
#[derive(Clone, Debug, Default)]
pub struct ApiAccess {
    /// Serve the control endpoints (pause, resume), behind the token.
    pub control: bool,
    /// Require the token for the tables API.
    pub protect_reads: bool,
    /// Require the token for `/status` and `/metrics`.
    pub protect_status: bool,
    pub token: Option<Token>,
}

impl ApiAccess {
    /// The policy of `larch engine`'s flags: the token from `token_file`, else from
    /// `$LARCH_ENGINE_TOKEN` (`env_token`); a token is required when anything is protected.
    pub fn from_flags(
        control: bool,
        protect_reads: bool,
        protect_status: bool,
        token_file: Option<&PathBuf>,
        env_token: Option<String>,
    ) -> anyhow::Result<ApiAccess> {
        let token = match (token_file, env_token) {
            (Some(path), _) => Some(Token::from_file(path)?),
            (None, Some(text)) => Some(Token::new(&text, TOKEN_ENV)?),
            (None, None) => None,
        };
        if token.is_none() && (control || protect_reads || protect_status) {
            let flag = if control {
                "--allow-control"
            } else if protect_reads {
                "--protect-reads"
            } else {
                "--protect-status"
            };
            return Err(tag(
                Reason::InvalidConfig,
                anyhow::anyhow!(
                    "{flag} needs an API token: pass --token-file FILE or set {TOKEN_ENV}"
                ),
            ));
        }
        Ok(ApiAccess {
            control,
            protect_reads,
            protect_status,
            token,
        })
    }

    fn authorized(&self, req: &Request) -> bool {
        self.authorizes(
            req.headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
        )
    }

    /// Whether an `Authorization` header's value (HTTP or gRPC metadata) is `Bearer <token>`.
    pub fn authorizes(&self, authorization: Option<&[u8]>) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        authorization
            .and_then(|v| v.strip_prefix(b"Bearer "))
            .is_some_and(|presented| token.matches(presented))
    }
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let mut r = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "error": message }).to_string(),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// Why a request without the right token is refused.
pub const UNAUTHORIZED: &str = "missing or wrong bearer token (Authorization: Bearer <token>)";
/// Why a control request is refused when control is off.
pub const CONTROL_DISABLED: &str = "control endpoints are disabled: start the engine with --allow-control and a token (ArchiveSource spec.access.control)";

fn unauthorized() -> Response {
    refuse(StatusCode::UNAUTHORIZED, UNAUTHORIZED)
}

/// Middleware of the tables API.
pub async fn guard_reads(
    State(access): State<Arc<ApiAccess>>,
    req: Request,
    next: Next,
) -> Response {
    if access.protect_reads && !access.authorized(&req) {
        return unauthorized();
    }
    next.run(req).await
}

/// Middleware of `/status` and `/metrics`.
pub async fn guard_status(
    State(access): State<Arc<ApiAccess>>,
    req: Request,
    next: Next,
) -> Response {
    if access.protect_status && !access.authorized(&req) {
        return unauthorized();
    }
    next.run(req).await
}

/// Middleware of the control endpoints.
pub async fn guard_control(
    State(access): State<Arc<ApiAccess>>,
    req: Request,
    next: Next,
) -> Response {
    if !access.control {
        return refuse(StatusCode::FORBIDDEN, CONTROL_DISABLED);
    }
    if !access.authorized(&req) {
        return unauthorized();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_never_printed() {
        let t = Token::new("  s3cr3t-token-0123456789\n", "test").unwrap();
        assert!(t.matches(b"s3cr3t-token-0123456789"));
        assert!(!t.matches(b"s3cr3t-token-012345678"));
        assert!(!t.matches(b""));
        assert!(!format!("{t:?}").contains("s3cr3t"));
        let short = Token::new("short", "--token-file /x").unwrap_err();
        assert!(
            short.to_string().contains("--token-file /x")
                && short.to_string().contains("at least 16"),
            "{short}"
        );
        let spaced = Token::new("0123456789 abcdefghij", "t").unwrap_err();
        assert!(spaced.to_string().contains("printable ASCII"), "{spaced}");
        assert!(!spaced.to_string().contains("abcdefghij"), "{spaced}");
    }

    #[test]
    fn protection_without_a_token_is_refused() {
        let e = ApiAccess::from_flags(true, false, false, None, None).unwrap_err();
        assert!(e.to_string().contains("--allow-control needs an API token"));
        assert_eq!(crate::reasons::classify(&e), Reason::InvalidConfig);
        let e = ApiAccess::from_flags(false, true, false, None, None).unwrap_err();
        assert!(e.to_string().contains("--protect-reads needs an API token"));
        let e = ApiAccess::from_flags(false, false, true, None, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("--protect-status needs an API token")
        );
        let open = ApiAccess::from_flags(false, false, false, None, None).unwrap();
        assert!(!open.control && !open.protect_reads && open.token.is_none());
        let env = ApiAccess::from_flags(true, true, true, None, Some("x".repeat(20))).unwrap();
        assert!(env.token.unwrap().matches("x".repeat(20).as_bytes()));
    }
}
