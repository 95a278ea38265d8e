//! The engine API token the operator generates for an ArchiveSource that names none
//! (`spec.access.tokenSecretRef` unset, `spec.access.generateToken` not false): a Secret
//! `<source>-engine-token` in the source's namespace, owned by the source (garbage collected with
//! it), holding a random token under key `token`. The operator only ever creates it: an
//! existing Secret of that name is used as it is, so the token never changes while it exists,
//! and the operator never reads it (nor logs it).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use rand::RngCore;

use crate::builders::{BuildContext, child_meta};
use crate::crd::archive_source::ArchiveSource;
use crate::crd::common::SecretKeyRef;
use crate::source::labels::selector_labels;

/// The key of the generated Secret holding the token.
pub const TOKEN_KEY: &str = "token";
/// Random bytes in a generated token (hex-encoded: 64 characters).
pub const TOKEN_BYTES: usize = 32;

/// The name of the Secret holding a source's generated token (whether or not it generates
/// one): `<source>-engine-token`. Whoever needs the token (a client, the operator's probe)
/// derives the name from the source.
pub fn engine_token_secret_name(source: &ArchiveSource) -> String {
    format!("{}-engine-token", source.name_any())
}

/// Whether the operator generates the source's token: no `tokenSecretRef`, `generateToken`
/// not false, and generation not turned off in the operator (`--no-generated-engine-tokens`).
pub fn generates_token(source: &ArchiveSource, ctx: &BuildContext) -> bool {
    let access = source.spec.access.clone().unwrap_or_default();
    ctx.generate_engine_tokens
        && access.token_secret_ref.is_none()
        && access.generate_token != Some(false)
}

/// The token the engines read: the one the spec names, else the generated one.
pub fn token_ref(source: &ArchiveSource, ctx: &BuildContext) -> Option<SecretKeyRef> {
    let access = source.spec.access.clone().unwrap_or_default();
    access.token_secret_ref.or_else(|| {
        generates_token(source, ctx).then(|| SecretKeyRef {
            name: engine_token_secret_name(source),
            key: TOKEN_KEY.into(),
        })
    })
}

/// A new random token (from the thread's CSPRNG, seeded by the OS), hex-encoded.
fn random_token() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The Secret of a new generated token, owned by the source. Each call draws a new token: the
/// controller only creates it (an existing one is kept).
pub fn engine_token_secret(source: &ArchiveSource) -> Secret {
    Secret {
        metadata: child_meta(
            source,
            engine_token_secret_name(source),
            selector_labels(source),
        ),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            TOKEN_KEY.into(),
            ByteString(random_token().into_bytes()),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::archive_source::EngineAccess;

    fn source(access: Option<EngineAccess>) -> ArchiveSource {
        let mut s: ArchiveSource = serde_saphyr::from_str(
            "apiVersion: larch.dev/v1alpha1\nkind: ArchiveSource\nmetadata: {name: cache, namespace: team-a, uid: 4d2c1b0a-0000-4000-8000-000000000001}\nspec:\n  archive: {exportRef: {name: users}}\n  target: {memory: {}}\n",
        )
        .unwrap();
        s.spec.access = access;
        s
    }

    fn ctx() -> BuildContext {
        BuildContext {
            generate_engine_tokens: true,
            ..Default::default()
        }
    }

    #[test]
    fn the_secret_is_owned_by_the_source_and_holds_a_random_token() {
        let s = source(None);
        let a = engine_token_secret(&s);
        assert_eq!(a.metadata.name.as_deref(), Some("cache-engine-token"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("team-a"));
        let owner = &a.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("ArchiveSource", "cache", Some(true))
        );
        assert_eq!(owner.uid, "4d2c1b0a-0000-4000-8000-000000000001");
        let token =
            |s: &Secret| String::from_utf8(s.data.as_ref().unwrap()[TOKEN_KEY].0.clone()).unwrap();
        let t = token(&a);
        assert_eq!(t.len(), 2 * TOKEN_BYTES);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()), "{t}");
        // Two draws never agree (a fixed or predictable token would).
        let others: Vec<String> = (0..16).map(|_| token(&engine_token_secret(&s))).collect();
        assert!(others.iter().all(|o| *o != t), "{others:?}");
        let distinct: std::collections::HashSet<_> = others.iter().collect();
        assert_eq!(distinct.len(), others.len());
    }

    #[test]
    fn the_token_is_generated_only_when_none_is_named_and_not_turned_off() {
        let named = SecretKeyRef {
            name: "mine".into(),
            key: "t".into(),
        };
        let given = source(Some(EngineAccess {
            token_secret_ref: Some(named.clone()),
            ..Default::default()
        }));
        assert!(!generates_token(&given, &ctx()));
        assert_eq!(token_ref(&given, &ctx()), Some(named));
        let default = source(None);
        assert!(generates_token(&default, &ctx()));
        assert_eq!(
            token_ref(&default, &ctx()).map(|r| (r.name, r.key)),
            Some(("cache-engine-token".into(), "token".into()))
        );
        let off = source(Some(EngineAccess {
            generate_token: Some(false),
            ..Default::default()
        }));
        assert!(!generates_token(&off, &ctx()));
        assert_eq!(token_ref(&off, &ctx()), None);
        let operator_off = BuildContext::default();
        assert!(!generates_token(&default, &operator_off));
    }
}
