//! `larch status` (also `kubectl larch status`, the binary installed as `kubectl-larch`): every
//! ArchiveExport, ArchiveSource, ArchiveRestore and ArchiveSourceSet of the cluster on one
//! screen, with the recent warning Events about them, read with the user's kubeconfig; or one
//! object with its conditions and Events (`larch status archiveexport/NAME`).
//!
//! A user allowed less than the whole cluster (the chart's `view` bound in one namespace) still
//! gets a screen: a list refused with 403 becomes a note, and a namespaced kind refused in every
//! namespace is listed in the kubeconfig's namespace instead.

mod act;
mod lines;
mod object;
mod render;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use kube::core::NamespaceResourceScope;
use serde::de::DeserializeOwned;

use crate::operator::crd::{ArchiveExport, ArchiveRestore, ArchiveSource, ArchiveSourceSet};
pub use act::{LogsArgs, RunNowArgs, logs, run_now};
pub use lines::Overview;
use lines::{export_line, restore_line, source_line, source_set_line, warning_lines};
pub use render::render;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// One object, `KIND/NAME` (`archiveexport/users`, `archivesource/cache`,
    /// `archiverestore/back`, `archivesourceset/seed`): its conditions, progress and Events.
    #[arg(value_name = "KIND/NAME")]
    pub object: Option<String>,
    /// Only this namespace (default: every namespace; for one object: the kubeconfig's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub output: crate::cli::output::OutputArgs,
    /// Warning Events to show (newest first; for one object: its Events of every type).
    #[arg(long, default_value_t = 10)]
    pub events: usize,
    /// The kubeconfig file (default: `KUBECONFIG`, else `~/.kube/config`, else in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<i32> {
    // A bad KIND/NAME is refused before the kubeconfig is read.
    let object = args
        .object
        .as_deref()
        .map(object::kind_of)
        .transpose()
        .map_err(bad_input)?;
    let config = config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let home_namespace = config.default_namespace.clone();
    // Errors name the cluster: a wrong context or a closed port says which server it tried.
    let cluster = format!("the cluster at {}", config.cluster_url);
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    if let Some((kind, name)) = object {
        let ns = args.namespace.as_deref().unwrap_or(&home_namespace);
        return object::run(&client, ns, (kind, name), args.output.format(), args.events)
            .await
            .with_context(|| cluster.clone());
    }
    let overview = read(
        &client,
        args.namespace.as_deref(),
        &home_namespace,
        args.events,
    )
    .await
    .with_context(|| cluster.clone())?;
    crate::cli::output::print(&overview, args.output.format(), || render(&overview))?;
    Ok(0)
}

/// The client configuration: `--kubeconfig` (else `KUBECONFIG`, `~/.kube/config`, in-cluster)
/// and `--context`.
async fn config(kubeconfig: Option<&Path>, context: Option<&str>) -> anyhow::Result<Config> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let which = context
        .map(|c| format!(" (context {c})"))
        .unwrap_or_default();
    match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))
                .map_err(bad_input)?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("kubeconfig {}{which}", path.display()))
                .map_err(bad_input)
        }
        None if context.is_some() => Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("kubeconfig (KUBECONFIG or ~/.kube/config){which}"))
            .map_err(bad_input),
        None => Config::infer().await.context(
            "no Kubernetes client configuration (KUBECONFIG, ~/.kube/config or in-cluster)",
        ),
    }
}

/// Arguments someone must fix (exit 2): a bad KIND/NAME, kubeconfig or context, no such object.
fn bad_input(e: anyhow::Error) -> anyhow::Error {
    crate::failure::tag(crate::failure::Reason::InvalidConfig, e)
}

/// A failed list, saying what to do when the kind is unknown to the cluster.
fn listing(what: &str, e: kube::Error) -> anyhow::Error {
    match &e {
        kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
            "listing {what}: the cluster does not know the kind: install larch's CRDs (`larch crd | kubectl apply --server-side -f -`)"
        ),
        _ => anyhow::Error::from(e).context(format!("listing {what}")),
    }
}

fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// Lists what the user may see; a 403 is a note, never a failure of the whole screen.
struct Reader<'a> {
    client: &'a kube::Client,
    /// `-n`: only this namespace.
    namespace: Option<&'a str>,
    /// The kubeconfig's namespace: where a kind refused in every namespace is listed.
    home_namespace: &'a str,
    notes: Vec<String>,
}

