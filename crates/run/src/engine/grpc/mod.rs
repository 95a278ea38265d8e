//! laredo's gRPC API (`laredo.v1.LaredoQueryService`, `laredo.v1.LaredoOAMService`) on its own
//! listener, as laredo-server serves it: the Connect protocol (unary and server streaming,
//! proto and JSON), gRPC over HTTP/2 (h2c or TLS) and gRPC-Web, all on one port. One
//! implementation ([`Api`], the tonic service traits) answers all three: tonic serves gRPC and
//! gRPC-Web, [`connect`] turns Connect requests into calls of the same methods. The access
//! rules are the HTTP API's (`access`): queries are reads, status RPCs are status, pause and
//! resume are control; CheckReady is open like `/health/ready`.

mod connect;
mod oam;
mod query;
mod serve;
mod status;
mod watch;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use http::header;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use larch_laredo_api::v1::laredo_oam_service_server::LaredoOamServiceServer;
use larch_laredo_api::v1::laredo_query_service_server::LaredoQueryServiceServer;

use super::Shared;
use super::access::{self, ApiAccess};
use super::targets::memory::MemoryTarget;

pub use serve::serve;

/// What the gRPC services read and act on.
#[derive(Clone)]
pub struct Api {
    shared: Arc<Shared>,
    access: Arc<ApiAccess>,
    started_at: pbjson_types::Timestamp,
    /// Ends the streams (Subscribe, WatchStatus) when the engine stops.
    stop: CancellationToken,
}

/// Which access rule an RPC falls under.
#[derive(Clone, Copy, Debug)]
enum Group {
    /// Readiness: always open.
    Open,
    /// Row data.
    Reads,
    /// Names, positions, states and errors; no row value.
    Status,
    /// Pause and resume.
    Control,
}

impl Api {
    pub fn new(shared: Arc<Shared>, access: Arc<ApiAccess>, stop: CancellationToken) -> Api {
        Api {
            shared,
            access,
            started_at: status::now(),
            stop,
        }
    }

    /// Refuses a request the access policy does not let through.
    fn allow<T>(&self, request: &tonic::Request<T>, group: Group) -> Result<(), Status> {
        let protected = match group {
            Group::Open => false,
            Group::Reads => self.access.protect_reads,
            Group::Status => self.access.protect_status,
            Group::Control if !self.access.control => {
                return Err(Status::permission_denied(access::CONTROL_DISABLED));
            }
            Group::Control => true,
        };
        let presented = request
            .metadata()
            .get(header::AUTHORIZATION.as_str())
            .map(|v| v.as_bytes());
        if protected && !self.access.authorizes(presented) {
            return Err(Status::unauthenticated(access::UNAUTHORIZED));
        }
        Ok(())
    }

    /// The memory table `schema.table`.
    fn memory_table(&self, schema: &str, table: &str) -> Result<Arc<MemoryTarget>, Status> {
        if schema.is_empty() || table.is_empty() {
            return Err(Status::invalid_argument("schema and table are required"));
        }
        self.shared
            .tables
            .values()
            .find(|t| t.table().schema == schema && t.table().table == table)
            .cloned()
            .ok_or_else(|| {
                Status::not_found(format!(
                    "no memory table {schema}.{table} (memory tables: {})",
                    self.shared
                        .tables
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }
}

/// The gRPC API's routes: gRPC and gRPC-Web requests (by content type) to tonic, the others
/// to the Connect protocol.
pub fn router(api: Api) -> Router {
    let web = tonic_web::GrpcWebLayer::new();
    let grpc = tonic::service::Routes::new(tower::Layer::layer(
        &web,
        LaredoQueryServiceServer::new(api.clone()),
    ))
    .add_service(tower::Layer::layer(
        &web,
        LaredoOamServiceServer::new(api.clone()),
    ))
    .prepare()
    .into_axum_router();
    let connect = connect::router(api);
    Router::new().fallback_service(tower::service_fn(move |req: Request| {
        let grpc_request = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        let mut app = if grpc_request {
            grpc.clone()
        } else {
            connect.clone()
        };
        async move { tower_service::Service::call(&mut app, req).await }
    }))
}
