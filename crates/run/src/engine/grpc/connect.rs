//! The Connect protocol (what laredo's CLI and Go client speak, over HTTP/1.1 or HTTP/2):
//! unary calls `POST /laredo.v1.<Service>/<Rpc>` with a proto or JSON body, errors as
//! `{"code", "message"}` with the protocol's HTTP status; server streams as enveloped
//! messages closed by an end-of-stream envelope. Each call runs the tonic service's method.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use futures::stream::BoxStream;
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;

use larch_laredo_api::connect::{
    self as wire, FLAG_COMPRESSED, FLAG_END_STREAM, STREAM_JSON, STREAM_PROTO, UNARY_JSON,
    UNARY_PROTO,
};
use larch_laredo_api::v1::laredo_oam_service_server::LaredoOamService as O;
use larch_laredo_api::v1::laredo_query_service_server::LaredoQueryService as Q;

use super::{Api, oam};

const QUERY: &str = "laredo.v1.LaredoQueryService";
const OAM: &str = "laredo.v1.LaredoOAMService";

pub fn router(api: Api) -> Router {
    Router::new()
        .route("/{service}/{method}", post(handle))
        .with_state(api)
}

#[derive(Clone, Copy, Debug)]
enum Codec {
    Proto,
    Json,
}

impl Codec {
    fn decode<M: Message + Default + DeserializeOwned>(self, body: &[u8]) -> Result<M, Status> {
        let bad = |e: String| Status::invalid_argument(format!("unreadable request: {e}"));
        match self {
            Codec::Proto => M::decode(body).map_err(|e| bad(e.to_string())),
            Codec::Json if body.is_empty() => Ok(M::default()),
            Codec::Json => serde_json::from_slice(body).map_err(|e| bad(e.to_string())),
        }
    }

    fn encode<M: Message + Serialize>(self, m: &M) -> Vec<u8> {
        match self {
            Codec::Proto => m.encode_to_vec(),
            Codec::Json => serde_json::to_vec(m).expect("a message always serializes"),
        }
    }
}

/// The request's metadata (its bearer token) on a tonic request.
fn tonic_request<M>(message: M, headers: &HeaderMap) -> tonic::Request<M> {
    let mut r = tonic::Request::new(message);
    *r.metadata_mut() = tonic::metadata::MetadataMap::from_headers(headers.clone());
    r
}

