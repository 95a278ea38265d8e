//! laredo's gRPC API on the engine (issue 40): every served RPC through the Connect protocol
//! over HTTP/1.1 (proto and JSON bodies, enveloped streams), through gRPC with tonic clients
//! generated from the same contract (h2c), and gRPC-Web; the HTTP API's token rules; the
//! RPCs larch has no counterpart for answer UNIMPLEMENTED naming the larch way.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use prost::Message;

use larch::archive::model::Action;
use larch::archive::store::Store;
use larch::archive::store::local::LocalStore;
use larch::engine::access::{ApiAccess, Token};
use larch::engine::config::GrpcConfig;
use larch::engine::{RunningEngine, Serving};
use larch_laredo_api::pbjson_types::{Struct, Value, value::Kind};
use larch_laredo_api::v1 as pb;
use larch_laredo_api::v1::laredo_oam_service_client::LaredoOamServiceClient;
use larch_laredo_api::v1::laredo_query_service_client::LaredoQueryServiceClient;

use crate::archive_build::{TestArchive, id_and_text_columns, refs, rows};
use crate::engine_support::{start_engine_serving, wait_ready};

const TOKEN: &str = "grpc-token-0c6f2d9e8a7b4135";
const QUERY: &str = "laredo.v1.LaredoQueryService";
const OAM: &str = "laredo.v1.LaredoOAMService";

fn yaml(root: &std::path::Path) -> String {
    format!(
        r#"
sources:
  seed:
    type: archive
    store: {{type: local, path: "{}"}}
    key_prefix: public.t/
    follow: true
    poll_interval: 100ms
tables:
  - source: seed
    schema: public
    table: t
    targets:
      - type: memory
        index_fields: [v]
"#,
        root.display()
    )
}

fn serving(control: bool, protect: bool) -> Serving {
    Serving {
        listen: "127.0.0.1:0".into(),
        access: ApiAccess {
            control,
            protect_reads: protect,
            protect_status: protect,
            token: Some(Token::new(TOKEN, "test").unwrap()),
        },
        tls: None,
        grpc: Some(GrpcConfig {
            listen: "127.0.0.1:0".into(),
            tls: None,
        }),
    }
}

/// An engine over a three-row archive (`{"id":i,"v":"s-i"}`), following it; its archive.
async fn engine(control: bool, protect: bool) -> (RunningEngine, TestArchive, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t")
        .with_columns(id_and_text_columns(&["id", "v"]));
    a.snapshot("0/1", &refs(&rows(1..=3, "s"))).await;
    let engine = start_engine_serving(&yaml(dir.path()), &serving(control, protect)).await;
    wait_ready(engine.addr).await;
    (engine, a, dir)
}

/// One HTTP/1.1 request; the answer's status, content type and body.
async fn post(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> (u16, String, Vec<u8>) {
    let response = send(addr, path, content_type, body, headers).await;
    let status = response.status().as_u16();
    let ct = content_type_of(&response);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, ct, body.to_vec())
}

fn content_type_of<B>(r: &http::Response<B>) -> String {
    r.headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

async fn send(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> http::Response<hyper::body::Incoming> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::post(path)
        .header("host", addr.to_string())
        .header("content-type", content_type);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    sender
        .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap()
}

/// A Connect unary call with a proto body: the decoded answer, or (HTTP status, error JSON).
async fn unary<Req: Message, Resp: Message + Default>(
    addr: SocketAddr,
    service: &str,
    method: &str,
    req: &Req,
    headers: &[(&str, &str)],
) -> Result<Resp, (u16, serde_json::Value)> {
    let path = format!("/{service}/{method}");
    let (status, ct, body) = post(
        addr,
        &path,
        "application/proto",
        req.encode_to_vec(),
        headers,
    )
    .await;
    if status == 200 {
        assert_eq!(ct, "application/proto", "{path}");
        Ok(Resp::decode(&body[..]).unwrap())
    } else {
        assert_eq!(ct, "application/json", "{path}: errors are JSON");
        Err((status, serde_json::from_slice(&body).unwrap()))
    }
}

/// A Connect unary call with a JSON body: (HTTP status, JSON answer).
async fn unary_json(
    addr: SocketAddr,
    service: &str,
    method: &str,
    req: serde_json::Value,
) -> (u16, serde_json::Value) {
    let path = format!("/{service}/{method}");
    let body = serde_json::to_vec(&req).unwrap();
    let (status, ct, body) = post(addr, &path, "application/json", body, &[]).await;
    assert_eq!(ct, "application/json", "{path}");
    (status, serde_json::from_slice(&body).unwrap())
}

fn table(schema: &str, t: &str) -> (String, String) {
    (schema.to_string(), t.to_string())
}

fn field<'a>(row: &'a Struct, name: &str) -> &'a Kind {
    row.fields[name].kind.as_ref().unwrap()
}

