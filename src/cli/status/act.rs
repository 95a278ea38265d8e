//! What a user does to one object besides looking at it: `larch logs KIND/NAME` prints the
//! logs of the pods the operator runs for it, `larch run-now KIND/NAME` starts a new run of a
//! OneShot ArchiveExport or an ArchiveRestore (the `larch.dev/run-requested` annotation).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams, Patch, PatchParams};
use serde::Serialize;

use super::{bad_input, config, object::kind_of};
use crate::operator::crd::archive_export::{ExportMode, RUN_REQUESTED_ANNOTATION};
use crate::operator::crd::{ArchiveExport, ArchiveRestore};

/// Which cluster: the same flags as `larch status`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// The namespace (default: the kubeconfig's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The kubeconfig file (default: `KUBECONFIG`, else `~/.kube/config`, else in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterArgs {
    /// The client and the namespace to use.
    async fn connect(&self) -> anyhow::Result<(kube::Client, String)> {
        let config = config(self.kubeconfig.as_deref(), self.context.as_deref()).await?;
        let ns = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
        Ok((client, ns))
    }
}

#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The object, `KIND/NAME` (`archiveexport/users`, `archivesource/cache`,
    /// `archiverestore/back`).
    #[arg(value_name = "KIND/NAME")]
    pub object: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Every pod of the object (oldest first), not only the newest.
    #[arg(long)]
    pub all: bool,
    /// Keep printing the newest pod's new lines until it ends (or Ctrl-C).
    #[arg(short = 'f', long, conflicts_with = "all")]
    pub follow: bool,
    /// Only the last N lines of each pod.
    #[arg(long, value_name = "N")]
    pub tail: Option<i64>,
    /// The previous container's logs (the one that crashed before a restart).
    #[arg(long)]
    pub previous: bool,
}

/// The label the operator puts on every pod it runs for an object of `kind`.
fn pod_label(kind: &str) -> anyhow::Result<&'static str> {
    match kind {
        "ArchiveExport" => Ok("larch.dev/archive-export"),
        "ArchiveSource" => Ok("larch.dev/archive-source"),
        "ArchiveRestore" => Ok("larch.dev/archive-restore"),
        _ => Err(bad_input(anyhow::anyhow!(
            "an ArchiveSourceSet runs no pod of its own: see the logs of its ArchiveSources or \
             ArchiveRestores (`larch status archivesourceset/NAME` names them)"
        ))),
    }
}

pub async fn logs(args: LogsArgs) -> anyhow::Result<i32> {
    let (kind, name) = kind_of(&args.object).map_err(bad_input)?;
    let label = pod_label(kind)?;
    let (client, ns) = args.cluster.connect().await?;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let mut found = pods
        .list(&ListParams::default().labels(&format!("{label}={name}")))
        .await
        .with_context(|| format!("listing the pods of {kind} {ns}/{name}"))?
        .items;
    if found.is_empty() {
        anyhow::bail!(
            "{kind} {ns}/{name} has no pod now (a finished run's pods go with its Job's TTL): \
             `larch status {}` shows its last result",
            args.object
        );
    }
    found.sort_by(|a, b| {
        let created = |p: &Pod| p.metadata.creation_timestamp.clone().map(|t| t.0);
        created(a).cmp(&created(b))
    });
    let chosen = if args.all {
        found
    } else {
        found.split_off(found.len() - 1)
    };
    let params = LogParams {
        follow: args.follow,
        tail_lines: args.tail,
        previous: args.previous,
        ..LogParams::default()
    };
    let many = chosen.len() > 1;
    for pod in chosen {
        let pod_name = pod.metadata.name.unwrap_or_default();
        if many {
            println!("==> pod {pod_name} <==");
        }
        let mut lines = pods
            .log_stream(&pod_name, &params)
            .await
            .with_context(|| format!("reading the logs of pod {ns}/{pod_name}"))?
            .lines();
        while let Some(line) = lines
            .try_next()
            .await
            .with_context(|| format!("reading the logs of pod {ns}/{pod_name}"))?
        {
            println!("{line}");
        }
    }
    Ok(0)
}

#[derive(Args, Debug)]
pub struct RunNowArgs {
    /// A OneShot ArchiveExport (`archiveexport/NAME`; with a schedule: one run now, besides
    /// the schedule's) or an ArchiveRestore (`archiverestore/NAME`).
    #[arg(value_name = "KIND/NAME")]
    pub object: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub output: crate::cli::output::OutputArgs,
}

/// What `run-now` did.
#[derive(Serialize)]
pub struct RunRequested {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The new value of the `larch.dev/run-requested` annotation.
    pub token: String,
}

pub async fn run_now(args: RunNowArgs) -> anyhow::Result<i32> {
    let (kind, name) = kind_of(&args.object).map_err(bad_input)?;
    let (client, ns) = args.cluster.connect().await?;
    let token = jiff::Timestamp::now().to_string();
    let patch = Patch::Merge(serde_json::json!({
        "metadata": { "annotations": { RUN_REQUESTED_ANNOTATION: token } }
    }));
    let params = PatchParams::default();
    let refused = |e: kube::Error| match e {
        kube::Error::Api(s) if s.code == 404 => {
            bad_input(anyhow::anyhow!("{kind} {ns}/{name} not found"))
        }
        e => anyhow::Error::from(e).context(format!("annotating {kind} {ns}/{name}")),
    };
    match kind {
        "ArchiveExport" => {
            let api: Api<ArchiveExport> = Api::namespaced(client, &ns);
            let export = api.get(name).await.map_err(refused)?;
            if export.spec.mode == ExportMode::Continuous {
                return Err(bad_input(anyhow::anyhow!(
                    "ArchiveExport {ns}/{name} is Continuous: it runs all the time, there is no \
                     run to start"
                )));
            }
            api.patch(name, &params, &patch).await.map_err(refused)?;
        }
        "ArchiveRestore" => {
            let api: Api<ArchiveRestore> = Api::namespaced(client, &ns);
            api.patch(name, &params, &patch).await.map_err(refused)?;
        }
        _ => {
            return Err(bad_input(anyhow::anyhow!(
                "{kind} has no runs to start: run-now takes an archiveexport (OneShot) or an \
                 archiverestore"
            )));
        }
    }
    let done = RunRequested {
        kind: kind.to_string(),
        namespace: ns,
        name: name.to_string(),
        token,
    };
    crate::cli::output::print(&done, args.output.format(), || {
        format!(
            "{} {}/{}: run requested ({RUN_REQUESTED_ANNOTATION}={}); follow it with `larch \
             status {}`\n",
            done.kind, done.namespace, done.name, done.token, args.object
        )
    })?;
    Ok(0)
}