async fn handle(
    State(api): State<Api>,
    Path((service, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let (codec, streaming) = match content_type.as_str() {
        UNARY_PROTO => (Codec::Proto, false),
        UNARY_JSON => (Codec::Json, false),
        STREAM_PROTO => (Codec::Proto, true),
        STREAM_JSON => (Codec::Json, true),
        other => {
            let message = format!(
                "content type {other:?} is not served: {UNARY_PROTO} or {UNARY_JSON} (unary), {STREAM_PROTO} or {STREAM_JSON} (streams), application/grpc or application/grpc-web"
            );
            return (StatusCode::UNSUPPORTED_MEDIA_TYPE, message).into_response();
        }
    };
    if streaming {
        return stream(&api, &service, &method, codec, &headers, &body).await;
    }
    match unary(&api, &service, &method, codec, &headers, &body).await {
        Ok(bytes) => ([(header::CONTENT_TYPE, content_type)], bytes).into_response(),
        Err(status) => unary_error(&status),
    }
}

fn unary_error(status: &Status) -> Response {
    let code = StatusCode::from_u16(wire::http_status(status.code()))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = wire::error_json(status.code(), status.message()).to_string();
    (code, [(header::CONTENT_TYPE, UNARY_JSON)], body).into_response()
}

/// Decodes the request, runs the service method, encodes its answer.
macro_rules! call {
    ($method:path, $api:expr, $codec:expr, $headers:expr, $body:expr) => {{
        let request = tonic_request($codec.decode($body)?, $headers);
        let reply = $method($api, request).await?;
        Ok($codec.encode(reply.get_ref()))
    }};
}

async fn unary(
    api: &Api,
    service: &str,
    method: &str,
    codec: Codec,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<u8>, Status> {
    match (service, method) {
        (QUERY, "Lookup") => call!(Q::lookup, api, codec, headers, body),
        (QUERY, "LookupAll") => call!(Q::lookup_all, api, codec, headers, body),
        (QUERY, "GetRow") => call!(Q::get_row, api, codec, headers, body),
        (QUERY, "ListRows") => call!(Q::list_rows, api, codec, headers, body),
        (QUERY, "CountRows") => call!(Q::count_rows, api, codec, headers, body),
        (OAM, "GetStatus") => call!(O::get_status, api, codec, headers, body),
        (OAM, "GetTableStatus") => call!(O::get_table_status, api, codec, headers, body),
        (OAM, "GetPipelineStatus") => call!(O::get_pipeline_status, api, codec, headers, body),
        (OAM, "CheckReady") => call!(O::check_ready, api, codec, headers, body),
        (OAM, "GetSourceInfo") => call!(O::get_source_info, api, codec, headers, body),
        (OAM, "PauseSync") => call!(O::pause_sync, api, codec, headers, body),
        (OAM, "ResumeSync") => call!(O::resume_sync, api, codec, headers, body),
        (OAM, "ReloadTable") => call!(O::reload_table, api, codec, headers, body),
        (OAM, "ReloadAll") => call!(O::reload_all, api, codec, headers, body),
        (OAM, "ListTables") => call!(O::list_tables, api, codec, headers, body),
        (OAM, "GetTableSchema") => call!(O::get_table_schema, api, codec, headers, body),
        (OAM, m) if oam::unimplemented_reason(m).is_some() => Err(oam::unimplemented(m)),
        (QUERY, "Subscribe") | (OAM, "WatchStatus") => Err(Status::invalid_argument(format!(
            "{service}/{method} is a server stream: send it as {STREAM_PROTO} or {STREAM_JSON}"
        ))),
        _ => Err(Status::unimplemented(format!(
            "no method {service}/{method} (services: {QUERY}, {OAM})"
        ))),
    }
}

/// A stream's messages, encoded.
type Frames = BoxStream<'static, Result<Vec<u8>, Status>>;

async fn open_stream(
    api: &Api,
    service: &str,
    method: &str,
    codec: Codec,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Frames, Status> {
    let message = match wire::split_envelope(body) {
        Some((flags, _, _)) if flags & FLAG_COMPRESSED != 0 => {
            return Err(Status::unimplemented(
                "compressed stream messages are not accepted: send them uncompressed",
            ));
        }
        Some((_, message, _)) => message,
        None => {
            return Err(Status::invalid_argument(
                "the request is not one enveloped message",
            ));
        }
    };
    match (service, method) {
        (QUERY, "Subscribe") => {
            let request = tonic_request(codec.decode(message)?, headers);
            let stream = Q::subscribe(api, request).await?.into_inner();
            Ok(stream.map(move |m| m.map(|m| codec.encode(&m))).boxed())
        }
        (OAM, "WatchStatus") => {
            let request = tonic_request(codec.decode(message)?, headers);
            let stream = O::watch_status(api, request).await?.into_inner();
            Ok(stream.map(move |m| m.map(|m| codec.encode(&m))).boxed())
        }
        _ => Err(Status::unimplemented(format!(
            "no server stream {service}/{method} (streams: {QUERY}/Subscribe, {OAM}/WatchStatus)"
        ))),
    }
}

/// A server stream: HTTP 200, each message enveloped, then the end-of-stream message (with
/// the error, if the call failed or the stream ended with one).
async fn stream(
    api: &Api,
    service: &str,
    method: &str,
    codec: Codec,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let content_type = match codec {
        Codec::Proto => STREAM_PROTO,
        Codec::Json => STREAM_JSON,
    };
    let frames = match open_stream(api, service, method, codec, headers, body).await {
        Ok(frames) => frames,
        Err(e) => futures::stream::iter([Err(e)]).boxed(),
    };
    let body = futures::stream::unfold(Some(frames), |state| async move {
        let mut frames = state?;
        let bytes = match frames.next().await {
            Some(Ok(m)) => return Some((Ok(Bytes::from(wire::envelope(0, &m))), Some(frames))),
            Some(Err(e)) => end_of_stream(Some(&e)),
            None => end_of_stream(None),
        };
        Some((Ok::<_, std::convert::Infallible>(bytes), None))
    });
    (
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(body),
    )
        .into_response()
}

fn end_of_stream(error: Option<&Status>) -> Bytes {
    let json = match error {
        Some(e) => serde_json::json!({"error": wire::error_json(e.code(), e.message())}),
        None => serde_json::json!({}),
    };
    Bytes::from(wire::envelope(FLAG_END_STREAM, json.to_string().as_bytes()))
}
