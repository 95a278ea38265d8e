//! The Connect protocol's framing, shared by larch's server and client: error code names and
//! their HTTP statuses, and the envelopes of streaming messages (a flags byte, a 4-byte
//! big-endian length, the message).

use tonic::Code;

/// Content types of unary requests and of streams, by codec.
pub const UNARY_PROTO: &str = "application/proto";
pub const UNARY_JSON: &str = "application/json";
pub const STREAM_PROTO: &str = "application/connect+proto";
pub const STREAM_JSON: &str = "application/connect+json";

/// The envelope flag of a compressed message.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// The envelope flag of the end-of-stream message (JSON, with an optional `error`).
pub const FLAG_END_STREAM: u8 = 0x02;

/// The Connect name of a gRPC status code.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "canceled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// The code of a Connect name (`unknown` for a name that is none).
pub fn code_of(name: &str) -> Code {
    const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];
    ALL.into_iter()
        .find(|c| code_name(*c) == name)
        .unwrap_or(Code::Unknown)
}

/// The HTTP status of a unary error with `code` (the Connect protocol's table).
pub fn http_status(code: Code) -> u16 {
    match code {
        Code::Ok => 200,
        Code::Cancelled => 499,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::DeadlineExceeded => 504,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::PermissionDenied => 403,
        Code::ResourceExhausted => 429,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::Unauthenticated => 401,
        Code::Unknown | Code::Internal | Code::DataLoss => 500,
    }
}

/// `message` in an envelope with `flags`.
pub fn envelope(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The first envelope of `buf`: (flags, message, the rest), or `None` while incomplete.
pub fn split_envelope(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let head = buf.get(..5)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let message = buf.get(5..5 + len)?;
    Some((head[0], message, &buf[5 + len..]))
}

/// The JSON of an error (`{"code": …, "message": …}`), the body of a unary error and the
/// `error` of an end-of-stream message.
pub fn error_json(code: Code, message: &str) -> serde_json::Value {
    serde_json::json!({"code": code_name(code), "message": message})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_envelopes_round_trip() {
        for n in 0..17 {
            let c = Code::from(n);
            assert_eq!(code_of(code_name(c)), c);
        }
        assert_eq!(http_status(Code::Unauthenticated), 401);
        assert_eq!(http_status(Code::Unimplemented), 501);
        let e = envelope(FLAG_END_STREAM, b"{}");
        assert_eq!(e, [2, 0, 0, 0, 2, b'{', b'}']);
        let mut two = e.clone();
        two.extend(envelope(0, b"x"));
        let (flags, m, rest) = split_envelope(&two).unwrap();
        assert_eq!((flags, m), (FLAG_END_STREAM, &b"{}"[..]));
        assert_eq!(split_envelope(rest), Some((0, &b"x"[..], &b""[..])));
        assert_eq!(split_envelope(&e[..6]), None);
    }
}
