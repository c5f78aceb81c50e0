//! Request checks that run before any lookup, so a malformed request is always
//! `INVALID_ARGUMENT` (never `NOT_FOUND`) and costs the worker nothing.
//!
//! Payload checks are structural: a pickle stream must open with the PROTO opcode of
//! protocol 2-5 and end with STOP; a `jax.export` serialization is a flatbuffer whose root
//! offset and vtable must lie inside the buffer. They catch garbage and truncation cheaply;
//! whether the payload really loads is the executor's concern (`ERROR_KIND_FUNCTION_LOAD`).

use tonic::Status;

use crate::rpc::{content_hash, hex, pb, HASH_LEN};

/// Checks that `hash` is a SHA-256 digest (32 bytes).
pub fn function_hash(hash: &[u8]) -> Result<[u8; HASH_LEN], Status> {
    hash.try_into().map_err(|_| {
        let shown = if hash.len() <= 64 {
            format!(" (0x{})", hex(hash))
        } else {
            String::new()
        };
        Status::invalid_argument(format!(
            "function_hash is {} bytes{shown}; expected the 32-byte SHA-256 digest of the \
             function payload",
            hash.len()
        ))
    })
}

/// Checks the declared kind of a function payload.
pub fn function_kind(kind: i32) -> Result<pb::FunctionKind, Status> {
    match pb::FunctionKind::try_from(kind) {
        Ok(pb::FunctionKind::Unspecified) | Err(_) => Err(Status::invalid_argument(format!(
            "function kind {kind} is not supported; expected FUNCTION_KIND_CLOUDPICKLE (1) or \
             FUNCTION_KIND_JAX_EXPORT (2)"
        ))),
        Ok(kind) => Ok(kind),
    }
}

/// Structural check of a pickle stream; `what` names it in the error.
pub fn pickle_stream(data: &[u8], what: &str) -> Result<(), Status> {
    const PROTO: u8 = 0x80;
    const STOP: u8 = b'.';
    let opening_ok = data.len() >= 3 && data[0] == PROTO && (2..=5).contains(&data[1]);
    if opening_ok && data.last() == Some(&STOP) {
        return Ok(());
    }
    let head = hex(&data[..data.len().min(8)]);
    Err(Status::invalid_argument(format!(
        "{what} is not a pickle stream ({} bytes starting 0x{head}); expected pickle protocol \
         2-5 output (opening 0x80 0x02-0x05, ending with STOP '.')",
        data.len()
    )))
}

/// Structural check of a `jax.export` serialization (a flatbuffer).
pub fn jax_export(data: &[u8]) -> Result<(), Status> {
    let read_u32 = |at: usize| -> Option<usize> {
        let bytes: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_le_bytes(bytes) as usize)
    };
    let ok = (|| {
        let root = read_u32(0)?;
        let soffset = i64::from(i32::from_le_bytes(
            data.get(root..root + 4)?.try_into().ok()?,
        ));
        let vtable = i64::try_from(root).ok()? - soffset;
        let vtable = usize::try_from(vtable).ok()?;
        let vtable_len = data.get(vtable..vtable + 2)?;
        (root >= 4 && u16::from_le_bytes([vtable_len[0], vtable_len[1]]) >= 4).then_some(())
    })();
    ok.ok_or_else(|| {
        Status::invalid_argument(format!(
            "function payload ({} bytes) is not a serialized jax.export.Exported; expected the \
             bytes of Exported.serialize()",
            data.len()
        ))
    })
}

/// Checks a payload against its kind and its hash.
pub fn function_payload(
    kind: pb::FunctionKind,
    payload: &[u8],
    hash: &[u8; HASH_LEN],
) -> Result<(), Status> {
    match kind {
        pb::FunctionKind::JaxExport => jax_export(payload)?,
        _ => pickle_stream(payload, "function payload")?,
    }
    let actual = content_hash(payload);
    if &actual != hash {
        return Err(Status::invalid_argument(format!(
            "function_hash 0x{} does not match the payload, whose SHA-256 is 0x{}; hash the \
             exact payload bytes that are sent",
            hex(hash),
            hex(&actual)
        )));
    }
    Ok(())
}

/// Checks an optional argument value: absent, or a pickle stream with its buffers.
pub fn value(value: Option<&pb::Value>, what: &str) -> Result<(), Status> {
    match value {
        None => Ok(()),
        Some(v) if v.pickle.is_empty() && v.buffers.is_empty() => Ok(()),
        Some(v) if v.pickle.is_empty() => Err(Status::invalid_argument(format!(
            "{what} has {} out-of-band buffers but no pickle stream; expected the pickle \
             that refers to them",
            v.buffers.len()
        ))),
        Some(v) => pickle_stream(&v.pickle, what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_must_be_32_bytes() {
        assert!(function_hash(&[7; 32]).is_ok());
        for len in [0, 1, 31, 33, 64, 100] {
            let e = function_hash(&vec![1; len]).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(
                e.message().contains(&format!("is {len} bytes")),
                "{}",
                e.message()
            );
        }
    }

    #[test]
    fn kinds_outside_the_enum_are_refused() {
        assert_eq!(function_kind(1).unwrap(), pb::FunctionKind::Cloudpickle);
        assert_eq!(function_kind(2).unwrap(), pb::FunctionKind::JaxExport);
        assert!(function_kind(0).is_err());
        assert!(function_kind(99).unwrap_err().message().contains("99"));
    }

    #[test]
    fn pickle_checks_accept_pickles_and_refuse_garbage() {
        assert!(pickle_stream(b"\x80\x05K\x01.", "x").is_ok());
        for bad in [
            &b""[..],
            b"garbage",
            b"\x80\x05K\x01",
            b"\x80\x09K\x01.",
            b"(.",
        ] {
            let e = pickle_stream(bad, "args").unwrap_err();
            assert!(
                e.message().starts_with("args is not a pickle"),
                "{}",
                e.message()
            );
        }
    }

    #[test]
    fn payload_hash_must_match() {
        let payload = b"\x80\x05K\x01.";
        let hash = content_hash(payload);
        assert!(function_payload(pb::FunctionKind::Cloudpickle, payload, &hash).is_ok());
        let e = function_payload(pb::FunctionKind::Cloudpickle, payload, &[0; 32]).unwrap_err();
        assert!(e.message().contains("does not match"), "{}", e.message());
    }

    #[test]
    fn jax_export_checks_the_flatbuffer_frame() {
        // root table at 8, whose vtable (soffset 4) sits at 4 and declares 4 bytes.
        let minimal = [8, 0, 0, 0, 4, 0, 4, 0, 4, 0, 0, 0];
        assert!(jax_export(&minimal).is_ok());
        for bad in [
            &b""[..],
            b"\xff\xff\xff\xff",
            b"\x80\x05K\x01.",
            &[8, 0, 0, 0, 0, 0, 0],
        ] {
            assert!(jax_export(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_may_be_absent_but_not_buffers_alone() {
        assert!(value(None, "args").is_ok());
        let empty = pb::Value::default();
        assert!(value(Some(&empty), "args").is_ok());
        let orphan = pb::Value {
            pickle: bytes::Bytes::new(),
            buffers: vec![bytes::Bytes::from_static(b"x")],
        };
        assert!(value(Some(&orphan), "args").is_err());
    }
}
