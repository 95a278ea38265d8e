//! Holding a `coordination.k8s.io/v1` Lease: the operator's leader election and a continuous
//! export's single-writer lease (W9). The decision is pure ([`decide`]); the loop writes the
//! Lease with optimistic concurrency (create, or replace at the read resourceVersion), so two
//! candidates can never both win one round. A holder that cannot renew within its renew
//! deadline — shorter than the lease duration, so it stops before anyone may take over —
//! gives up, and its caller exits.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it holding it.
    Create,
    /// Someone else's Lease expired (or it is free): take it over.
    Take,
    /// Ours: renew it.
    Renew,
    /// Held by a live leader.
    Wait,
}

pub fn decide(lease: Option<&Lease>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return if lease.is_some() {
            Decision::Take
        } else {
            Decision::Create
        };
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == identity {
        return Decision::Renew;
    }
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(15) as i64);
    let expired = spec
        .renew_time
        .as_ref()
        .is_none_or(|r| now.duration_since(r.0) > duration);
    if holder.is_empty() || expired {
        Decision::Take
    } else {
        Decision::Wait
    }
}

pub struct LeaderElector {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    /// Give up when no renewal succeeded for this long (less than `lease_duration`).
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl LeaderElector {
    fn spec(&self, previous: Option<&LeaseSpec>, now: Timestamp, take: bool) -> LeaseSpec {
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_duration.as_secs() as i32),
            acquire_time: if take {
                Some(MicroTime(now))
            } else {
                previous.and_then(|p| p.acquire_time.clone())
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if take && previous.is_some() {
                transitions + 1
            } else {
                transitions
            }),
            ..Default::default()
        }
    }

    /// One round: returns whether we hold the lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let result = match decide(current.as_ref(), &self.identity, now) {
            Decision::Wait => return Ok(false),
            Decision::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(None, now, true)),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            d @ (Decision::Take | Decision::Renew) => {
                let mut lease = current.expect("a lease to take or renew");
                lease.spec = Some(self.spec(lease.spec.as_ref(), now, d == Decision::Take));
                // resourceVersion is kept: a concurrent writer makes this a 409.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Blocks until this process leads.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    /// Renews forever; returns when the lease is lost — another holder, or no successful
    /// renewal within the renew deadline (the caller should stop and exit).
    pub async fn keep(&self) {
        let mut last_ok = std::time::Instant::now();
        loop {
            let left = self.renew_deadline.saturating_sub(last_ok.elapsed());
            if left.is_zero() {
                tracing::error!(lease = %self.name, "no renewal within the renew deadline");
                return;
            }
            tokio::time::sleep(self.retry.min(left)).await;
            // A renewal that itself hangs must not outlive the deadline.
            let left = self.renew_deadline.saturating_sub(last_ok.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => last_ok = std::time::Instant::now(),
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.name, "the lease is held by someone else");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(lease = %self.name, error = %e, "renewing the lease"),
                Err(_) => tracing::warn!(lease = %self.name, "renewing the lease timed out"),
            }
        }
    }

    /// Gives the lease up (clears the holder) so a successor need not wait for it to expire.
    /// Only when we still hold it; errors are the caller's to log.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let ours = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(self.identity.as_str());
        if !ours {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = None;
        }
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }

    /// The current holder, for logs while waiting.
    pub async fn holder(&self) -> Option<String> {
        self.api
            .get_opt(&self.name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_secs_ago: i64, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        assert_eq!(decide(None, "me", now), Decision::Create);
        assert_eq!(
            decide(Some(&lease("me", 3, now)), "me", now),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&lease("other", 3, now)), "me", now),
            Decision::Wait
        );
        assert_eq!(
            decide(Some(&lease("other", 16, now)), "me", now),
            Decision::Take
        );
        assert_eq!(decide(Some(&lease("", 1, now)), "me", now), Decision::Take);
        let empty = Lease::default();
        assert_eq!(decide(Some(&empty), "me", now), Decision::Take);
    }
}
