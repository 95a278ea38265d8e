//! PEM files as rustls wants them: the one place that reads certificate chains and CA bundles
//! for the S3 store, the PostgreSQL connections and the engine's listener.

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A PEM file that cannot be used: which file, in which role (`label`, e.g. `sslrootcert`),
/// and what is wrong with it. Never any of its contents.
#[derive(Debug, thiserror::Error)]
#[error("{label} {}: {problem}", path.display())]
pub struct PemFileError {
    pub label: String,
    pub path: PathBuf,
    pub problem: String,
}

/// A CA bundle read into a root store.
pub struct CaBundle {
    pub roots: RootCertStore,
    /// Certificates in the file that rustls could not use (they are not in `roots`).
    pub unusable: usize,
    /// The file as read, for clients that take PEM rather than a root store.
    pub pem: Vec<u8>,
}

fn error(label: &str, path: &Path, problem: impl std::fmt::Display) -> PemFileError {
    PemFileError {
        label: label.to_string(),
        path: path.to_path_buf(),
        problem: problem.to_string(),
    }
}

fn read_pem(
    label: &str,
    path: &Path,
) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), PemFileError> {
    let pem =
        std::fs::read(path).map_err(|e| error(label, path, format!("cannot read it: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(label, path, format!("not PEM certificates: {e}")))?;
    Ok((pem, certs))
}

/// The certificate chain of a PEM file (a server's or a client's), at least one certificate.
pub fn read_certificates(
    label: &str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, PemFileError> {
    let (_, certs) = read_pem(label, path)?;
    if certs.is_empty() {
        return Err(error(label, path, "no CERTIFICATE block in the file"));
    }
    Ok(certs)
}

/// A CA bundle: refused when unreadable, not PEM, or without one usable CA certificate.
pub fn read_ca_bundle(label: &str, path: &Path) -> Result<CaBundle, PemFileError> {
    let (pem, certs) = read_pem(label, path)?;
    let mut roots = RootCertStore::empty();
    let (added, unusable) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(error(
            label,
            path,
            format!("0 usable CA certificate(s), {unusable} unusable; it needs at least one"),
        ));
    }
    Ok(CaBundle {
        roots,
        unusable,
        pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_role_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = read_ca_bundle("sslrootcert", &missing).err().unwrap();
        assert!(
            e.to_string().starts_with(&format!(
                "sslrootcert {}: cannot read it",
                missing.display()
            )),
            "{e}"
        );
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let e = read_ca_bundle("S3 CA bundle", &garbage).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "S3 CA bundle {}: 0 usable CA certificate(s), 0 unusable; it needs at least one",
                garbage.display()
            )
        );
        let e = read_certificates("--tls-cert", &garbage).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "--tls-cert {}: no CERTIFICATE block in the file",
                garbage.display()
            )
        );
        let truncated = dir.path().join("truncated.pem");
        std::fs::write(&truncated, "-----BEGIN CERTIFICATE-----\nMIIB\n").unwrap();
        let e = read_certificates("sslcert", &truncated).unwrap_err();
        assert!(e.to_string().contains(": not PEM certificates:"), "{e}");
    }
}
