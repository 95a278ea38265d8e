//! `larch engine status|ready|tables|query …`: laredo's CLI verbs against an engine's gRPC API,
//! spoken as laredo's CLI does (the Connect protocol, proto bodies, over HTTP/1.1). Exit codes
//! are laredo's: 0, or 1 on any error; `ready` exits 1 when not ready.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use prost::Message;
use serde::Serialize;

use larch_laredo_api::connect as wire;
use larch_laredo_api::pbjson_types::{Struct, Value, value::Kind};
use larch_laredo_api::v1 as pb;

const QUERY: &str = "laredo.v1.LaredoQueryService";
const OAM: &str = "laredo.v1.LaredoOAMService";

#[derive(Subcommand, Debug)]
pub enum EngineClient {
    /// The engine's state, sources and pipelines (laredo's `status`).
    Status {
        /// Only this table's pipelines (schema.table).
        #[arg(long)]
        table: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Prints ready and exits 0, or not ready with the reasons and exits 1 (laredo's `ready`).
    Ready {
        /// Only this source's readiness.
        #[arg(long)]
        source: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The tables the engine serves, with their source and target.
    Tables {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Reads a memory table: count, get, list, lookup.
    #[command(subcommand)]
    Query(QueryCommand),
    /// Pauses a source (the engine needs --allow-control and the token).
    Pause {
        #[arg(long)]
        source: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resumes a paused source.
    Resume {
        #[arg(long)]
        source: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// laredo's re-baseline on demand: larch answers unimplemented with its way (exit 1).
    Reload {
        #[arg(long)]
        source: String,
        table: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum QueryCommand {
    /// The number of rows of SCHEMA.TABLE.
    Count {
        table: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// One row by its (single, integer) primary key.
    Get {
        #[arg(long)]
        pk: i64,
        table: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The first rows in table order.
    List {
        #[arg(long, default_value_t = 100)]
        limit: i32,
        table: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Rows whose lookup fields equal VALUES (with --index, every match of that index).
    Lookup {
        /// An index field (larch names an index by its fields, comma-separated).
        #[arg(long)]
        index: Option<String>,
        table: String,
        #[arg(required = true)]
        values: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// The engine's gRPC API: HOST:PORT or http://HOST:PORT, as laredo's CLI takes it, or
    /// https://HOST:PORT for a TLS listener (grpc.tls).
    #[arg(
        long,
        alias = "address",
        env = "LAREDO_ADDRESS",
        default_value = "localhost:4001"
    )]
    pub addr: String,
    /// PEM CA bundle to trust for an https:// address (default: the system's roots).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// File holding the API bearer token (else $LARCH_ENGINE_TOKEN, if set).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// text, or json (proto3's JSON of the answer).
    #[arg(long, short = 'o', default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

/// A Connect client of one engine.
struct Client {
    authority: String,
    /// For an https:// address: the connector and the name the certificate must carry.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    token: Option<String>,
}

/// A TLS client trusting `ca_file`, else the system's roots; offers HTTP/1.1.
fn tls_connector(ca_file: Option<&PathBuf>) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let roots = match ca_file {
        Some(f) => larch_core::tls::read_ca_bundle("--ca-file", f)?.roots,
        None => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            roots
        }
    };
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config,
    )))
}

impl Client {
    fn new(args: &ClientArgs) -> anyhow::Result<Client> {
        let addr = args.addr.trim_end_matches('/');
        let (authority, tls) = match addr.strip_prefix("https://") {
            Some(a) => {
                let host = a.rsplit_once(':').map_or(a, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| anyhow::anyhow!("--addr {addr}: {e}"))?;
                (
                    a.to_string(),
                    Some((tls_connector(args.ca_file.as_ref())?, name)),
                )
            }
            None => (
                addr.strip_prefix("http://").unwrap_or(addr).to_string(),
                None,
            ),
        };
        let token = match &args.token_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", f.display()))?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var(crate::engine::access::TOKEN_ENV).ok(),
        };
        Ok(Client {
            authority,
            tls,
            token,
        })
    }

    /// One unary call with a proto body; an error answer becomes `code: message`.
    async fn call<Req: Message, Resp: Message + Default>(
        &self,
        service: &str,
        method: &str,
        req: &Req,
    ) -> anyhow::Result<Resp> {
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", self.authority))?;
        let mut sender = match &self.tls {
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| anyhow::anyhow!("TLS with {}: {e}", self.authority))?;
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
                tokio::spawn(conn);
                sender
            }
            None => {
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
                tokio::spawn(conn);
                sender
            }
        };
        let mut request = http::Request::post(format!("/{service}/{method}"))
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONTENT_TYPE, wire::UNARY_PROTO)
            .header("connect-protocol-version", "1");
        if let Some(t) = &self.token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let body = Full::new(Bytes::from(req.encode_to_vec()));
        let response = sender.send_request(request.body(body)?).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        if status.is_success() {
            return Ok(Resp::decode(bytes)?);
        }
        let error: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        anyhow::bail!(
            "{}: {}",
            error["code"].as_str().unwrap_or(status.as_str()),
            error["message"].as_str().unwrap_or("")
        )
    }
}

/// `schema.table`, as laredo's CLI takes it.
fn split_table(t: &str) -> anyhow::Result<(String, String)> {
    match t.split_once('.') {
        Some((s, n)) if !s.is_empty() && !n.is_empty() => Ok((s.into(), n.into())),
        _ => anyhow::bail!("table must be in schema.table format (got {t:?})"),
    }
}

fn print_json<T: Serialize>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("an answer always serializes")
    );
}

