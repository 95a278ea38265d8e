//! Why a PostgreSQL error happened: the SQLSTATE of a client error, the replication
//! protocol's text, a connection that closed. The PostgreSQL layer's
//! [`failure::Classifier`] asks the archive layer's for the rest.

use larch_core::failure::{self, Reason};

/// The PostgreSQL layer's classifier: the client's and the replication protocol's errors,
/// then the archive layer's types.
pub fn reason_of(cause: &(dyn std::error::Error + 'static)) -> Option<Reason> {
    if let Some(pg) = cause.downcast_ref::<tokio_postgres::Error>() {
        return of_postgres(pg);
    }
    if let Some(e) = cause.downcast_ref::<pgwire_replication::PgWireError>() {
        return of_replication(e);
    }
    larch_archive::error::reason_of(cause)
}

/// Why `err` happened, as far as this layer and the ones below know.
pub fn classify(err: &anyhow::Error) -> Reason {
    failure::classify_with(err, reason_of)
}

/// The reason of a PostgreSQL client error: its SQLSTATE, or a connection that closed, never
/// opened or timed out (an I/O cause further down a chain says the same).
pub fn of_postgres(e: &tokio_postgres::Error) -> Option<Reason> {
    if let Some(code) = e.code() {
        return Reason::of_sqlstate(code.code());
    }
    let text = e.to_string();
    (e.is_closed() || text.starts_with("error connecting") || text.starts_with("timeout"))
        .then_some(Reason::ConnectionFailed)
}

/// The reason of a replication-protocol error.
pub fn of_replication(e: &pgwire_replication::PgWireError) -> Option<Reason> {
    use pgwire_replication::PgWireError as E;
    match e {
        E::Io(_) => Some(Reason::ConnectionFailed),
        E::Auth(_) => Some(Reason::AuthenticationFailed),
        E::Server(text) => failure::sqlstate_in(text).and_then(Reason::of_sqlstate),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    #[test]
    fn replication_errors_name_their_sqlstate() {
        let wire = anyhow::Error::from(pgwire_replication::PgWireError::Server(
            "permission denied to start WAL sender (SQLSTATE 42501)".into(),
        ));
        assert_eq!(classify(&wire), Reason::PermissionDenied);
        let auth = anyhow::Error::from(pgwire_replication::PgWireError::Auth("bad".into()))
            .context("connecting");
        assert_eq!(classify(&auth), Reason::AuthenticationFailed);
        // The archive layer's types are still known from here.
        let escape = anyhow::Error::from(larch_archive::ArchiveError::KeyEscapesRoot {
            key: "../x/".into(),
        });
        assert_eq!(classify(&escape), Reason::InvalidConfig);
        assert_eq!(classify(&anyhow!("something odd")), Reason::Failed);
    }
}