impl Reader<'_> {
    /// The objects of a namespaced kind in `-n`'s namespace, else in every namespace, else
    /// (refused) in the kubeconfig's namespace.
    async fn namespaced<K>(&mut self, what: &str, lp: &ListParams) -> anyhow::Result<Vec<K>>
    where
        K: kube::Resource<Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let ns = match self.namespace {
            Some(ns) => ns,
            None => match Api::<K>::all(self.client.clone()).list(lp).await {
                Ok(l) => return Ok(l.items),
                Err(e) if forbidden(&e) => {
                    self.notes.push(format!(
                        "{what}: not allowed to list in every namespace; showing namespace {} (the kubeconfig's)",
                        self.home_namespace
                    ));
                    self.home_namespace
                }
                Err(e) => return Err(listing(what, e)),
            },
        };
        match Api::<K>::namespaced(self.client.clone(), ns).list(lp).await {
            Ok(l) => Ok(l.items),
            Err(e) if forbidden(&e) => {
                self.notes
                    .push(format!("{what}: not allowed to list in namespace {ns}"));
                Ok(Vec::new())
            }
            Err(e) => Err(listing(what, e)),
        }
    }

    /// The ArchiveSourceSets (cluster-scoped): none and a note when not allowed.
    async fn source_sets(&mut self) -> anyhow::Result<Vec<ArchiveSourceSet>> {
        let what = "ArchiveSourceSets";
        match Api::<ArchiveSourceSet>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => Ok(l.items),
            Err(e) if forbidden(&e) => {
                self.notes
                    .push(format!("{what}: not allowed to list (cluster-scoped)"));
                Ok(Vec::new())
            }
            Err(e) => Err(listing(what, e)),
        }
    }
}