/// A row as plain JSON (its `Struct`'s proto3 JSON is the object itself).
fn print_row(row: &Struct) {
    print_json(row);
}

/// Runs a client verb; errors are printed and exit 1, as laredo's CLI does.
pub async fn run(command: EngineClient) -> anyhow::Result<i32> {
    match dispatch(command).await {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            Ok(1)
        }
    }
}

async fn dispatch(command: EngineClient) -> anyhow::Result<i32> {
    match command {
        EngineClient::Status { table, client } => status(table, &client).await,
        EngineClient::Ready { source, client } => {
            let c = Client::new(&client)?;
            let req = pb::CheckReadyRequest {
                source: source.unwrap_or_default(),
                ..Default::default()
            };
            let r: pb::CheckReadyResponse = c.call(OAM, "CheckReady", &req).await?;
            if r.ready {
                println!("ready");
                return Ok(0);
            }
            println!("not ready");
            for reason in &r.not_ready_reasons {
                println!("  - {reason}");
            }
            Ok(1)
        }
        EngineClient::Tables { client } => tables(&client).await,
        EngineClient::Query(q) => query(q).await,
        EngineClient::Pause { source, client } => {
            let req = pb::PauseSyncRequest { source_id: source };
            let _: pb::PauseSyncResponse =
                Client::new(&client)?.call(OAM, "PauseSync", &req).await?;
            println!("paused");
            Ok(0)
        }
        EngineClient::Resume { source, client } => {
            let req = pb::ResumeSyncRequest { source_id: source };
            let _: pb::ResumeSyncResponse =
                Client::new(&client)?.call(OAM, "ResumeSync", &req).await?;
            println!("resumed");
            Ok(0)
        }
        EngineClient::Reload {
            source,
            table,
            client,
        } => {
            let (schema, table) = split_table(&table)?;
            let req = pb::ReloadTableRequest {
                source_id: source,
                schema,
                table,
            };
            let r: pb::ReloadTableResponse =
                Client::new(&client)?.call(OAM, "ReloadTable", &req).await?;
            if r.accepted {
                println!("{}", r.message);
                return Ok(0);
            }
            eprintln!("reload failed: {}", r.message);
            Ok(1)
        }
    }
}

fn print_pipelines(pipelines: &[pb::PipelineStatus]) {
    println!("  {:<50}  {:<12}  ROWS", "PIPELINE", "STATE");
    for p in pipelines {
        let state = pb::PipelineState::try_from(p.state)
            .map_or_else(|_| p.state.to_string(), |s| s.as_str_name().to_string());
        println!("  {:<50}  {:<12}  {}", p.pipeline_id, state, p.row_count);
    }
}

