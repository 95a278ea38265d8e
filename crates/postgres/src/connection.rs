//! PostgreSQL connection strings as libpq users write them, TLS included, for the source (query
//! and replication connections) and the PostgreSQL target alike.
//!
//! `sslmode` (`disable`, `prefer` — the default, as in libpq —, `require`, `verify-ca`,
//! `verify-full`), `sslrootcert`, `sslcert` and `sslkey` are read from either form
//! (`host=… sslmode=verify-full sslrootcert=/etc/ca.pem` or
//! `postgres://…?sslmode=verify-full&sslrootcert=…`). tokio-postgres knows only three modes and
//! no certificate files, so these parameters are taken out of the string here and become one
//! rustls configuration for tokio-postgres and the same settings for pgwire-replication.
//! `require` encrypts without checking the server (libpq's meaning); `verify-ca` checks the
//! chain against `sslrootcert`; `verify-full` also checks the host name. Use `verify-full`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use larch_core::failure::{self, Reason};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> anyhow::Result<SslMode> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => bail!(
                "sslmode={other:?} is not supported: use disable, prefer, require, verify-ca or \
                 verify-full"
            ),
        })
    }

    fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

/// A parsed connection string: tokio-postgres's settings plus the TLS parameters it lacks.
#[derive(Clone, Debug)]
pub struct PgDsn {
    pub config: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    pub root_cert: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl PgDsn {
    /// Parses `dsn`; errors name the parameter at fault and never repeat the string (it may
    /// hold a password).
    pub fn parse(dsn: &str) -> anyhow::Result<PgDsn> {
        Self::parse_checked(dsn).map_err(|e| failure::tag(Reason::InvalidConfig, e))
    }

    fn parse_checked(dsn: &str) -> anyhow::Result<PgDsn> {
        let (rest, tls) = take_tls_params(dsn)?;
        let mut config = tokio_postgres::Config::from_str(&rest)
            .map_err(|e| anyhow!("invalid PostgreSQL connection string: {e}"))?;
        let ssl_mode = match tls.get("sslmode") {
            Some(m) => SslMode::parse(m)?,
            None => SslMode::Prefer,
        };
        config.ssl_mode(match ssl_mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let path = |k: &str| tls.get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let dsn = PgDsn {
            config,
            ssl_mode,
            root_cert: path("sslrootcert"),
            client_cert: path("sslcert"),
            client_key: path("sslkey"),
        };
        if ssl_mode.verifies() && dsn.root_cert.is_none() {
            bail!(
                "sslmode={} needs sslrootcert=<file with the CA certificates that signed the \
                 server's certificate>",
                tls["sslmode"]
            );
        }
        if dsn.client_cert.is_some() != dsn.client_key.is_some() {
            bail!("sslcert and sslkey go together (a client certificate needs its key)");
        }
        Ok(dsn)
    }

    /// The TLS connector for tokio-postgres (used only when `ssl_mode` is not `disable`); a
    /// CA or client certificate that cannot be read is a configuration error.
    pub fn tls(&self) -> anyhow::Result<MakeRustlsConnect> {
        self.tls_checked()
            .map_err(|e| failure::tag(Reason::InvalidConfig, e))
    }

    fn tls_checked(&self) -> anyhow::Result<MakeRustlsConnect> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let roots = Arc::new(self.root_store()?);
        let verifier: Arc<dyn ServerCertVerifier> = match self.ssl_mode {
            SslMode::VerifyFull => {
                rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .context("TLS: building the certificate verifier")?
            }
            SslMode::VerifyCa => Arc::new(ChainOnly(
                rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .context("TLS: building the certificate verifier")?,
            )),
            _ => Arc::new(EncryptOnly(provider)),
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let chain = larch_core::tls::read_certificates("sslcert", cert)?;
                let key = PrivateKeyDer::from_pem_file(key).with_context(|| {
                    format!("sslkey {}: reading the private key", key.display())
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("sslcert/sslkey: the certificate and key do not fit")?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(MakeRustlsConnect::new(config))
    }

    fn root_store(&self) -> anyhow::Result<RootCertStore> {
        Ok(match &self.root_cert {
            Some(path) => larch_core::tls::read_ca_bundle("sslrootcert", path)?.roots,
            None => RootCertStore::empty(),
        })
    }

    /// The same TLS settings for pgwire-replication's replication session.
    pub fn replication_tls(&self) -> pgwire_replication::TlsConfig {
        use pgwire_replication::config::SslMode as M;
        pgwire_replication::TlsConfig {
            mode: match self.ssl_mode {
                SslMode::Disable => M::Disable,
                SslMode::Prefer => M::Prefer,
                SslMode::Require => M::Require,
                SslMode::VerifyCa => M::VerifyCa,
                SslMode::VerifyFull => M::VerifyFull,
            },
            ca_pem_path: self.root_cert.clone(),
            sni_hostname: None,
            client_cert_pem_path: self.client_cert.clone(),
            client_key_pem_path: self.client_key.clone(),
        }
    }
}

/// Splits the TLS parameters off a connection string (both forms); returns the rest and them.
fn take_tls_params(dsn: &str) -> anyhow::Result<(String, BTreeMap<String, String>)> {
    let mut tls = BTreeMap::new();
    let trimmed = dsn.trim();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let Some((base, query)) = trimmed.split_once('?') else {
            return Ok((trimmed.to_string(), tls));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(k)?;
            if TLS_KEYS.contains(&key.as_str()) {
                tls.insert(key, percent_decode(v)?);
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, tls));
    }
    let mut kept = Vec::new();
    for (key, value, raw) in key_value_pairs(trimmed)? {
        if TLS_KEYS.contains(&key.as_str()) {
            tls.insert(key, value);
        } else {
            kept.push(raw);
        }
    }
    Ok((kept.join(" "), tls))
}

/// libpq's `key = value` pairs (values optionally single-quoted, `\` escapes), each with its
/// raw text.
fn key_value_pairs(s: &str) -> anyhow::Result<Vec<(String, String, &str)>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= b.len() {
            return Ok(out);
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = s[start..i].to_string();
        skip_ws(&mut i);
        if i >= b.len() || b[i] != b'=' {
            bail!("invalid PostgreSQL connection string: parameter {key:?} has no `=`");
        }
        i += 1;
        skip_ws(&mut i);
        let mut value = String::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            loop {
                match b.get(i) {
                    None => {
                        bail!("invalid PostgreSQL connection string: unterminated quote in {key:?}")
                    }
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < b.len() => {
                        value.push(b[i + 1] as char);
                        i += 2;
                    }
                    Some(_) => {
                        let c = s[i..].chars().next().expect("a char");
                        value.push(c);
                        i += c.len_utf8();
                    }
                }
            }
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                if b[i] == b'\\' && i + 1 < b.len() {
                    value.push(b[i + 1] as char);
                    i += 2;
                } else {
                    let c = s[i..].chars().next().expect("a char");
                    value.push(c);
                    i += c.len_utf8();
                }
            }
        }
        out.push((key, value, &s[start..i]));
    }
}

