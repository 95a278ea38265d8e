//! What the reconcile steps of every kind pass on: a [`Blocked`] round builds nothing and says
//! why (the dereference and validate steps return it, an apply the API server refused ends in
//! one), and when to look again.

use std::time::Duration;

use crate::reconcile::conditions::Problem;
use crate::reconcile::context::Rejected;
use crate::reconcile::dereference::{Missing, RECHECK};

/// Why a round builds nothing, and when to look again (`None`: the kind's usual requeue).
#[derive(Clone, Debug, PartialEq)]
pub struct Blocked {
    pub problem: Problem,
    pub recheck: Option<Duration>,
}

impl Blocked {
    /// Something the spec names does not exist (yet): looked at again after [`RECHECK`].
    pub fn missing(missing: &Missing, ns: &str) -> Blocked {
        Blocked {
            problem: Problem::new(missing.reason(), missing.message(ns)),
            recheck: Some(RECHECK),
        }
    }

    /// The spec cannot work: only a new spec changes that.
    pub fn invalid(message: String) -> Blocked {
        Blocked {
            problem: Problem::new("InvalidSpec", message),
            recheck: None,
        }
    }

    /// A child the API server refused: tried again in a minute, sent again only once changed.
    pub fn rejected(rejected: &Rejected) -> Blocked {
        Blocked {
            problem: Problem::new("ChildRejected", rejected.to_string()),
            recheck: Some(Duration::from_secs(60)),
        }
    }
}