async fn status(table: Option<String>, args: &ClientArgs) -> anyhow::Result<i32> {
    let c = Client::new(args)?;
    if let Some(t) = table {
        let (schema, table) = split_table(&t)?;
        let req = pb::GetTableStatusRequest { schema, table };
        let r: pb::GetTableStatusResponse = c.call(OAM, "GetTableStatus", &req).await?;
        if args.output == "json" {
            print_json(&r);
        } else {
            print_pipelines(&r.pipelines);
        }
        return Ok(0);
    }
    let r: pb::GetStatusResponse = c.call(OAM, "GetStatus", &pb::GetStatusRequest {}).await?;
    if args.output == "json" {
        print_json(&r);
        return Ok(0);
    }
    let state = pb::ServiceState::try_from(r.state)
        .map_or_else(|_| r.state.to_string(), |s| s.as_str_name().to_string());
    println!("Service State: {state}\n");
    if !r.sources.is_empty() {
        println!("SOURCES:");
        for s in &r.sources {
            println!("  {}", s.source_id);
        }
        println!();
    }
    if !r.pipelines.is_empty() {
        println!("PIPELINES:");
        print_pipelines(&r.pipelines);
    }
    Ok(0)
}

async fn tables(args: &ClientArgs) -> anyhow::Result<i32> {
    let c = Client::new(args)?;
    let r: pb::ListTablesResponse = c.call(OAM, "ListTables", &pb::ListTablesRequest {}).await?;
    if args.output == "json" {
        print_json(&r.tables);
    } else if r.tables.is_empty() {
        println!("no tables");
    } else {
        println!("{:<30}  {:<10}  TARGET", "TABLE", "SOURCE");
        for t in &r.tables {
            let name = format!("{}.{}", t.schema, t.table);
            println!("{name:<30}  {:<10}  {}", t.source_id, t.target_type);
        }
    }
    Ok(0)
}

async fn query(q: QueryCommand) -> anyhow::Result<i32> {
    match q {
        QueryCommand::Count { table, client } => {
            let (schema, table) = split_table(&table)?;
            let req = pb::CountRowsRequest { schema, table };
            let r: pb::CountRowsResponse =
                Client::new(&client)?.call(QUERY, "CountRows", &req).await?;
            println!("{}", r.count);
            Ok(0)
        }
        QueryCommand::Get { pk, table, client } => {
            let (schema, table) = split_table(&table)?;
            let req = pb::GetRowRequest {
                schema,
                table,
                primary_key: pk,
            };
            let r: pb::GetRowResponse = Client::new(&client)?.call(QUERY, "GetRow", &req).await?;
            found(r.found.then_some(r.row).flatten())
        }
        QueryCommand::List {
            limit,
            table,
            client,
        } => list(limit, &table, &client).await,
        QueryCommand::Lookup {
            index,
            table,
            values,
            client,
        } => lookup(index, &table, values, &client).await,
    }
}

/// Prints a found row (exit 0), or `not found` on stderr (exit 1).
fn found(row: Option<Struct>) -> anyhow::Result<i32> {
    match row {
        Some(r) => {
            print_row(&r);
            Ok(0)
        }
        None => {
            eprintln!("not found");
            Ok(1)
        }
    }
}

async fn list(limit: i32, table: &str, args: &ClientArgs) -> anyhow::Result<i32> {
    let (schema, table) = split_table(table)?;
    let req = pb::ListRowsRequest {
        schema,
        table,
        page_size: limit,
        page_token: String::new(),
    };
    let r: pb::ListRowsResponse = Client::new(args)?.call(QUERY, "ListRows", &req).await?;
    if args.output == "json" {
        print_json(&r.rows);
        return Ok(0);
    }
    println!("{} rows (total: {})", r.rows.len(), r.total_count);
    r.rows.iter().for_each(print_row);
    Ok(0)
}

async fn lookup(
    index: Option<String>,
    table: &str,
    values: Vec<String>,
    args: &ClientArgs,
) -> anyhow::Result<i32> {
    let (schema, table) = split_table(table)?;
    // Strings, as laredo's CLI sends them (the engine compares by canonical text).
    let key_values: Vec<Value> = values
        .into_iter()
        .map(|v| Value {
            kind: Some(Kind::StringValue(v)),
        })
        .collect();
    let c = Client::new(args)?;
    match index {
        Some(index_name) => {
            let req = pb::LookupAllRequest {
                schema,
                table,
                index_name,
                key_values,
            };
            let r: pb::LookupAllResponse = c.call(QUERY, "LookupAll", &req).await?;
            if args.output == "json" {
                print_json(&r.rows);
            } else {
                println!("{} rows", r.rows.len());
                r.rows.iter().for_each(print_row);
            }
            Ok(0)
        }
        None => {
            let req = pb::LookupRequest {
                schema,
                table,
                index_name: String::new(),
                key_values,
            };
            let r: pb::LookupResponse = c.call(QUERY, "Lookup", &req).await?;
            found(r.found.then_some(r.row).flatten())
        }
    }
}