fn percent_decode(s: &str) -> anyhow::Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| anyhow!("invalid PostgreSQL connection string: bad %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| anyhow!("invalid PostgreSQL connection string: not UTF-8"))
}

/// `require` / `prefer`: encrypt, check nothing about the server (libpq's meaning). The
/// handshake signatures are still checked, so the session is at least bound to the key the
/// server presented.
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to `sslrootcert`; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_come_out_of_both_forms() {
        let d = PgDsn::parse(
            "host=db.internal port=5433 user=app password='p a\\'ss' sslmode=verify-full \
             sslrootcert=/etc/ca.pem dbname=app",
        )
        .unwrap();
        assert_eq!(d.ssl_mode, SslMode::VerifyFull);
        assert_eq!(d.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(d.config.get_dbname(), Some("app"));
        assert_eq!(d.config.get_password(), Some(&b"p a'ss"[..]));
        assert_eq!(
            d.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );

        let u = PgDsn::parse(
            "postgres://app:secret@db.internal:5433/app?application_name=x&sslmode=verify-ca&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(u.ssl_mode, SslMode::VerifyCa);
        assert_eq!(u.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(u.config.get_application_name(), Some("x"));

        let plain = PgDsn::parse("host=/tmp dbname=app").unwrap();
        assert_eq!(plain.ssl_mode, SslMode::Prefer, "libpq's default");
        let off = PgDsn::parse("postgresql://localhost/app?sslmode=disable").unwrap();
        assert_eq!(off.ssl_mode, SslMode::Disable);
    }

    #[test]
    fn bad_tls_parameters_are_named_and_the_string_is_not_repeated() {
        let e = PgDsn::parse("host=x password=hunter2 sslmode=verify-full")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs sslrootcert"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = PgDsn::parse("host=x password=hunter2 sslmode=allow")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslmode=\"allow\" is not supported"), "{e}");
        let e = PgDsn::parse("host=x sslcert=/c.pem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslcert and sslkey go together"), "{e}");
        let e = PgDsn::parse("host=x password='hunter2")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unterminated quote") && !e.contains("hunter2"),
            "{e}"
        );
        let e = PgDsn::parse("host=x sslmode=require sslrootcert=/does/not/exist")
            .and_then(|d| {
                PgDsn {
                    ssl_mode: SslMode::VerifyFull,
                    ..d
                }
                .tls()
                .map(|_| ())
            })
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("sslrootcert /does/not/exist"),
            "{e:#}"
        );
    }
}