/// Reads the four kinds and the warning Events about them; `home_namespace` is the kubeconfig's
/// namespace, where a kind the user may not list in every namespace is listed instead.
pub async fn read(
    client: &kube::Client,
    namespace: Option<&str>,
    home_namespace: &str,
    events: usize,
) -> anyhow::Result<Overview> {
    let mut r = Reader {
        client,
        namespace,
        home_namespace,
        notes: Vec::new(),
    };
    let lp = ListParams::default();
    let exports = r.namespaced::<ArchiveExport>("ArchiveExports", &lp).await?;
    let sources = r.namespaced::<ArchiveSource>("ArchiveSources", &lp).await?;
    let restores = r
        .namespaced::<ArchiveRestore>("ArchiveRestores", &lp)
        .await?;
    let sets = r.source_sets().await?;
    let warnings = r
        .namespaced::<Event>("Events", &ListParams::default().fields("type=Warning"))
        .await?;
    Ok(Overview {
        exports: exports.iter().map(export_line).collect(),
        sources: sources.iter().map(source_line).collect(),
        restores: restores.iter().map(restore_line).collect(),
        source_sets: sets.iter().map(source_set_line).collect(),
        warnings: warning_lines(warnings, events),
        notes: r.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::lines::{ExportLine, SourceSetLine, next_run};
    use super::*;

    #[test]
    fn the_next_run_of_a_scheduled_export_in_its_time_zone() {
        let now: jiff::Timestamp = "2027-01-14T10:17:30Z".parse().unwrap();
        let mut e: crate::operator::crd::ArchiveExport = serde_saphyr::from_str(include_str!(
            "../../../crates/operator/src/builders/testdata/export-oneshot-s3.input.yaml"
        ))
        .unwrap();
        e.spec.schedule = None;
        assert_eq!(next_run(&e, now), None, "no schedule");
        e.spec.schedule = Some(
            serde_json::from_value(
                serde_json::json!({"cron": "30 2 * * *", "timeZone": "Asia/Tokyo"}),
            )
            .unwrap(),
        );
        // 02:30 in Tokyo (UTC+9) is 17:30 UTC the day before.
        assert_eq!(next_run(&e, now).as_deref(), Some("2027-01-14T17:30:00Z"));
        e.spec.schedule.as_mut().unwrap().suspend = Some(true);
        assert_eq!(next_run(&e, now), None, "suspended");
    }

    #[test]
    fn one_screen_pads_columns_and_says_why_not_ready() {
        let o = Overview {
            exports: vec![ExportLine {
                namespace: "db".into(),
                name: "orders".into(),
                mode: "OneShot".into(),
                ready: "False".into(),
                reason: Some("TableNotFound".into()),
                last_export: None,
                position: Some("0/16B3748".into()),
                epoch: Some(3),
                rows: Some(200_000),
                schedule: Some("@daily".into()),
                run: Some("failed".into()),
                next_run: Some("2027-01-16T00:00:00Z".into()),
                progress: Some("Failed 60%".into()),
            }],
            source_sets: vec![SourceSetLine {
                name: "seed".into(),
                ready: "False".into(),
                desired_namespaces: Some(3),
                ready_namespaces: Some(2),
                failing: vec!["dev-c: QuotaExceeded".into()],
            }],
            ..Default::default()
        };
        let text = render(&o);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ARCHIVE EXPORTS");
        assert!(
            lines[1].starts_with("NAMESPACE  NAME    MODE     READY"),
            "{text}"
        );
        assert!(
            lines[2].contains("db         orders  OneShot  False (TableNotFound)"),
            "{text}"
        );
        assert!(
            lines[2].contains("200000  Failed 60%  @daily    2027-01-16T00:00:00Z"),
            "{text}"
        );
        assert!(lines[1].ends_with("SCHEDULE  NEXT RUN"), "{text}");
        assert!(
            text.contains("seed  False  2/3               dev-c: QuotaExceeded"),
            "{text}"
        );
    }

    /// An ArchiveRestore as the operator leaves it after a successful run of two tables.
    fn restored() -> ArchiveRestore {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "larch.dev/v1alpha1",
            "kind": "ArchiveRestore",
            "metadata": {"name": "events-back", "namespace": "db"},
            "spec": {
                "archive": {"exportRef": {"name": "events"}},
                "target": {"postgres": {"connectionSecretRef": {"name": "pg", "key": "dsn"}}}
            },
            "status": {
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "RestoreSucceeded",
                    "message": "", "lastTransitionTime": "2027-01-14T10:00:00Z"
                }],
                "run": {"id": "abc", "startTime": "2027-01-14T09:59:00Z",
                        "completionTime": "2027-01-14T10:00:00Z", "succeeded": true},
                "position": "0/16B3748",
                "at": "0/16B3748",
                "durationSeconds": 4.5,
                "tables": [
                    {"table": "public.events", "rows": 1200, "position": "0/16B3748", "action": "created"},
                    {"table": "public.users", "rows": 34, "position": "0/16B3748", "action": "replaced"}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_restore_line_adds_up_its_tables() {
        let line = lines::restore_line(&restored());
        assert_eq!(line.ready, "True");
        assert_eq!(line.reason, None);
        assert_eq!(line.run.as_deref(), Some("succeeded"));
        assert_eq!(line.rows, Some(1234));
        assert_eq!(line.tables, ["public.events", "public.users"]);
        assert_eq!(line.position.as_deref(), Some("0/16B3748"));
        assert_eq!(line.completed.as_deref(), Some("2027-01-14T10:00:00Z"));
        let mut waiting = restored();
        let status = waiting.status.as_mut().unwrap();
        status.tables.clear();
        status.run.as_mut().unwrap().succeeded = None;
        status.database_wait = Some(serde_json::from_value(serde_json::json!({
            "attempts": 3, "nextAttemptTime": "2027-01-14T10:05:00Z", "reason": "ConnectionFailed"
        })).unwrap());
        let line = lines::restore_line(&waiting);
        assert_eq!(line.rows, None, "nothing restored yet");
        assert_eq!(line.run.as_deref(), Some("running"));
        assert_eq!(
            line.database_wait.as_deref(),
            Some("ConnectionFailed (attempt 3, next at 2027-01-14T10:05:00Z)")
        );
    }

    #[test]
    fn restores_and_notes_in_the_table_and_in_json() {
        let o = Overview {
            restores: vec![lines::restore_line(&restored())],
            notes: vec!["ArchiveSourceSets: not allowed to list (cluster-scoped)".into()],
            ..Default::default()
        };
        let text = render(&o);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ARCHIVE EXPORTS", "{text}");
        let at = lines.iter().position(|l| *l == "ARCHIVE RESTORES").unwrap();
        assert_eq!(
            lines[at + 1],
            "NAMESPACE  NAME         READY  RUN        ROWS  TABLES                      POSITION   AT         COMPLETED             WAITING FOR DATABASE",
            "{text}"
        );
        assert_eq!(
            lines[at + 2],
            "db         events-back  True   succeeded  1234  public.events,public.users  0/16B3748  0/16B3748  2027-01-14T10:00:00Z  -",
            "{text}"
        );
        assert!(
            text.ends_with("\nNOTES\nArchiveSourceSets: not allowed to list (cluster-scoped)\n"),
            "{text}"
        );
        assert!(
            !render(&Overview::default()).contains("NOTES"),
            "no notes, no section"
        );

        let json = serde_json::to_value(&o).unwrap();
        let r = &json["restores"][0];
        assert_eq!(r["name"], "events-back", "{json}");
        assert_eq!(r["ready"], "True", "{json}");
        assert_eq!(r["rows"], 1234, "{json}");
        assert_eq!(r["position"], "0/16B3748", "{json}");
        assert_eq!(r["duration_seconds"], 4.5, "{json}");
        assert_eq!(
            json["notes"],
            serde_json::json!(["ArchiveSourceSets: not allowed to list (cluster-scoped)"])
        );
        assert_eq!(json["source_sets"], serde_json::json!([]));
    }
}
