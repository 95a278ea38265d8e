//! Entry points of the operator subcommands (`larch crd`, `larch operator`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::export::lease::LeaderElector;
use crate::operator::builders::pod::PodUser;
use crate::operator::controllers::{self, context::Context};
use crate::operator::metrics::Metrics;
use crate::operator::probe::HttpProber;
use crate::operator::server::{ServerState, router};

/// `larch crd`: print every CRD as multi-document YAML. Returns the exit code.
pub fn crd() -> i32 {
    print!("{}", crate::operator::crd::all_yaml());
    0
}

/// Flags of `larch operator`.
#[derive(Args, Debug, Clone)]
#[command(after_help = crate::cli::env_section(&[
    "  POD_NAME            this replica's name, the leader Lease holder (default: HOSTNAME)",
    crate::cli::env_help::KUBE,
    crate::cli::env_help::LOG,
]))]
pub struct OperatorArgs {
    /// Image of the pods the operator creates (runs `larch export` / `larch engine`).
    #[arg(long, env = "LARCH_IMAGE")]
    pub image: String,
    /// Address of the operator's health and metrics endpoints (loopback by default; the chart
    /// passes the pod IP).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "LARCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Elect a leader on a coordination.k8s.io Lease before reconciling (for several replicas).
    #[arg(long, env = "LARCH_LEADER_ELECTION", default_value_t = false)]
    pub leader_election: bool,
    /// Namespace of the leader Lease (default: the pod's namespace, from POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, default_value = "larch-operator")]
    pub lease_name: String,
    /// Do not run the ArchiveSourceSet controller (the chart then grants no namespace or
    /// Secret rights).
    #[arg(long, env = "LARCH_DISABLE_SOURCE_SETS")]
    pub disable_source_sets: bool,
    /// Give every ArchiveSource that does not say otherwise (`spec.networkPolicy.enabled`) a
    /// NetworkPolicy admitting only this operator's namespace and its listed clients.
    #[arg(long, env = "LARCH_NETWORK_POLICIES")]
    pub network_policies: bool,
    /// Do not generate engine API tokens: an ArchiveSource without `spec.access.tokenSecretRef`
    /// then has none (reads open). By default the operator creates a Secret
    /// `<source>-engine-token` with a random token (the chart then grants `create` on Secrets).
    #[arg(long, env = "LARCH_NO_GENERATED_ENGINE_TOKENS")]
    pub no_generated_engine_tokens: bool,
    /// A ClusterRole with the rights on Leases a continuous export needs, which the operator
    /// binds to its own ServiceAccount (`POD_SERVICE_ACCOUNT`) in each namespace where it
    /// manages them (the chart's `<release>-export-leases`; the operator then holds no Lease
    /// rights cluster-wide). Unset: the operator's own role must grant them.
    #[arg(long, env = "LARCH_EXPORT_LEASE_ROLE")]
    pub export_lease_role: Option<String>,
    /// The operator's ServiceAccount (the chart sets it from `spec.serviceAccountName`).
    #[arg(long, env = "POD_SERVICE_ACCOUNT")]
    pub service_account: Option<String>,
    /// UID (also GID and fsGroup) of the pods the operator creates, or `platform` to leave it
    /// to the platform (OpenShift's restricted SCC assigns one; pods keep `runAsNonRoot`).
    #[arg(long, env = "LARCH_POD_RUN_AS_USER", default_value = "65532")]
    pub pod_run_as_user: PodUser,
}

/// `larch operator`: runs the controllers until a signal (inside the CLI's tokio runtime).
pub async fn operator(args: OperatorArgs) -> anyhow::Result<i32> {
    run(args).await.map(|()| 0)
}

/// Waits until this process holds the operator's Lease.
async fn lead(args: &OperatorArgs, client: &kube::Client) -> LeaderElector {
    let ns = args
        .lease_namespace
        .clone()
        .or_else(|| args.namespace.clone())
        .unwrap_or_else(|| client.default_namespace().to_string());
    let identity = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("larch-operator-{}", std::process::id()));
    let e = LeaderElector {
        api: Api::<Lease>::namespaced(client.clone(), &ns),
        name: args.lease_name.clone(),
        identity,
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry: Duration::from_secs(2),
    };
    tracing::info!(lease = %e.name, identity = %e.identity, "waiting for leadership");
    e.acquire().await;
    tracing::info!("leading");
    e
}

async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let app = router(ServerState {
        metrics: metrics.clone(),
        ready: ready.clone(),
    });
    tokio::spawn(async move {
        if let Err(e) = larch_core::serve::serve(listener, app, std::future::pending()).await {
            tracing::error!(error = %e, "health server stopped");
        }
    });

    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes client configuration (in-cluster or KUBECONFIG)")?;
    client
        .apiserver_version()
        .await
        .context("reaching the Kubernetes API server")?;
    ready.store(true, Ordering::Relaxed);
    tracing::info!(image = %args.image, namespace = ?args.namespace, "larch operator starting");

    let elector = if args.leader_election {
        Some(lead(&args, &client).await)
    } else {
        None
    };

    // The namespace engines' NetworkPolicies admit probes from.
    let operator_namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let mut ctx = Context::new(client, args.image, metrics, Arc::new(HttpProber::default()));
    ctx.build.operator_namespace = operator_namespace;
    ctx.build.network_policies = args.network_policies;
    ctx.build.generate_engine_tokens = !args.no_generated_engine_tokens;
    ctx.build.pod_user = args.pod_run_as_user;
    if let Some(role) = args.export_lease_role {
        let service_account = args
            .service_account
            .context("--export-lease-role needs the operator's ServiceAccount (--service-account, POD_SERVICE_ACCOUNT)")?;
        ctx.lease_rights = Some(controllers::lease_rights::LeaseRights {
            cluster_role: role,
            service_account,
            namespace: ctx.build.operator_namespace.clone(),
        });
    }
    let ctx = Arc::new(ctx);
    let controllers = controllers::run(ctx, args.namespace, !args.disable_source_sets);
    match elector {
        Some(e) => tokio::select! {
            _ = controllers => Ok(()),
            _ = e.keep() => anyhow::bail!("lost leadership; exiting so a fresh process can take over"),
        },
        None => {
            controllers.await;
            Ok(())
        }
    }
}
