//! A tiny in-cluster client for the smoke test: `kube::Config::infer()` (service-account token,
//! ca.crt and KUBERNETES_SERVICE_HOST/PORT as the fake kubelet provides them), then a
//! SelfSubjectReview; the user name goes to the termination log.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;
use kube::{Api, Client, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::infer().await?;
    println!("apiserver {}", config.cluster_url);
    let client = Client::try_from(config)?;
    let reviews: Api<SelfSubjectReview> = Api::all(client);
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default();
    println!("I am {user}");
    std::fs::write(
        "/dev/termination-log",
        format!("in-cluster client is {user}"),
    )?;
    Ok(())
}