fn text(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

fn grpc_addr(e: &RunningEngine) -> SocketAddr {
    e.grpc_addr.expect("the gRPC API is served")
}

#[tokio::test]
async fn connect_unary_get_count_and_pages_in_proto() {
    let (engine, _archive, _dir) = engine(false, false).await;
    let addr = grpc_addr(&engine);
    let (schema, t) = table("public", "t");
    let count: pb::CountRowsResponse = unary(
        addr,
        QUERY,
        "CountRows",
        &pb::CountRowsRequest {
            schema: schema.clone(),
            table: t.clone(),
        },
        &[],
    )
    .await
    .unwrap();
    assert_eq!(count.count, 3);

    let row: pb::GetRowResponse = unary(
        addr,
        QUERY,
        "GetRow",
        &pb::GetRowRequest {
            schema: schema.clone(),
            table: t.clone(),
            primary_key: 2,
        },
        &[],
    )
    .await
    .unwrap();
    assert!(row.found);
    let r = row.row.unwrap();
    assert_eq!(field(&r, "v"), &Kind::StringValue("s-2".into()));
    assert_eq!(field(&r, "id"), &Kind::NumberValue(2.0));
    let missing: pb::GetRowResponse = unary(
        addr,
        QUERY,
        "GetRow",
        &pb::GetRowRequest {
            schema: schema.clone(),
            table: t.clone(),
            primary_key: 9,
        },
        &[],
    )
    .await
    .unwrap();
    assert!(!missing.found && missing.row.is_none());

    // Pages of two: a token, then the last row and none.
    let list = |token: String| pb::ListRowsRequest {
        schema: schema.clone(),
        table: t.clone(),
        page_size: 2,
        page_token: token,
    };
    let first: pb::ListRowsResponse = unary(addr, QUERY, "ListRows", &list(String::new()), &[])
        .await
        .unwrap();
    assert_eq!((first.rows.len(), first.total_count), (2, 3));
    assert!(!first.next_page_token.is_empty());
    let second: pb::ListRowsResponse =
        unary(addr, QUERY, "ListRows", &list(first.next_page_token), &[])
            .await
            .unwrap();
    assert_eq!(second.rows.len(), 1);
    assert_eq!(field(&second.rows[0], "id"), &Kind::NumberValue(3.0));
    assert!(second.next_page_token.is_empty());

    engine.stop().await.unwrap();
}

#[tokio::test]
async fn connect_lookups_and_errors() {
    let (engine, _archive, _dir) = engine(false, false).await;
    let addr = grpc_addr(&engine);
    let (schema, t) = table("public", "t");
    // Lookups through the index field (laredo's lookup fields), by name or by default.
    for index_name in ["v", ""] {
        let found: pb::LookupResponse = unary(
            addr,
            QUERY,
            "Lookup",
            &pb::LookupRequest {
                schema: schema.clone(),
                table: t.clone(),
                index_name: index_name.into(),
                key_values: vec![text("s-3")],
            },
            &[],
        )
        .await
        .unwrap();
        assert!(found.found, "{index_name:?}");
        assert_eq!(field(&found.row.unwrap(), "id"), &Kind::NumberValue(3.0));
    }
    let all: pb::LookupAllResponse = unary(
        addr,
        QUERY,
        "LookupAll",
        &pb::LookupAllRequest {
            schema: schema.clone(),
            table: t.clone(),
            index_name: "v".into(),
            key_values: vec![text("s-1")],
        },
        &[],
    )
    .await
    .unwrap();
    assert_eq!(all.rows.len(), 1);
    let bad = unary::<_, pb::LookupAllResponse>(
        addr,
        QUERY,
        "LookupAll",
        &pb::LookupAllRequest {
            schema: schema.clone(),
            table: t.clone(),
            index_name: "id_nope".into(),
            key_values: vec![text("1")],
        },
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(bad.0, 400);
    assert_eq!(bad.1["code"], "invalid_argument", "{}", bad.1);
    assert!(bad.1["message"].as_str().unwrap().contains("not indexed"));

    // Errors: Connect's codes and HTTP statuses.
    let (status, e) = unary::<_, pb::CountRowsResponse>(
        addr,
        QUERY,
        "CountRows",
        &pb::CountRowsRequest {
            schema: "public".into(),
            table: "nope".into(),
        },
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(
        (status, e["code"].as_str()),
        (404, Some("not_found")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap().contains("public.t"), "{e}");

    engine.stop().await.unwrap();
}

#[tokio::test]
async fn connect_json_bodies_use_proto3_json() {
    let (engine, _archive, _dir) = engine(false, false).await;
    let addr = grpc_addr(&engine);
    // JSON bodies, proto3's JSON mapping (int64 as strings, camelCase names accepted).
    let (status, j) = unary_json(
        addr,
        QUERY,
        "CountRows",
        serde_json::json!({"schema": "public", "table": "t"}),
    )
    .await;
    assert_eq!((status, &j), (200, &serde_json::json!({"count": "3"})));
    // A field a newer client knows and this contract does not is skipped, as Connect does.
    let (status, j) = unary_json(
        addr,
        QUERY,
        "CountRows",
        serde_json::json!({"schema": "public", "table": "t", "consistency": "strong"}),
    )
    .await;
    assert_eq!((status, &j), (200, &serde_json::json!({"count": "3"})));
    let (status, j) = unary_json(
        addr,
        QUERY,
        "GetRow",
        serde_json::json!({"schema": "public", "table": "t", "primaryKey": "1"}),
    )
    .await;
    assert_eq!(status, 200, "{j}");
    assert_eq!(
        j,
        serde_json::json!({"found": true, "row": {"id": 1.0, "v": "s-1"}})
    );
    let (status, j) = unary_json(addr, QUERY, "ListRows", serde_json::json!({})).await;
    assert_eq!(
        (status, j["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn connect_status_rpcs() {
    let (engine, _archive, _dir) = engine(false, false).await;
    let addr = grpc_addr(&engine);
    let (status, j) = unary_json(addr, OAM, "GetStatus", serde_json::json!({})).await;
    assert_eq!(status, 200, "{j}");
    assert_eq!(j["state"], "SERVICE_STATE_STREAMING", "{j}");
    assert_eq!(j["sources"][0]["sourceId"], "seed", "{j}");
    assert_eq!(j["sources"][0]["currentPosition"], "0/1", "{j}");
    let p = &j["pipelines"][0];
    assert_eq!(p["pipelineId"], "seed:public.t:memory", "{j}");
    assert_eq!(p["state"], "PIPELINE_STATE_STREAMING", "{j}");
    assert_eq!(p["rowCount"], "3", "{j}");

    let ready: pb::CheckReadyResponse = unary(
        addr,
        OAM,
        "CheckReady",
        &pb::CheckReadyRequest::default(),
        &[],
    )
    .await
    .unwrap();
    assert!(ready.ready && ready.not_ready_reasons.is_empty());
    let by_source: pb::CheckReadyResponse = unary(
        addr,
        OAM,
        "CheckReady",
        &pb::CheckReadyRequest {
            source: "seed".into(),
            ..Default::default()
        },
        &[],
    )
    .await
    .unwrap();
    assert!(by_source.ready);

    let t: pb::GetTableStatusResponse = unary(
        addr,
        OAM,
        "GetTableStatus",
        &pb::GetTableStatusRequest {
            schema: "public".into(),
            table: "t".into(),
        },
        &[],
    )
    .await
    .unwrap();
    assert_eq!(t.pipelines.len(), 1);
    let v_index = t.indexes.iter().find(|i| i.name == "v").unwrap();
    assert_eq!(
        (v_index.fields.clone(), v_index.entry_count),
        (vec!["v".to_string()], 3)
    );

    let p: pb::GetPipelineStatusResponse = unary(
        addr,
        OAM,
        "GetPipelineStatus",
        &pb::GetPipelineStatusRequest {
            pipeline_id: "seed:public.t:memory".into(),
        },
        &[],
    )
    .await
    .unwrap();
    let s = p.status.unwrap();
    assert_eq!((s.row_count, s.target_type.as_str()), (3, "memory"));
    assert_eq!(s.state, pb::PipelineState::Streaming as i32);

    engine.stop().await.unwrap();
}

#[tokio::test]
async fn connect_source_table_and_schema_rpcs() {
    let (engine, _archive, _dir) = engine(false, false).await;
    let addr = grpc_addr(&engine);
    let sources: pb::GetSourceInfoResponse = unary(
        addr,
        OAM,
        "GetSourceInfo",
        &pb::GetSourceInfoRequest::default(),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(sources.sources[0].source_type, "archive");
    let tables: pb::ListTablesResponse = unary(
        addr,
        OAM,
        "ListTables",
        &pb::ListTablesRequest::default(),
        &[],
    )
    .await
    .unwrap();
    let tc = &tables.tables[0];
    assert_eq!(
        (
            tc.schema.as_str(),
            tc.table.as_str(),
            tc.primary_key.as_str()
        ),
        ("public", "t", "id")
    );
    let schema: pb::GetTableSchemaResponse = unary(
        addr,
        OAM,
        "GetTableSchema",
        &pb::GetTableSchemaRequest {
            schema: "public".into(),
            table: "t".into(),
        },
        &[],
    )
    .await
    .unwrap();
    let names: Vec<_> = schema
        .columns
        .iter()
        .map(|c| c.column_name.as_str())
        .collect();
    assert_eq!(names, ["id", "v"]);
    assert!(schema.columns[0].is_primary_key && schema.columns[0].not_null);

    engine.stop().await.unwrap();
}

#[tokio::test]
async fn connect_refuses_what_larch_has_no_counterpart_for() {
    let (engine, _archive, _dir) = engine(false, false).await;
    let addr = grpc_addr(&engine);
    // What larch has no counterpart for: UNIMPLEMENTED, naming the larch way.
    for (method, hint) in [
        ("ListDeadLetters", "dead letters"),
        ("CreateSnapshot", "larch export"),
        ("StartReplay", "at"),
        ("ResetSource", "larch export cleanup"),
    ] {
        let (status, j) = unary_json(addr, OAM, method, serde_json::json!({})).await;
        assert_eq!(
            (status, j["code"].as_str()),
            (501, Some("unimplemented")),
            "{method}"
        );
        assert!(
            j["message"].as_str().unwrap().contains(hint),
            "{method}: {j}"
        );
    }
    // Pause is control: off unless enabled.
    let (status, j) = unary_json(
        addr,
        OAM,
        "PauseSync",
        serde_json::json!({"sourceId": "seed"}),
    )
    .await;
    assert_eq!(
        (status, j["code"].as_str()),
        (403, Some("permission_denied")),
        "{j}"
    );
    engine.stop().await.unwrap();
}

async fn grpc_channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn with_token<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

/// The next message of a stream, within 20 s.
async fn next<T>(s: &mut tonic::Streaming<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), s.message())
        .await
        .expect("a stream message within 20 s")
        .unwrap()
        .expect("the stream goes on")
}

#[tokio::test]
async fn grpc_clients_from_the_contract_query_under_the_token_rules() {
    let (engine, _archive, _dir) = engine(true, true).await;
    let channel = grpc_channel(grpc_addr(&engine)).await;
    let mut query = LaredoQueryServiceClient::new(channel.clone());
    let mut oam = LaredoOamServiceClient::new(channel);
    let count = pb::CountRowsRequest {
        schema: "public".into(),
        table: "t".into(),
    };
    // The token rules of the HTTP API: reads and status protected here, readiness open.
    let refused = query.count_rows(count.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let refused = oam.get_status(pb::GetStatusRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(
        oam.check_ready(pb::CheckReadyRequest::default())
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let n = query
        .count_rows(with_token(count))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(n.count, 3);
    let row = query
        .get_row(with_token(pb::GetRowRequest {
            schema: "public".into(),
            table: "t".into(),
            primary_key: 1,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        field(&row.row.unwrap(), "v"),
        &Kind::StringValue("s-1".into())
    );
    let status = oam
        .get_status(with_token(pb::GetStatusRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.state, pb::ServiceState::Streaming as i32);
    let unimplemented = oam
        .list_snapshots(with_token(pb::ListSnapshotsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(unimplemented.code(), tonic::Code::Unimplemented);

    engine.stop().await.unwrap();
}

#[tokio::test]
async fn grpc_streams_subscribe_and_watch() {
    let (engine, mut archive, _dir) = engine(true, true).await;
    let channel = grpc_channel(grpc_addr(&engine)).await;
    let mut query = LaredoQueryServiceClient::new(channel.clone());
    let mut oam = LaredoOamServiceClient::new(channel);
    // Subscribe: the rows first, then each change the engine applies.
    let mut changes = query
        .subscribe(with_token(pb::SubscribeRequest {
            schema: "public".into(),
            table: "t".into(),
            replay_existing: true,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut watch = oam
        .watch_status(with_token(pb::WatchStatusRequest::default()))
        .await
        .unwrap()
        .into_inner();
    for id in 1..=3 {
        let m = next(&mut changes).await;
        assert_eq!(m.action, "INSERT");
        assert_eq!(
            field(&m.new_values.unwrap(), "id"),
            &Kind::NumberValue(id as f64)
        );
    }
    archive
        .diff(
            "0/1",
            "0/2",
            &[(Action::Update, None, Some(r#"{"id":2,"v":"s-2b"}"#))],
        )
        .await;
    let m = next(&mut changes).await;
    assert_eq!((m.action.as_str(), m.position.as_str()), ("UPDATE", "0/2"));
    assert_eq!(
        field(&m.new_values.unwrap(), "v"),
        &Kind::StringValue("s-2b".into())
    );
    let w = next(&mut watch).await;
    let Some(pb::watch_status_response::Event::RowChange(rc)) = w.event else {
        panic!("{w:?}");
    };
    assert_eq!((rc.action.as_str(), rc.table.as_str()), ("UPDATE", "t"));

    // Pause and resume (control, behind the token) show in WatchStatus.
    let refused = oam
        .pause_sync(pb::PauseSyncRequest {
            source_id: "seed".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let paused = oam
        .pause_sync(with_token(pb::PauseSyncRequest {
            source_id: "seed".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(paused.state, pb::ServiceState::Paused as i32);
    let pipeline_paused = loop {
        if let Some(pb::watch_status_response::Event::PipelineStateChange(p)) =
            next(&mut watch).await.event
        {
            break p.new_state;
        }
    };
    assert_eq!(pipeline_paused, pb::PipelineState::Paused as i32);
    oam.resume_sync(with_token(pb::ResumeSyncRequest {
        source_id: "seed".into(),
    }))
    .await
    .unwrap();
    // The engine's stop ends the streams.
    engine.stop().await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), changes.message()).await;
    assert!(matches!(end, Ok(Ok(None)) | Ok(Err(_))), "{end:?}");
}

/// Reads a Connect stream's envelopes until the end-of-stream one: (messages, end JSON).
async fn read_stream(
    body: &mut hyper::body::Incoming,
    want: usize,
) -> (Vec<Vec<u8>>, Option<serde_json::Value>) {
    let mut buf = Vec::new();
    let mut messages = Vec::new();
    loop {
        while let Some((flags, m, rest)) = larch_laredo_api::connect::split_envelope(&buf) {
            let (m, rest) = (m.to_vec(), rest.to_vec());
            buf = rest;
            if flags & 0x02 != 0 {
                return (messages, Some(serde_json::from_slice(&m).unwrap()));
            }
            messages.push(m);
            if messages.len() == want {
                return (messages, None);
            }
        }
        let frame = tokio::time::timeout(Duration::from_secs(20), body.frame())
            .await
            .expect("stream data within 20 s");
        match frame {
            Some(f) => {
                if let Ok(data) = f.unwrap().into_data() {
                    buf.extend_from_slice(&data);
                }
            }
            None => return (messages, None),
        }
    }
}

fn enveloped(m: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(m.len() as u32).to_be_bytes());
    out.extend_from_slice(m);
    out
}

#[tokio::test]
async fn connect_streams_over_http1() {
    let (engine, mut archive, _dir) = engine(false, false).await;
    let addr = grpc_addr(&engine);
    let req = pb::SubscribeRequest {
        schema: "public".into(),
        table: "t".into(),
        replay_existing: true,
    };
    let path = format!("/{QUERY}/Subscribe");
    let response = send(
        addr,
        &path,
        "application/connect+proto",
        enveloped(&req.encode_to_vec()),
        &[],
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(content_type_of(&response), "application/connect+proto");
    let mut body = response.into_body();
    let (rows, end) = read_stream(&mut body, 3).await;
    assert_eq!((rows.len(), end), (3, None));
    let first = pb::SubscribeResponse::decode(&rows[0][..]).unwrap();
    assert_eq!(first.action, "INSERT");
    archive
        .diff(
            "0/1",
            "0/2",
            &[(Action::Delete, Some(r#"{"id":3,"v":"s-3"}"#), None)],
        )
        .await;
    let (change, _) = read_stream(&mut body, 1).await;
    let change = pb::SubscribeResponse::decode(&change[0][..]).unwrap();
    assert_eq!(
        (change.action.as_str(), change.position.as_str()),
        ("DELETE", "0/2")
    );
    assert_eq!(
        field(&change.old_values.unwrap(), "id"),
        &Kind::NumberValue(3.0)
    );

    // JSON streams, and a failed call: HTTP 200, the error in the end-of-stream message.
    let json = br#"{"schema":"public","table":"nope"}"#;
    let response = send(
        addr,
        &path,
        "application/connect+json",
        enveloped(json),
        &[],
    )
    .await;
    assert_eq!(response.status(), 200);
    let (messages, end) = read_stream(&mut response.into_body(), usize::MAX).await;
    assert!(messages.is_empty());
    assert_eq!(end.unwrap()["error"]["code"], "not_found");
    let watch = send(
        addr,
        &format!("/{OAM}/WatchStatus"),
        "application/connect+json",
        enveloped(b"{}"),
        &[],
    )
    .await;
    assert_eq!(watch.status(), 200);
    let mut watch = watch.into_body();
    archive
        .diff(
            "0/2",
            "0/3",
            &[(Action::Insert, None, Some(r#"{"id":7,"v":"s-7"}"#))],
        )
        .await;
    let (events, _) = read_stream(&mut watch, 1).await;
    let event: serde_json::Value = serde_json::from_slice(&events[0]).unwrap();
    assert_eq!(event["rowChange"]["action"], "INSERT", "{event}");
    assert_eq!(event["rowChange"]["position"], "0/3", "{event}");
    // The engine's stop closes the streams with a clean end.
    engine.stop().await.unwrap();
    let (_, end) = read_stream(&mut body, usize::MAX).await;
    assert_eq!(end, Some(serde_json::json!({})));
}

#[tokio::test]
async fn connect_and_grpc_web_follow_the_token_rules() {
    let (engine, _archive, _dir) = engine(true, true).await;
    let addr = grpc_addr(&engine);
    let count = pb::CountRowsRequest {
        schema: "public".into(),
        table: "t".into(),
    };
    let bearer = format!("Bearer {TOKEN}");
    let refused = unary::<_, pb::CountRowsResponse>(addr, QUERY, "CountRows", &count, &[])
        .await
        .unwrap_err();
    assert_eq!(
        (refused.0, refused.1["code"].as_str()),
        (401, Some("unauthenticated"))
    );
    let wrong = unary::<_, pb::CountRowsResponse>(
        addr,
        QUERY,
        "CountRows",
        &count,
        &[("authorization", "Bearer grpc-token-0c6f2d9e8a7b413")],
    )
    .await
    .unwrap_err();
    assert_eq!(wrong.0, 401);
    let n: pb::CountRowsResponse = unary(
        addr,
        QUERY,
        "CountRows",
        &count,
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(n.count, 3);
    let (status, _) = unary_json(addr, OAM, "GetStatus", serde_json::json!({})).await;
    assert_eq!(status, 401);
    let (status, j) = unary_json(addr, OAM, "CheckReady", serde_json::json!({})).await;
    assert_eq!((status, &j["ready"]), (200, &serde_json::json!(true)));
    let paused: pb::PauseSyncResponse = unary(
        addr,
        OAM,
        "PauseSync",
        &pb::PauseSyncRequest {
            source_id: "seed".into(),
        },
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(paused.state, pb::ServiceState::Paused as i32);
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let with = [
        "--addr",
        &addr.to_string(),
        "--token-file",
        token_file.to_str().unwrap(),
    ]
    .map(String::from);
    let with: Vec<&str> = with.iter().map(String::as_str).collect();
    let (code, out, err) = cli(&[&["resume", "--source", "seed"][..], &with].concat()).await;
    assert_eq!((code, out.as_str()), (0, "resumed\n"), "{err}");
    let (code, out, err) = cli(&[&["pause", "--source", "seed"][..], &with].concat()).await;
    assert_eq!((code, out.as_str()), (0, "paused\n"), "{err}");
    let http_status = crate::engine_support::request_with(
        engine.addr,
        "GET",
        "/status",
        &[&format!("Authorization: {bearer}")],
    )
    .await;
    assert!(
        http_status.1.contains(r#""state":"PAUSED""#),
        "{}",
        http_status.1
    );

    // gRPC-Web over HTTP/1.1: a data frame, then a trailers frame with grpc-status (an
    // error alone: grpc-status in the headers).
    let path = "/laredo.v1.LaredoQueryService/CountRows";
    let web = enveloped(&count.encode_to_vec());
    let refused = send(addr, path, "application/grpc-web+proto", web.clone(), &[]).await;
    assert_eq!(refused.status(), 200);
    assert!(content_type_of(&refused).starts_with("application/grpc-web"));
    assert_eq!(refused.headers()["grpc-status"], "16", "{refused:?}");
    let (status, ct, body) = post(
        addr,
        path,
        "application/grpc-web+proto",
        web,
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 200);
    assert!(ct.starts_with("application/grpc-web"), "{ct}");
    let (flags, m, rest) = larch_laredo_api::connect::split_envelope(&body).unwrap();
    assert_eq!(flags, 0);
    assert_eq!(pb::CountRowsResponse::decode(m).unwrap().count, 3);
    let (trailer_flags, trailers, _) = larch_laredo_api::connect::split_envelope(rest).unwrap();
    assert_eq!(trailer_flags, 0x80);
    assert!(String::from_utf8_lossy(trailers).contains("grpc-status:0"));
    engine.stop().await.unwrap();
}

/// ReloadTable (the CLI's `reload`) and ReloadAll load the archive again: a re-baseline the
/// status counts, every row served again; a table the source does not serve is not found.
#[tokio::test]
async fn reload_loads_the_archive_again() {
    let (engine, _archive, _dir) = engine(true, true).await;
    let addr = grpc_addr(&engine);
    let bearer = format!("Bearer {TOKEN}");
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let with = [
        "--addr".to_string(),
        addr.to_string(),
        "--token-file".to_string(),
        token_file.to_str().unwrap().to_string(),
    ];
    let with: Vec<&str> = with.iter().map(String::as_str).collect();
    let rebaselines = || async {
        let (_, body) = crate::engine_support::request_with(
            engine.addr,
            "GET",
            "/status",
            &[&format!("Authorization: {bearer}")],
        )
        .await;
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        j["sources"]["seed"]["rebaselines"].as_u64().unwrap()
    };
    assert_eq!(rebaselines().await, 0);
    let (code, out, err) =
        cli(&[&["reload", "--source", "seed", "public.t"][..], &with].concat()).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("public.t: reloading"), "{out}");
    crate::engine_support::eventually(30, "the reload's re-baseline", || async {
        (rebaselines().await == 1).then_some(())
    })
    .await;
    let all: pb::ReloadAllResponse = unary(
        addr,
        OAM,
        "ReloadAll",
        &pb::ReloadAllRequest {
            source_id: "seed".into(),
        },
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert!(all.accepted, "{all:?}");
    crate::engine_support::eventually(30, "the second re-baseline", || async {
        (rebaselines().await == 2).then_some(())
    })
    .await;
    wait_ready(engine.addr).await;
    let n: pb::CountRowsResponse = unary(
        addr,
        QUERY,
        "CountRows",
        &pb::CountRowsRequest {
            schema: "public".into(),
            table: "t".into(),
        },
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(n.count, 3, "every row served again");
    let (code, _, err) =
        cli(&[&["reload", "--source", "seed", "public.other"][..], &with].concat()).await;
    assert_eq!(code, 1);
    assert!(err.starts_with("error: not_found:"), "{err}");
    engine.stop().await.unwrap();
}

/// `larch engine <verb> --addr …`: (exit code, stdout, stderr); the process runs off the
/// runtime's threads so the in-process engine keeps serving.
async fn cli(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
            .arg("engine")
            .args(&args)
            .env_remove("LAREDO_ADDRESS")
            .env_remove("LARCH_ENGINE_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn the_client_cli_has_laredos_verbs_and_exit_codes() {
    let (engine, _archive, _dir) = engine(false, true).await;
    let addr = grpc_addr(&engine).to_string();
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let token = token_file.to_str().unwrap();
    let a = ["--addr", addr.as_str(), "--token-file", token];

    let (code, out, _) = cli(&["ready", "--addr", &addr]).await;
    assert_eq!((code, out.as_str()), (0, "ready\n"));
    let (code, out, err) = cli(&[&["query", "count", "public.t"][..], &a].concat()).await;
    assert_eq!((code, out.as_str()), (0, "3\n"), "{err}");
    let (code, out, _) = cli(&[&["query", "get", "--pk", "2", "public.t"][..], &a].concat()).await;
    assert_eq!(code, 0);
    let row: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(row["v"], "s-2", "{out}");
    let (code, _, err) = cli(&[&["query", "get", "--pk", "9", "public.t"][..], &a].concat()).await;
    assert_eq!((code, err.as_str()), (1, "not found\n"));
    let (code, out, _) =
        cli(&[&["query", "list", "--limit", "2", "public.t"][..], &a].concat()).await;
    assert_eq!(code, 0);
    assert!(out.starts_with("2 rows (total: 3)\n"), "{out}");
    let (code, out, _) = cli(&[
        &["query", "lookup", "--index", "v", "public.t", "s-3"][..],
        &a,
    ]
    .concat())
    .await;
    assert_eq!(code, 0);
    assert!(
        out.starts_with("1 rows\n") && out.contains(r#""id": 3.0"#),
        "{out}"
    );
    let (code, out, _) = cli(&[&["tables"][..], &a].concat()).await;
    assert_eq!(code, 0);
    assert!(out.contains("public.t") && out.contains("memory"), "{out}");
    let (code, out, _) = cli(&[&["status"][..], &a].concat()).await;
    assert_eq!(code, 0);
    assert!(
        out.starts_with("Service State: SERVICE_STATE_STREAMING"),
        "{out}"
    );
    assert!(
        out.contains("seed:public.t:memory") && out.contains("PIPELINE_STATE_STREAMING"),
        "{out}"
    );
    let (code, out, _) = cli(&[&["status", "-o", "json"][..], &a].concat()).await;
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["state"], "SERVICE_STATE_STREAMING");
    // Control is off on this engine: pause and reload are refused.
    for verb in [
        &["pause", "--source", "seed"][..],
        &["reload", "--source", "seed", "public.t"],
    ] {
        let (code, _, err) = cli(&[verb, &a].concat()).await;
        assert_eq!(code, 1);
        assert!(err.starts_with("error: permission_denied:"), "{err}");
    }
    // Errors exit 1 with the Connect code: no token, an unknown table, no engine.
    let (code, _, err) = cli(&["query", "count", "public.t", "--addr", &addr]).await;
    assert_eq!(code, 1);
    assert!(err.starts_with("error: unauthenticated:"), "{err}");
    let (code, _, err) = cli(&[&["query", "count", "public.nope"][..], &a].concat()).await;
    assert_eq!(code, 1);
    assert!(err.starts_with("error: not_found:"), "{err}");
    engine.stop().await.unwrap();
    let (code, _, err) = cli(&["ready", "--addr", &addr]).await;
    assert_eq!(code, 1);
    assert!(err.contains("cannot connect"), "{err}");

    // Not ready (a followed archive that does not exist yet): `ready` exits 1 with the reason.
    let empty = tempfile::tempdir().unwrap();
    let waiting = start_engine_serving(&yaml(empty.path()), &serving(false, false)).await;
    let addr = grpc_addr(&waiting).to_string();
    let (code, out, _) = cli(&["ready", "--addr", &format!("http://{addr}")]).await;
    assert_eq!(code, 1);
    assert_eq!(out, "not ready\n  - not all pipelines are ready\n");
    waiting.stop().await.unwrap();
}

/// laredo's config as written: its `grpc { port }` block serves the API (on every interface,
/// as laredo-server's `:port`), which the client verbs reach.
#[tokio::test]
async fn a_laredo_config_with_its_grpc_block_serves_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=4, "s"))).await;
    // A port free a moment ago (laredo's config names a fixed port).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("laredo.conf");
    std::fs::write(
        &config,
        format!(
            r#"
sources {{ seed {{ type = file, store = local, store_config {{ path = "{}" }}, key_prefix = "public.t/" }} }}
tables = [{{ source = seed, schema = public, table = t, targets = [{{ type = indexed-memory, lookup_fields = [v] }}] }}]
grpc {{ port = {port} }}
"#,
            dir.path().display()
        ),
    )
    .unwrap();
    let engine = crate::engine_support::CliEngine::spawn(&config).await;
    wait_ready(engine.addr).await;
    let addr = format!("127.0.0.1:{port}");
    let (code, out, err) = cli(&["query", "count", "public.t", "--addr", &addr]).await;
    assert_eq!((code, out.as_str()), (0, "4\n"), "{err}");
    let (code, out, _) = cli(&["query", "lookup", "public.t", "s-4", "--addr", &addr]).await;
    assert_eq!(code, 0);
    assert!(out.contains(r#""id": 4.0"#), "{out}");
    assert_eq!(engine.stop().await.code(), Some(0));
}

/// A TLS connection to `addr` as `localhost` offering `alpn`, trusting only `ca`.
async fn tls_to(
    addr: SocketAddr,
    ca: &std::path::Path,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

/// `grpc.tls`: gRPC over HTTP/2 (ALPN h2) and Connect over HTTP/1.1 on the TLS listener, with
/// the token; certificate trouble stops the engine before it serves.
#[tokio::test]
async fn the_grpc_listener_speaks_tls() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=2, "s"))).await;
    let certs = tempfile::tempdir().unwrap();
    crate::postgres_tls::make_certificates(certs.path());
    let ca = certs.path().join("ca.pem");
    let mut s = serving(false, true);
    s.grpc = Some(GrpcConfig {
        listen: "127.0.0.1:0".into(),
        tls: Some(larch::engine::tls::TlsFiles {
            cert: certs.path().join("server.crt"),
            key: certs.path().join("server.key"),
        }),
    });
    let engine = start_engine_serving(&yaml(dir.path()), &s).await;
    wait_ready(engine.addr).await;
    let addr = grpc_addr(&engine);

    // gRPC: a tonic client over the TLS connection (h2 by ALPN).
    let ca_for = ca.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let ca = ca_for.clone();
            async move {
                let tls = tls_to(addr, &ca, b"h2").await;
                assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    let mut query = LaredoQueryServiceClient::new(channel);
    let count = pb::CountRowsRequest {
        schema: "public".into(),
        table: "t".into(),
    };
    let refused = query.count_rows(count.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert_eq!(
        query
            .count_rows(with_token(count.clone()))
            .await
            .unwrap()
            .into_inner()
            .count,
        2
    );

    // Connect over HTTP/1.1 on the same TLS port.
    let tls = tls_to(addr, &ca, b"http/1.1").await;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post(format!("/{QUERY}/CountRows"))
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(Bytes::from(r#"{"schema":"public","table":"t"}"#)))
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], br#"{"count":"2"}"#);
    // The client verbs over TLS, trusting the test CA.
    let https = format!("https://localhost:{}", addr.port());
    let ca_file = ca.to_str().unwrap();
    let token_file = certs.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let with = [
        "--addr",
        &https,
        "--ca-file",
        ca_file,
        "--token-file",
        token_file.to_str().unwrap(),
    ];
    let (code, out, err) = cli(&[&["query", "count", "public.t"][..], &with].concat()).await;
    assert_eq!((code, out.as_str()), (0, "2\n"), "{err}");
    let untrusted = certs.path().join("other-ca.pem");
    let (code, _, err) = cli(&[
        "ready",
        "--addr",
        &https,
        "--ca-file",
        untrusted.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("TLS with localhost"), "{err}");
    engine.stop().await.unwrap();

    // A key that does not match the certificate: refused before anything serves.
    let config =
        larch::engine::config::EngineConfig::parse("engine.yaml", &yaml(dir.path())).unwrap();
    s.grpc.as_mut().unwrap().tls.as_mut().unwrap().key = certs.path().join("other-ca.key");
    let err = larch::engine::start_serving(&config, &s)
        .await
        .err()
        .unwrap();
    let err = format!("{err:#}");
    assert!(
        err.contains("grpc.tls") && err.contains("does not match"),
        "{err}"
    );
}

/// `larch engine --grpc-listen ADDR` serves the API without a `grpc` in the file, and logs
/// where (`larch engine gRPC API listening`, its `addr`).
#[tokio::test]
async fn grpc_listen_serves_the_api_and_logs_its_address() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()).unwrap());
    let mut a = TestArchive::new(store, "public.t/", "public.t");
    a.snapshot("0/1", &refs(&rows(1..=5, "s"))).await;
    let config = dir.path().join("engine.yaml");
    std::fs::write(&config, yaml(dir.path())).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
        .args([
            "engine",
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&config)
        .env("LARCH_LOG", "info")
        .env("LARCH_LOG_FORMAT", "json")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let addr = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stderr).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the engine logs its gRPC address")
                .unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["fields"]["message"] == larch::engine::GRPC_LISTENING {
                break v["fields"]["addr"].as_str().unwrap().to_string();
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        addr
    })
    .await
    .unwrap();
    let count = crate::engine_support::eventually(30, "5 rows over gRPC", || {
        let addr = addr.clone();
        async move {
            let (code, out, _) = cli(&["query", "count", "public.t", "--addr", &addr]).await;
            (code == 0 && out == "5\n").then_some(())
        }
    });
    count.await;
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
